"""The live status page of a run (`run.status_port`): `page_state` (view.py) assembles what it shows from a
`RunView`, `StatusServer` serves it with the page (index.html, app.js, style.css: package data, no build step,
nothing from elsewhere)."""

from echo2sdk.runtime.learner.status.server import StatusServer
from echo2sdk.runtime.learner.status.view import RunView, page_state

__all__ = ["RunView", "StatusServer", "page_state"]
