"""The `mlflow` sink: an MLflow run in a local file store, RUN_DIR/mlruns (``mlflow ui --backend-store-uri
RUN_DIR/mlruns``), or wherever ``$MLFLOW_TRACKING_URI`` points (a server, ``sqlite:///...``).

The experiment is ``$MLFLOW_EXPERIMENT_NAME`` (default ``echo2``), the run's name the run folder's name,
tagged ``echo2.run_dir``. The config is logged as params (flattened with dots, ``learner.lr``) and as the
artifact config.json; each step's row as metrics at that step (``task/correct``); a table as the JSON
artifact ``tables/NAME/step_000010.json`` ({"columns", "data"}); a histogram as one metric per bucket
(``staleness/0``, ``staleness/1``, ...). Uses the client API only (no global active run). Needs the `mlflow`
extra (mlflow-skinny).

MLflow 3 keeps the file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is
true; this sink sets that variable (when it is unset) for its own default store only.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from echo2sdk.errors import DependencyNotInstalled
from echo2sdk.runtime.sinks import columns, flatten, sorted_counts

__all__ = ["MlflowSink"]

#: MLflow's limits: metrics per log_batch call, params per call, characters of a param value (the
#: strictest of the versions in use).
_BATCH_METRICS, _BATCH_PARAMS, _PARAM_CHARS = 1000, 100, 500
_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


class MlflowSink:
    """One MLflow run per `open`, finished by `close`."""

    def __init__(self) -> None:
        self._client: Any = None
        self.run_id: str | None = None

    def open(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise DependencyNotInstalled("mlflow", "mlflow") from None
        run_dir = Path(run_dir).resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "echo2"))
        run = self._client.create_run(experiment, run_name=run_dir.name, tags={"echo2.run_dir": str(run_dir)})
        self.run_id = run.info.run_id
        params = list(dict(_params(config)).items())  # one value per key, as MLflow requires
        from mlflow.entities import Param

        for i in range(0, len(params), _BATCH_PARAMS):
            self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in params[i : i + _BATCH_PARAMS]])
        self._client.log_dict(self.run_id, config, "config.json")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._metrics(step, flatten(metrics))

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        cols = columns(rows)
        data = {"columns": cols, "data": [[r.get(c) for c in cols] for r in rows]}
        self._client.log_dict(self.run_id, json.loads(json.dumps(data, default=str)),
                              f"tables/{_key(name)}/step_{step:06d}.json")

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        self._metrics(step, {f"{name}/{k}": float(c) for k, c in sorted_counts(counts)})

    def close(self) -> None:
        if self._client is not None and self.run_id is not None:
            client, self._client = self._client, None
            client.set_terminated(self.run_id)

    def _experiment(self, name: str) -> str:
        """The id of experiment `name`, created when missing (another process may create it at once)."""
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(name)
        except Exception:  # noqa: BLE001 - lost the race to create it: it exists now
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_key(k), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), _BATCH_METRICS):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH_METRICS])


def _key(name: str) -> str:
    """A metric, param or artifact name MLflow accepts (letters, digits, _ - . space /)."""
    return _KEY_BAD.sub("_", name).replace("..", "_").strip("/") or "_"


def _params(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """The config's leaves as (dotted key, text) params; long values are cut to _PARAM_CHARS characters."""
    out: list[tuple[str, str]] = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += _params(value, name + ".")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out.append((_key(name), text[:_PARAM_CHARS]))
    return out
