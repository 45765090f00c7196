"""Echo2: the script-level entry point (paper appendix F).

    echo = Echo2(policy="smollm2-135m")
    echo.set(dataset="math", staleness=3)
    echo.warmup()
    echo.run()

    Echo2.from_config("run.toml", resume="runs/run").run()   # continue from the newest checkpoint
"""

from __future__ import annotations

from typing import Any

from echo2sdk.config import Config, load_config, validate_config
from echo2sdk.errors import ConfigError

__all__ = ["Echo2"]

# Short names accepted by Echo2.set(...) and where they live in the config.
_ALIASES = {
    "staleness": "learner.staleness",
    "S": "learner.staleness",
    "kappa": "learner.kappa",
    "steps": "learner.steps",
    "R": "learner.trajectories_per_step",
    "lr": "learner.lr",
    "beta": "learner.beta",
    "workers": "rollout.workers",
    "group_size": "rollout.group_size",
    "backend": "rollout.backend",
    "out": "run.out",
    "seed": "run.seed",
}


class Echo2:
    def __init__(self, policy: str | None = None, reference: str | bool | None = None, config: Config | None = None):
        data = (config or Config()).model_dump()
        if policy is not None:
            data["model"]["policy"] = str(policy)
        if reference is not None:
            if isinstance(reference, str) and reference != data["model"]["policy"]:
                raise ConfigError(
                    f"reference={reference!r}: the reference must be the initial policy {data['model']['policy']!r}"
                )
            data["model"]["reference"] = bool(reference)
        self.config = validate_config(data, "Echo2(...)")
        self._adapter = None
        self._trainer = None
        self.resume: str | None = None  # a run folder or checkpoint folder to continue from (run())

    @classmethod
    def from_config(cls, path: str, overrides: list[str] | tuple[str, ...] = (), resume: str | None = None) -> Echo2:
        """The run `path` describes; with `resume` (a run folder or one of its checkpoints) it continues from
        that checkpoint: step, version sequence, optimizer and RNG states, metrics.jsonl appended."""
        echo = cls(config=load_config(path, overrides))
        echo.resume = resume
        return echo

    def set(self, **values: Any) -> Echo2:
        """Set run options: `dataset=` (adapter name or adapter stream), short names such as
        `staleness=3`, or dotted config keys via `**{"learner.lr": 1e-5}`."""
        data = self.config.model_dump()
        for key, value in values.items():
            if key == "dataset":
                self._set_dataset(data, value)
                continue
            path = _ALIASES.get(key, key).split(".")
            if len(path) == 1:
                raise ConfigError(f"Echo2.set: unknown option {key!r} (known: dataset, {', '.join(_ALIASES)}, or 'section.key')")
            node = data
            for part in path[:-1]:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"Echo2.set: unknown option {key!r}: {part!r} is not a config section")
                node = node[part]
            node[path[-1]] = value  # unknown leaf keys are reported by validation below
        self.config = validate_config(data, "Echo2.set(...)")
        return self

    def _set_dataset(self, data: dict[str, Any], value: Any) -> None:
        if isinstance(value, str):
            data["task"] = {"adapter": value, "options": {}}
        elif hasattr(value, "spec"):  # an adapter or a stream that can be rebuilt in a worker process
            name, options = value.spec()
            data["task"] = {"adapter": name, "options": dict(options)}
            self._adapter = getattr(value, "adapter", value)
        else:
            raise ConfigError(
                f"Echo2.set: dataset={value!r} must be an adapter name (e.g. 'math') or an adapter stream"
            )

    def _trainer_(self):
        from echo2sdk.runtime.learner.recipe import Trainer

        if self._trainer is None or self._trainer.cfg != self.config:
            self._trainer = Trainer(self.config, adapter=self._adapter, resume=self.resume)
        return self._trainer

    def warmup(self, calibrate: bool | None = None) -> dict[str, Any]:
        """Load the learner, start the coordinator and local workers, and wait until every local worker
        has joined. With `calibrate` (default: scheduler.enabled) also measure T_train (median of 5
        offline steps), T_bcast (one real publication) and each worker's mu_i, print the provisioning
        decision and hand the numbers to the scheduler (Trainer.calibrate). Returns what was measured."""
        import time

        tr = self._trainer_()
        t0 = time.perf_counter()
        tr.setup()
        if not tr.topo.leader:  # a torchrun rank other than 0 holds a learner shard only
            return {}
        deadline = time.monotonic() + 300
        while len(tr.coordinator.alive_workers()) < self.config.rollout.workers and time.monotonic() < deadline:
            time.sleep(0.2)
        out: dict[str, Any] = {"workers": len(tr.coordinator.alive_workers()), "setup_s": time.perf_counter() - t0}
        if self.config.scheduler.enabled if calibrate is None else calibrate:
            cal = tr.calibrate()
            print(cal["decision"], flush=True)
            out.update(cal)
            self._calibrated = True
        return out

    def run(self) -> dict[str, Any]:
        if self.config.scheduler.enabled and not getattr(self, "_calibrated", False):
            self.warmup()
        tr = self._trainer_()
        clean = False
        try:
            out = tr.run()
            clean = True
            return out
        finally:
            tr.close(clean)
            self._trainer = None
