"""Bootstrap: a worker with nothing but the package and the token gets the model from the coordinator.

A worker started with `echo2 worker --bootstrap` asks for the base (`GetBase`). The coordinator answers
with the model's non-weight files (`BaseFiles`: config, tokenizer, generation config; their SHA-256 in
the sealed header, their bytes in the payload), and the weights follow as an ordinary snapshot over the
run's delivery (chain broadcast or direct push): the current one, or before the first publication the
learner's model folder cast to the snapshot dtype as version 0. The worker writes both into a cache
folder named by their content and builds its backend from it.

What comes from the wire is written only under that folder, only under a name of `BASE_FILES` (which
holds no '/', '..' or absolute name), at most `MAX_FILE_BYTES` a file, and only when its SHA-256 is the
one the coordinator named; anything else is refused, counted and logged, never written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from echo2sdk.errors import ConfigError, ProtocolError
from echo2sdk.runtime.protocol.messages import MAX_BASE_BYTES, BaseFile, BaseFiles, shown
from echo2sdk.runtime.protocol.wire import digest

__all__ = ["BASE_FILES", "MAX_FILE_BYTES", "WEIGHTS_FILE", "ModelFolder", "write_base"]

log = logging.getLogger("echo2sdk.bootstrap")

#: The only names a base file may have: what transformers, vLLM and SGLang read besides the weights.
BASE_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
    "chat_template.jinja", "chat_template.json",
})
MAX_FILE_BYTES = 64 << 20  # one base file (the largest tokenizer.json files are a few tens of MiB)
WEIGHTS_FILE = "model.safetensors"  # where the worker writes the snapshot it bootstraps from


class ModelFolder:
    """The coordinator's side: the learner's model folder, served to workers that ask for the base."""

    def __init__(self, folder: str | os.PathLike[str], dtype: str = "bfloat16"):
        self.folder, self.dtype = Path(folder), dtype

    def files(self) -> list[tuple[str, bytes]]:
        """(name, bytes) of the folder's files that are in BASE_FILES, sorted by name; ConfigError when
        one is larger than MAX_FILE_BYTES, or config.json or the safetensors weights are missing."""
        out = []
        for name in sorted(BASE_FILES):
            path = self.folder / name
            if not path.is_file():
                continue
            if (size := path.stat().st_size) > MAX_FILE_BYTES:
                raise ConfigError(f"model file {str(path)!r} is {size} bytes, over the {MAX_FILE_BYTES} a worker takes")
            out.append((name, path.read_bytes()))
        if not any(name == "config.json" for name, _ in out) or not any(self.folder.glob("*.safetensors")):
            raise ConfigError(f"model folder {str(self.folder)!r} lacks config.json or safetensors weights to "
                              "send to workers")
        return out

    def weights(self) -> bytes:
        """The folder's weights as a snapshot (every *.safetensors file, cast to `dtype`): the version-0
        policy of a fresh run, read from disk and not from the learner, which may be updating it."""
        import safetensors.torch

        from echo2sdk.core.snapshot import serialize_state, snapshot_state

        state: dict = {}
        for path in sorted(self.folder.glob("*.safetensors")):
            state.update(safetensors.torch.load_file(path))
        if not state:
            raise ConfigError(f"model folder {str(self.folder)!r} has no safetensors weights to send to workers")
        return serialize_state(snapshot_state(state, self.dtype))

    def message(self) -> tuple[BaseFiles, bytes]:
        """The BaseFiles message and its payload (or the reason none can be served)."""
        try:
            files = self.files()
        except (ConfigError, OSError) as e:
            log.warning("cannot serve the base to a worker: %s", e)
            return BaseFiles(reason=str(e)[:1000]), b""
        header = [BaseFile(name=n, nbytes=len(b), sha256=digest(b)) for n, b in files]
        return BaseFiles(files=header), b"".join(b for _, b in files)


def _refusal(f: BaseFile, data: bytes, seen: set[str]) -> str | None:
    """Why a received file must not be written, or None."""
    if f.name not in BASE_FILES:
        return "name not allowed"
    if f.name in seen:
        return "duplicate name"
    if f.nbytes > MAX_FILE_BYTES:
        return "too large"
    if digest(data) != f.sha256:
        return "sha256 mismatch"
    return None


def write_base(
    root: str | os.PathLike[str], msg: BaseFiles, payload: bytes, weights: bytes | memoryview
) -> tuple[Path, Counter[str]]:
    """Write the accepted files of `msg` and the snapshot `weights` (as model.safetensors) into a folder
    under `root`/bootstrap named by their content; (that folder, refused files by reason). Refused files
    are not written; a payload whose length is not the files' total, or no accepted config.json, is an error."""
    if msg.reason or not msg.files:
        raise ConfigError(f"the coordinator serves no base model: {shown(msg.reason, 300)}")
    if len(payload) != sum(f.nbytes for f in msg.files) or len(payload) > MAX_BASE_BYTES:
        raise ProtocolError(f"base files payload of {len(payload)} bytes; the header announces "
                            f"{sum(f.nbytes for f in msg.files)} (at most {MAX_BASE_BYTES})")
    accepted: list[tuple[str, bytes]] = []
    refused: Counter[str] = Counter()
    seen: set[str] = set()
    at = 0
    for f in msg.files:
        data, at = payload[at : at + f.nbytes], at + f.nbytes
        if (why := _refusal(f, data, seen)) is not None:
            refused[why] += 1
            log.warning("refusing base file %s (%d bytes): %s", shown(f.name), f.nbytes, why)
            continue
        seen.add(f.name)
        accepted.append((f.name, data))
    if "config.json" not in seen:
        raise ConfigError(f"the coordinator sent no acceptable config.json (refused: {dict(refused)})")
    key = hashlib.sha256()
    for name, data in accepted:
        key.update(f"{name}:{digest(data)}\n".encode())
    key.update(f"{WEIGHTS_FILE}:{digest(weights)}\n".encode())
    folder = _store(Path(root).expanduser() / "bootstrap", key.hexdigest()[:32], [*accepted, (WEIGHTS_FILE, weights)])
    return folder, refused


def _store(parent: Path, name: str, files: list[tuple[str, bytes | memoryview]]) -> Path:
    """`parent/name` holding `files`: written into a fresh temporary folder and renamed into place (a
    folder of the same content already there, written by another worker, is used as it is)."""
    final = parent / name
    if (final / WEIGHTS_FILE).is_file():
        return final
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the bootstrap cache {str(parent)!r}: {e}; "
                          "set ECHO2_CACHE to a writable folder") from e
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent))
    try:
        for fname, data in files:
            with open(tmp / fname, "xb") as fh:  # a fresh folder: exclusive create, nothing to follow
                fh.write(data)
        try:
            os.rename(tmp, final)
        except OSError:  # another process renamed the same content into place first
            if not (final / WEIGHTS_FILE).is_file():
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
