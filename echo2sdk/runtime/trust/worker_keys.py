"""Per-worker credentials, and revoking them (docs/security.md, "Per-worker credentials").

A credential is the text  NAME:KEY  with KEY the hex of K_worker(NAME) = HMAC(K_token, "echo2-worker" | NAME)
(`session.worker_key`). `echo2 keys worker NAME` prints one; `echo2 worker --credential-file PATH` (or
$ECHO2_CREDENTIAL) logs in with it, under worker id NAME, without ever learning the run token. The
coordinator derives the same key from the name the hello claims (one HMAC, no KDF per hello) and runs the
usual mutual proof with it in place of the token: a credential for A does not log in as B, and whoever
holds it can derive nothing of the token or of another worker's key.

Revoking NAME (`run.revoked_workers`, or a line of `run.revoked_file`, re-read when it changes) refuses its
hellos and drops its connection. A revoked worker keeps what it was handed: the snapshots and the relay
keys (`session.relay_key`, per version) of the newest published version and of the next one.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.credentials import read_secret_file

__all__ = ["ENV", "Credential", "issue", "check_name", "parse_credential", "given_credential", "Revocations"]

log = logging.getLogger("echo2sdk.coordinator")

ENV = "ECHO2_CREDENTIAL"  # the environment variable a worker reads its credential from (NAME:KEY)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY = re.compile(r"[0-9a-f]{64}")
MAX_FILE = 4096  # bytes read from a credential file
MAX_REVOKED_FILE = 1 << 20  # bytes read from a revocation file


@dataclass(frozen=True)
class Credential:
    name: str
    key: bytes = field(repr=False)

    def __str__(self) -> str:
        return f"{self.name}:{self.key.hex()}"


def check_name(name: str, source: str = "worker name") -> str:
    """`name` when it is a valid worker name (1-64 of letters, digits, '.', '_', '-'; not starting with a
    punctuation mark), else a ConfigError naming `source` and the value."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{source} {name!r}: a worker name is 1-64 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return name


def issue(token: str, name: str) -> Credential:
    """Worker `name`'s credential under the run `token` (scrypt once for K_token, then one HMAC)."""
    return Credential(check_name(name), session.worker_key(session.token_key(token), name))


def parse_credential(text: str, source: str) -> Credential:
    """The credential in `text` (NAME:KEY, surrounding whitespace stripped); ConfigError naming `source` (never
    the key) when it is not one."""
    name, sep, key = text.strip().rpartition(":")
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"{source}: not a worker credential (expected NAME:KEY, KEY 64 hex digits, as "
                          "`echo2 keys worker NAME` prints it)")
    return Credential(check_name(name, f"{source}: worker name"), bytes.fromhex(key))


def given_credential(path: str | os.PathLike | None, environ: Mapping[str, str] = os.environ) -> Credential | None:
    """The credential in file `path` (--credential-file), else in $ECHO2_CREDENTIAL; None when neither is given."""
    if path:
        raw, shown = read_secret_file(path, MAX_FILE, "credential file")
        return parse_credential(raw.decode(errors="replace"), shown)
    if environ.get(ENV):
        return parse_credential(environ[ENV], f"${ENV}")
    return None


class Revocations:
    """The revoked worker names: `names` (run.revoked_workers) and the lines of file `path` (run.revoked_file;
    one name a line, blank lines and '#' comments skipped). `refresh()` re-reads the file when its mtime, size
    or inode changed. Names only accumulate: a name taken out of the file stays revoked for the life of this
    process (its buffered records were dropped and the buffer refuses its records from then on; issue a new
    name instead). A missing or unreadable file adds nothing."""

    def __init__(self, names: Iterable[str] = (), path: str | os.PathLike | None = None):
        self.fixed = frozenset(names)
        self.path = Path(path).expanduser() if path else None
        self._stamp: tuple[int, int, int] | None = None
        self._from_file: frozenset[str] = frozenset()
        self.refresh()

    def __contains__(self, name: object) -> bool:
        return name in self.fixed or name in self._from_file

    def refresh(self) -> bool:
        """Re-read the file if it changed (one stat otherwise); True when the set of names changed."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            log.warning("revoked file %s: cannot stat it (%s)", self.path, e)
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return False
        names = self._read()
        if names is None:
            return False
        self._stamp, before = stamp, self._from_file
        self._from_file = before | names
        return self._from_file != before

    def _read(self) -> frozenset[str] | None:
        assert self.path is not None
        try:
            with open(self.path, "rb") as fh:
                text = fh.read(MAX_REVOKED_FILE).decode(errors="replace")
        except OSError as e:
            log.warning("revoked file %s: cannot read it (%s)", self.path, e)
            return None
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return frozenset(line for line in lines if line)
