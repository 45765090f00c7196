"""Run tokens: drawing one and judging the strength of one a user gives (docs/security.md, "Token hygiene").

A token given by a user must carry at least MIN_TOKEN_BITS = 128 bits, estimated as its length times the
bits per character of the smallest usual alphabet that holds all its characters: hex digits 4, url-safe
or standard base64 6, anything else log2(95) (printable ASCII). So 22 url-safe base64 characters
(`secrets.token_urlsafe(16)`) or 32 hex digits (`secrets.token_hex(16)`) pass. The estimate cannot tell a
random string from a pattern of the same alphabet and length: draw tokens, do not make them up. A token
the run draws itself (`new_token()`: `secrets.token_urlsafe(24)`, 192 bits, redrawn while it starts with "-", which
`echo2 worker --token T` would read as an option) needs no check.

Pure (no files, sockets or environment): config validation uses it; where tokens are read from lives in
runtime/trust/credentials.py.
"""

from __future__ import annotations

import math
import secrets
import string

from echo2sdk.errors import ConfigError

__all__ = ["MIN_TOKEN_BITS", "new_token", "token_bits", "check_token"]

MIN_TOKEN_BITS = 128
_HEX = set(string.hexdigits)
_BASE64 = set(string.ascii_letters + string.digits + "-_+/=")


def new_token() -> str:
    """A run token: 24 random bytes, url-safe base64, never starting with "-" (1 in 64 draws would, and argparse
    reads `--token -x...` as a missing value followed by an option)."""
    while (token := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return token


def token_bits(token: str) -> float:
    """Estimated strength of `token` in bits: its length times log2 of its alphabet's size (hex 16,
    base64 64, else printable ASCII 95)."""
    chars = set(token)
    size = 16 if chars <= _HEX else 64 if chars <= _BASE64 else 95
    return len(token) * math.log2(size)


def check_token(token: str, source: str) -> str:
    """`token` when it carries MIN_TOKEN_BITS; else a ConfigError naming `source`, the token's length and
    estimated bits (never the token) and how to draw a good one."""
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ConfigError(
            f"{source}: the token is {len(token)} characters, about {bits:.0f} bits; the minimum is "
            f"{MIN_TOKEN_BITS} bits (22 url-safe base64 characters or 32 hex digits). Draw one with  "
            "python -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    return token
