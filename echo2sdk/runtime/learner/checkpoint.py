"""Learner checkpoints: what a run needs to continue after a crash, one folder per step.

    DIR/checkpoints/step-000120/
      config.json, model.safetensors, generation_config.json, tokenizer files
                              the policy, Hugging Face format (loadable by transformers and vLLM as it is)
      model.safetensors.index.json
                              names model.safetensors as the policy's only weight file: vLLM, SGLang and
                              echo2's snapshot layout otherwise take every *.safetensors here for weights
      optimizer.safetensors   the optimizer's tensors (AdamW moments and step), "<parameter name>/<key>"
      optimizer.json          its param_groups (lr, betas, weight decay, ...) and any non-tensor state
      rng.safetensors         torch's CPU (and CUDA) generator states
      state.json              step, version, the published-version high-water mark, tasks handed out,
                              the length of metrics.jsonl, python and numpy RNG states, format number
      secrets/                (0700; files 0600) signing.key: the Ed25519 key that signs snapshot manifests
                              (32 raw bytes); tls-cert.pem, tls-key.pem: the coordinator's certificate;
                              token: the worker token when the run drew it

No pickle anywhere: tensors are safetensors, everything else JSON or raw bytes. A checkpoint is written
into a hidden temporary folder beside its final place, flushed to disk, then renamed into place; only
complete checkpoints ever carry a `step-*` name, so a crash while saving leaves the previous one intact
(and a `.step-*.tmp-*` folder that the next save removes). The last `keep` checkpoints are kept.

The replay buffer is not saved: its records are at most S versions old and would be stale, or on the
wrong side of the version jump (see `resume_version`), after a resume; workers refill it within a step.

`DIR/published.json` is the version high-water mark: written (atomically) before every publication, so a
resumed run can publish above every version that ever left the learner - a version number never names two
different weights.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo2sdk.errors import ConfigError, Echo2Error
from echo2sdk.runtime.files import fsync_dir, write_json_atomic
from echo2sdk.weights import safetensors_header

__all__ = [
    "to_resume",
    "Checkpoint",
    "FORMAT",
    "latest",
    "load",
    "published_mark",
    "record_published",
    "resume_version",
    "rng_state",
    "run_folder",
    "save",
    "set_rng_state",
    "LastWrites",
]

log = logging.getLogger("echo2sdk.checkpoint")

FORMAT = 1
_STEP = re.compile(r"^step-(\d+)$")
SECRET_FILES = ("signing.key", "tls-cert.pem", "tls-key.pem", "token")


# -- the run's last writes -------------------------------------------------------------------------
class LastWrites:
    """The run's last writes (the last checkpoint, the final policy DIR/checkpoint). One that fails (a full disk, a
    quota: an OSError, or safetensors' SafetensorError, which is not one) is logged and kept in `errors` instead of
    ending the run before its summary: the metrics, the summary (summary.json's `save_errors`) and every earlier
    checkpoint stay, and `echo2 run` exits 1. The final policy's partial folder is removed (a checkpoint's is by
    `save`). Collective errors are not caught: under torchrun only rank 0 writes, after the collectives every rank
    took part in."""

    FINAL_POLICY = "the final policy"

    def __init__(self, out: Path):
        self.out = out
        self.errors: dict[str, str] = {}  # what could not be written -> why

    def attempt(self, what: str, write: Callable[[], object]) -> None:
        from safetensors import SafetensorError  # the learner's writes need it: there by now

        try:
            write()
        except (OSError, SafetensorError) as e:
            log.error("%s could not be written: %s", what, e)
            self.errors[what] = str(e)
            if what == self.FINAL_POLICY:
                shutil.rmtree(self.out / "checkpoint", ignore_errors=True)

    def final_policy(self) -> str | None:
        """DIR/checkpoint, or None where its write failed."""
        return None if self.FINAL_POLICY in self.errors else str(self.out / "checkpoint")

    def listed(self) -> list[str]:
        """summary.json's save_errors: "what: why" for each failed write, in order."""
        return [f"{what}: {why}" for what, why in self.errors.items()]


def record_published(run_dir: Path, version: int) -> None:
    """Raise the high-water mark to `version`: call before the version leaves the learner."""
    write_json_atomic(run_dir / "published.json", {"version": version})


def published_mark(run_dir: Path) -> int:
    """The highest version ever published from `run_dir` (0: none)."""
    path = run_dir / "published.json"
    if not path.exists():
        return 0
    try:
        return int(json.loads(path.read_text())["version"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a version high-water mark ({e}); it must read {{\"version\": N}}") from None


def resume_version(checkpoint_version: int, published: int) -> int:
    """The version a resumed learner takes: its checkpoint's own when nothing newer was ever published (that
    number names these very weights, or nothing), else one above everything published before the crash."""
    return checkpoint_version if published <= checkpoint_version else published + 1


# -- RNG ---------------------------------------------------------------------------------------------
def rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON-able python and numpy states, torch generator states as tensors)."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors = {"torch.cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"torch.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}, tensors


def set_rng_state(plain: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch.cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# -- the optimizer state as safetensors + JSON -------------------------------------------------------
def _split_optimizer(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """{"state": {param: {key: value}}, "param_groups": [...]} -> (tensors, JSON part)."""
    import torch

    tensors, scalars = {}, {}
    for param, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{param}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(param, {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: Mapping[str, Any], plain: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {p: dict(v) for p, v in plain["scalars"].items()}
    for name, value in tensors.items():
        param, _, key = name.rpartition("/")
        state.setdefault(param, {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in plain["param_groups"]]
    return {"state": state, "param_groups": groups}


# -- save ----------------------------------------------------------------------------------------------
def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _fsync_tree(folder: Path) -> None:
    for item in folder.rglob("*"):
        if item.is_file():
            with open(item, "rb") as fh:
                os.fsync(fh.fileno())
    for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        fsync_dir(sub)


def _index_weights(folder: Path) -> None:
    """Write model.safetensors.index.json for a single-file model.safetensors (a sharded save_pretrained
    writes its own): its tensor names, each in model.safetensors."""
    model, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if index.exists() or not model.is_file():
        return
    header, n = safetensors_header(model)
    names = sorted(k for k in header if k != "__metadata__")
    index.write_text(json.dumps({"metadata": {"total_size": model.stat().st_size - 8 - n},
                                 "weight_map": {name: model.name for name in names}}, indent=1))


def _write(tmp: Path, write_model: Callable[[Path], None], optimizer: Mapping[str, Any], state: Mapping[str, Any],
           secrets: Mapping[str, bytes]) -> None:
    from safetensors.torch import save_file

    write_model(tmp)
    _index_weights(tmp)
    opt_tensors, opt_plain = _split_optimizer(optimizer)
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"), metadata={"format": "pt"})
    (tmp / "optimizer.json").write_text(json.dumps(opt_plain))
    plain_rng, tensor_rng = rng_state()
    save_file({k: v.contiguous() for k, v in tensor_rng.items()}, str(tmp / "rng.safetensors"))
    if secrets:
        (tmp / "secrets").mkdir(mode=0o700)
        (tmp / "secrets").chmod(0o700)
        for name, data in secrets.items():
            if name not in SECRET_FILES:
                raise ValueError(f"unknown checkpoint secret {name!r} (known: {', '.join(SECRET_FILES)})")
            _write_secret(tmp / "secrets" / name, data)
    (tmp / "state.json").write_text(json.dumps({**state, "rng": plain_rng, "format": FORMAT, "saved_at": time.time()}))


def save(
    root: Path,
    step: int,
    *,
    write_model: Callable[[Path], None],
    optimizer: Mapping[str, Any],
    state: Mapping[str, Any],
    secrets: Mapping[str, bytes] | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint `root/step-NNNNNN` atomically and keep the last `keep`; returns its folder.

    `write_model(folder)` writes the policy (save_pretrained); `optimizer` is the learner's full optimizer
    state keyed by parameter name; `state` the trainer's counters (JSON). An existing checkpoint of the same
    step is the same point of the same run (a resume stopped before its first update) and is kept as it is."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    if final.exists():
        return final
    for stale in root.glob(".step-*.tmp-*"):  # a save cut short by a crash
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        _write(tmp, write_model, optimizer, {**state, "step": step}, secrets or {})
        _fsync_tree(tmp)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in _steps(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


# -- load ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder and its state.json (step, version, published, tasks_issued, metrics_bytes, ...)."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def version(self) -> int:
        return int(self.state["version"])

    def optimizer(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        plain = json.loads((self.path / "optimizer.json").read_text())
        return _join_optimizer(load_file(str(self.path / "optimizer.safetensors")), plain)

    def restore_rng(self) -> None:
        from safetensors.torch import load_file

        set_rng_state(self.state["rng"], load_file(str(self.path / "rng.safetensors")))

    def secrets(self) -> dict[str, bytes]:
        folder = self.path / "secrets"
        return {name: (folder / name).read_bytes() for name in SECRET_FILES if (folder / name).is_file()}


def _steps(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / "state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint under `root` (DIR/checkpoints), or None."""
    steps = _steps(root)
    return _read(steps[-1]) if steps else None


def _read(folder: Path) -> Checkpoint:
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"checkpoint {str(folder)!r} has no readable state.json ({e})") from None
    if state.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {str(folder)!r} has format {state.get('format')!r}; this echo2sdk reads {FORMAT}")
    return Checkpoint(folder, state)


def run_folder(path: str | os.PathLike[str]) -> Path:
    """The run folder of `path`: a run folder itself, or the one a checkpoint folder lives in."""
    p = Path(path).expanduser()
    return p.parent.parent if (p / "state.json").is_file() else p


def load(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint `path` names: a checkpoint folder, or a run folder (its newest checkpoint)."""
    p = Path(path).expanduser()
    if (p / "state.json").is_file():
        return _read(p)
    found = latest(p / "checkpoints")
    if found is None:
        raise ConfigError(f"--resume {str(p)!r}: no checkpoint there (looked for {str(p / 'checkpoints')}/step-*/state.json)")
    return found


def to_resume(out: Path, resume: str | os.PathLike[str] | None, leader: bool = True) -> Checkpoint | None:
    """The checkpoint a run in `out` starts from: the one `resume` names; None for a fresh run. A fresh run
    refuses a folder whose newest checkpoint is of an unfinished run (resume it, or delete it), and clears a
    finished run's checkpoints and version mark. Only the `leader` rank looks at `out`."""
    root = out / "checkpoints"
    if resume is not None:
        return load(resume)
    last = latest(root) if leader else None
    if last is not None and last.step < last.state.get("steps_planned", 0):
        raise Echo2Error(
            f"{out} holds an unfinished run (checkpoint at step {last.step} of {last.state['steps_planned']}): "
            f"continue it with  echo2 run CONFIG --resume {out}  or delete {root} to start over"
        )
    if last is not None:
        logging.getLogger("echo2sdk.learner").info("a fresh run in %s: removing the finished run's checkpoints", out)
        shutil.rmtree(root)
        (out / "published.json").unlink(missing_ok=True)
    return None
