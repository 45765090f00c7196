"""The live status page of a run (`run.status_port`): `status_snapshot` assembles what it shows, `StatusServer`
serves it with the page (index.html, app.js, style.css: package data, no build step, nothing from elsewhere)."""

from echo2sdk.runtime.status.server import StatusServer
from echo2sdk.runtime.status.snapshot import status_snapshot

__all__ = ["StatusServer", "status_snapshot"]
