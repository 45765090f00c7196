"""The run token as users hand it over: where it is read from and what to say when it comes the unsafe way
(docs/security.md, "Token hygiene"). How strong a token must be, and drawing one, is core/tokens.py (config
validation uses it too); its names are re-exported here.

On the command line (`--token`, `--set run.token=...`) a token is readable by every user of the machine
(`ps`, /proc/PID/cmdline) and lands in shell history: the CLI warns and names the safer ways, a file
(`--token-file PATH`, `run.token_file`) or the environment ($ECHO2_TOKEN).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from echo2sdk.core.tokens import MIN_TOKEN_BITS, check_token, new_token, token_bits
from echo2sdk.errors import ConfigError

__all__ = [
    "ENV", "MIN_TOKEN_BITS", "ARGV_WARNING", "new_token", "token_bits", "check_token", "read_token_file", "given_token",
]

ENV = "ECHO2_TOKEN"  # the environment variable the run and its workers read the token from
ARGV_WARNING = (
    "the token is on the command line, where any user of this machine can read it (ps, /proc) and the shell "
    f"keeps it in its history; prefer --token-file PATH (mode 0600) or ${ENV}"
)
MAX_TOKEN_FILE = 4096  # bytes read from a token file
log = logging.getLogger("echo2sdk.credentials")


def read_secret_file(path: str | os.PathLike, limit: int, what: str) -> tuple[bytes, str]:
    """(The bytes, the name to show) of a small secret file `path` (a token, a worker credential) of at most
    `limit` bytes; ConfigError naming `what` and the path when it cannot be read or is longer. A file other
    users may read or write (mode & 0o077) is read with a warning that says how to fix it (as ssh keys)."""
    p = Path(path).expanduser()
    shown = f"{what} {str(p)!r}"
    try:
        with open(p, "rb") as fh:
            mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
            raw = fh.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if len(raw) > limit:
        raise ConfigError(f"{shown}: longer than {limit} bytes; it should hold the {what.split()[0]} only")
    if os.name == "posix" and mode & 0o077:
        log.warning("%s: other users of this machine may read or change it (mode %04o); chmod 600 it", shown, mode)
    return raw, shown


def read_token_file(path: str | os.PathLike) -> str:
    """The token in file `path` (surrounding whitespace and the final newline stripped); ConfigError naming
    the path when it cannot be read or holds no token."""
    raw, shown = read_secret_file(path, MAX_TOKEN_FILE, "token file")
    try:
        token = raw.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: not UTF-8 text") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"{shown}: expected one token on one line, without spaces")
    return token


def given_token(
    token: str | None,
    token_file: str | os.PathLike | None,
    environ: Mapping[str, str] = os.environ,
    *,
    names: tuple[str, str] = ("run.token", "run.token_file"),
) -> tuple[str, str] | None:
    """(token, where it came from) of a user-given token: `token` (a config value or a flag), else the file
    `token_file`, else $ECHO2_TOKEN; None when none is given. `names`: how the two are called in errors
    (config keys, or flags). Not checked for strength: `check_token` does that where the token is chosen."""
    if token and token_file:
        raise ConfigError(f"give the token once: both {names[0]} and {names[1]} are set")
    if token:
        return token, names[0]
    if token_file:
        return read_token_file(token_file), f"{names[1]} {str(token_file)!r}"
    if environ.get(ENV):
        return environ[ENV], f"${ENV}"
    return None
