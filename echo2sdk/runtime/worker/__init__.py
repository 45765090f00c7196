"""The rollout plane's worker process (`echo2 worker --connect HOST:PORT`): `process.RolloutWorker` (connect,
handshake, the session's loops), `link` (its sealed messages to and from the coordinator), `snapshots` (the
pending snapshot, the chain-broadcast fetch and the install), `bootstrap` (a model taken from the coordinator)
and `rollout_loop` (pull prompts, roll out, push). The rollout itself is core: `core.rollout` (single-turn)
and `core.episodes` (multi-turn)."""
