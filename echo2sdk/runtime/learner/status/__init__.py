"""The live status page of a run (`run.status_port`): `status_snapshot` assembles what it shows from a `RunView`, `StatusServer`
serves it with the page (index.html, app.js, style.css: package data, no build step, nothing from elsewhere)."""

from echo2sdk.runtime.learner.status.server import StatusServer
from echo2sdk.runtime.learner.status.snapshot import RunView, status_snapshot

__all__ = ["RunView", "StatusServer", "status_snapshot"]
