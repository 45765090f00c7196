"""Snapshot dissemination (paper §4.2) as it runs: `delivery` (the SnapshotDelivery interface and the direct
push), `chain` (the learner's side of peer-assisted chain broadcast), `relay` (every worker's relay port and
chunk fetcher), `bootstrap` (a worker without the model fetches the base files). Planning, scores and manifests
are pure and live in `echo2sdk.core.broadcast`."""
