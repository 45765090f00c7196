"""The run's secrets, which its checkpoints keep so that a resumed run keeps its identity: the token workers join
with (given by run.token, run.token_file or $ECHO2_TOKEN; else the checkpoint's; else drawn), the manifest signing
key (broadcast topologies other than "direct") and the coordinator's TLS certificate."""

from __future__ import annotations

from typing import Any

from echo2sdk.runtime.trust.credentials import new_token

__all__ = ["RunSecrets"]


class RunSecrets:
    """The token and signing key of one run. `given_token`: the token the user gave (checked), or None."""

    def __init__(self, given_token: str | None) -> None:
        self.given_token = given_token
        self.signing_key: Any = None  # an Ed25519PrivateKey once loaded or generated
        self.drawn_token = False  # the token was not given: checkpoints keep it

    def token(self, kept: dict[str, bytes]) -> str:
        """The run's token: the given one, else the one the checkpoint kept (`kept`), else a new one."""
        token = self.given_token or kept.get("token", b"").decode() or new_token()
        self.drawn_token = not self.given_token
        return token

    def load_signing_key(self, kept: dict[str, bytes], topology: str) -> Any:
        """The manifest signing key (the checkpoint's, else a new one); None for the "direct" topology."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if topology != "direct":
            raw = kept.get("signing.key")
            self.signing_key = Ed25519PrivateKey.from_private_bytes(raw) if raw else Ed25519PrivateKey.generate()
        return self.signing_key

    def to_keep(self, coordinator: Any) -> dict[str, bytes]:
        """What a checkpoint keeps: the signing key, the coordinator's certificate and a token that was not given."""
        out = {}
        if self.signing_key is not None:
            out["signing.key"] = self.signing_key.private_bytes_raw()
        identity = getattr(coordinator, "identity", None)
        if identity is not None:
            out["tls-cert.pem"], out["tls-key.pem"] = identity.cert_pem, identity.key_pem
        if self.drawn_token and coordinator is not None:
            out["token"] = coordinator.token.encode()
        return out
