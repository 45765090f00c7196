"""TLS for the coordinator and relay ports (standard-library `ssl`), with self-signed certificates.

Servers present a certificate: one made for the process (`Identity.generate`, the default) or one made
once with `echo2 keys` and loaded (`Identity.load`). Clients do not check it against any CA: they take
its SHA-256 fingerprint and bind the token handshake to it (`session`), so only the holder of that
certificate's key who also knows the token completes a handshake; where a fingerprint is pinned (a relay's,
given in an authenticated snapshot plan, or `echo2 worker --coordinator-fingerprint`), any other
certificate is refused before a byte of the protocol is sent. Plaintext is an explicit opt-in
(`Coordinator(tls=False)`, `echo2 worker --plaintext`); the token handshake and frame MACs still run.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from echo2sdk.errors import AuthError, ConfigError

__all__ = ["Identity", "client_context", "peer_fingerprint", "check_pin", "parse_fingerprint", "server_context"]

CERT_FILE, KEY_FILE = "echo2-cert.pem", "echo2-key.pem"


@dataclass(frozen=True)
class Identity:
    """A server's certificate and private key (PEM) and the certificate's SHA-256 fingerprint."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> bytes:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert_pem.decode())).digest()

    @classmethod
    def generate(cls, name: str = "echo2", days: int = 365) -> Identity:
        """A fresh self-signed ECDSA P-256 certificate (milliseconds)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or "echo2")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)).sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cls(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> Identity:
        """The certificate and key `echo2 keys --out FOLDER` wrote."""
        d = Path(folder)
        try:
            identity = cls((d / CERT_FILE).read_bytes(), (d / KEY_FILE).read_bytes())
            server_context(identity)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ConfigError(f"TLS identity in {str(d)!r}: {e}; make one with  echo2 keys --out {d}") from None
        return identity

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the certificate and (mode 0600) the key into `folder`; returns the folder."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        (d / CERT_FILE).write_bytes(self.cert_pem)
        fd = os.open(d / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.key_pem)
        return d


def server_context(identity: Identity) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="echo2-tls-") as tmp:  # ssl loads keys from files only
        cert, key = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
        for path, data in ((cert, identity.cert_pem), (key, identity.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert, key)
    return ctx


def client_context() -> ssl.SSLContext:
    """No CA check: the certificate is authenticated by the token handshake bound to its fingerprint, and by
    a pinned fingerprint where one is known."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_fingerprint(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> bytes:
    """SHA-256 of the peer's certificate; b"" on a plaintext connection."""
    if ssl_object is None:
        return b""
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise AuthError("the TLS server presented no certificate")
    return hashlib.sha256(der).digest()


def check_pin(seen: bytes, pinned: bytes | None, what: str) -> None:
    """AuthError unless the certificate fingerprint `seen` is the `pinned` one (None or b"": nothing pinned)."""
    if pinned and seen != pinned:
        raise AuthError(f"{what} presented certificate {seen.hex()[:16]}..., not the pinned {pinned.hex()[:16]}...")


def parse_fingerprint(text: str) -> bytes:
    """A SHA-256 fingerprint as `echo2 keys` prints it (hex, colons allowed)."""
    raw = text.replace(":", "").strip().lower()
    try:
        fp = bytes.fromhex(raw)
    except ValueError:
        fp = b""
    if len(fp) != 32:
        raise ConfigError(
            f"certificate fingerprint {text[:80]!r}: expected 64 hex digits (SHA-256), as `echo2 keys` prints them"
        )
    return fp
