"""Metrics sinks: each built-in's output read back with its own library's reader; loading, isolation of a
failing optional sink, and the helpers. Offline: W&B runs in offline mode, MLflow on a file store."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from echo2sdk.core.records import Message, Meta, Trajectory
from echo2sdk.errors import Echo2Error, NameNotFound
from echo2sdk.runtime.sinks import SINKS, Sinks, check_sink, flatten, load_sinks, redact, sample_rows
from echo2sdk.runtime.sinks.jsonl import JsonlSink, reset_run_files

#: Two steps of a run: rows shaped like metrics.jsonl's (nested `task`, None where not measured).
ROWS = [
    {"step": 1, "version": 1, "reward_mean": 0.5, "accuracy": 0.5, "staleness_max": 0, "task": {"correct": 0.5},
     "t_bcast_s": None, "workers_alive": 2},
    {"step": 2, "version": 2, "reward_mean": 0.75, "accuracy": 0.875, "staleness_max": 1, "task": {"correct": 0.875},
     "t_bcast_s": 79.3, "workers_alive": 2},
]
CONFIG = {"learner": {"lr": 3e-06, "staleness": 3}, "run": {"token": "s3cret", "log_to": ["jsonl"]}}
SAMPLES = [{"prompt": "1+1=", "response": "2", "reward": 1.0, "correct": True},
           {"prompt": "2+2=", "response": "5 | or 4\nmaybe", "reward": 0.0, "correct": False}]
HIST = {0: 8, 1: 6, 3: 2}


def _drive(sink) -> None:
    """What a trainer does: two steps, a samples table and a staleness histogram at step 2."""
    for row in ROWS:
        sink.log(row["step"], row)
    sink.log_table(2, "samples", SAMPLES)
    sink.log_histogram(2, "staleness", HIST)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Keep W&B and MLflow inside tmp_path: no network, nothing in the home folder, no tracking server."""
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(var, "x")  # recorded, so the teardown restores what was there (the sink sets one)
        monkeypatch.delenv(var)
    return tmp_path / "run"


# -- registration and loading ------------------------------------------------------------------------
def test_builtins_register_through_the_entry_point_group():
    from echo2sdk.plugins import registered

    eps = registered(SINKS)
    assert {n: eps[n].value for n in ("jsonl", "tensorboard", "wandb", "mlflow")} == {
        "jsonl": "echo2sdk.runtime.sinks.jsonl:JsonlSink",
        "tensorboard": "echo2sdk.runtime.sinks.tensorboard:TensorBoardSink",
        "wandb": "echo2sdk.runtime.sinks.wandb:WandbSink",
        "mlflow": "echo2sdk.runtime.sinks.mlflow:MlflowSink",
    }


def test_importing_the_sinks_imports_none_of_their_libraries():
    code = ("import sys, echo2sdk.runtime.sinks.jsonl, echo2sdk.runtime.sinks.tensorboard, "
            "echo2sdk.runtime.sinks.wandb, echo2sdk.runtime.sinks.mlflow; "
            "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_unknown_sink_name_is_an_error_with_a_suggestion(tmp_path):
    with pytest.raises(NameNotFound, match=r"unknown sink 'tensorbord'.*Did you mean 'tensorboard'"):
        load_sinks(["jsonl", "tensorbord"], tmp_path, CONFIG)


class Exploding:
    """A sink that cannot start."""

    def open(self, run_dir, config):
        raise RuntimeError("no space for my files")

    def log(self, step, metrics): ...
    def log_table(self, step, name, rows): ...
    def log_histogram(self, step, name, counts): ...
    def close(self): ...


class FailsOnStep2(Exploding):
    """A sink that works, then raises on the second step."""

    logged: list = []
    closed = False

    def open(self, run_dir, config):
        type(self).logged = []

    def log(self, step, metrics):
        if step == 2:
            raise OSError("disk full")
        self.logged.append(step)

    def close(self):
        type(self).closed = True


class NoHistogram:
    def open(self, run_dir, config): ...
    def log(self, step, metrics): ...
    def log_table(self, step, name, rows): ...
    def close(self): ...


def test_a_failing_optional_sink_is_logged_and_skipped_never_fatal(tmp_path, caplog):
    mod = __name__
    with caplog.at_level(logging.WARNING, logger="echo2sdk.sinks"):
        sinks = load_sinks(["jsonl", f"{mod}:Exploding", f"{mod}:FailsOnStep2", f"{mod}:NoHistogram"], tmp_path, CONFIG)
        assert sinks.names == ["jsonl", f"{mod}:FailsOnStep2"]
        _drive(sinks)
        sinks.close()
    assert "Exploding' is off: RuntimeError: no space for my files" in caplog.text
    assert "lacks ['log_histogram']" in caplog.text and "'echo2sdk.sinks'" in caplog.text
    assert "FailsOnStep2' failed in log (OSError: disk full); it is off for the rest of the run" in caplog.text
    assert FailsOnStep2.logged == [1] and FailsOnStep2.closed
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # the run's record is complete


def test_a_required_sink_that_fails_raises(tmp_path):
    with pytest.raises(RuntimeError, match="no space"):
        load_sinks([f"{__name__}:Exploding"], tmp_path, CONFIG, required=[f"{__name__}:Exploding"])
    sinks = Sinks({"a": FailsOnStep2()}, required=["a"])
    sinks.log(1, ROWS[0])
    with pytest.raises(OSError, match="disk full"):
        sinks.log(2, ROWS[1])


def test_a_missing_package_names_the_extra_to_install(tmp_path, monkeypatch, caplog):
    for name in ("wandb", "mlflow", "mlflow.tracking", "tensorboard", "tensorboard.compat.proto"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with caplog.at_level(logging.WARNING, logger="echo2sdk.sinks"):
        sinks = load_sinks(["jsonl", "tensorboard", "wandb", "mlflow"], tmp_path, CONFIG)
    assert sinks.names == ["jsonl"]
    for extra in ("tensorboard", "wandb", "mlflow"):
        assert f'pip install "echo2sdk[{extra}]"' in caplog.text
    sinks.close()


def test_check_sink_names_the_sink_group_and_missing_methods():
    with pytest.raises(Echo2Error, match=r"metrics sink 'mine' \(NoHistogram\) in group 'echo2sdk.sinks' lacks \['log_histogram'\]"):
        check_sink(NoHistogram(), "mine")


# -- each built-in, read back --------------------------------------------------------------------------
def test_jsonl_writes_config_at_open_and_appends_rows_exactly(tmp_path):
    sink = JsonlSink()
    sink.open(tmp_path, redact(CONFIG))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["learner"]["lr"] == 3e-06 and config["run"]["token"] == "<redacted>"  # before any step
    _drive(sink)
    assert sink.tell() == (tmp_path / "metrics.jsonl").stat().st_size
    sink.close()
    again = JsonlSink()  # a resumed run: appends, never overwrites
    again.open(tmp_path, CONFIG)
    again.log(3, {**ROWS[1], "step": 3})
    again.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == [json.dumps(r) for r in ROWS] + [json.dumps({**ROWS[1], "step": 3})]
    table = json.loads((tmp_path / "tables.jsonl").read_text())
    assert table == {"step": 2, "name": "samples", "rows": SAMPLES}
    hist = json.loads((tmp_path / "histograms.jsonl").read_text())
    assert hist == {"step": 2, "name": "staleness", "counts": {"0": 8, "1": 6, "3": 2}}
    reset_run_files(tmp_path)
    assert not any((tmp_path / f).exists() for f in ("metrics.jsonl", "tables.jsonl", "histograms.jsonl"))


def test_tensorboard_event_file_holds_scalars_text_and_histogram(offline):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = load_sinks(["jsonl", "tensorboard"], offline, CONFIG)
    assert sinks.names == ["jsonl", "tensorboard"]
    _drive(sinks)
    sinks.close()
    files = list((offline / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(offline / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"reward_mean", "accuracy", "task/correct", "staleness_max", "t_bcast_s"} <= set(tags["scalars"])
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("task/correct")] == [(1, 0.5), (2, 0.875)]
    assert [e.step for e in acc.Scalars("t_bcast_s")] == [2]  # None is "not measured", not a zero
    h = acc.Histograms("staleness")[0]
    assert h.step == 2 and h.histogram_value.num == 16 and list(h.histogram_value.bucket) == [8, 6, 0, 2]
    texts = {t: acc.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in tags["tensors"]}
    assert "| prompt | response | reward | correct |" in texts["samples"] and "5 \\| or 4<br>maybe" in texts["samples"]
    assert '"lr": 3e-06' in texts["config"] and "s3cret" not in texts["config"]


def _wandb_records(path: Path) -> list:
    """The protobuf records of an offline run's .wandb file (W&B's header, then LevelDB-log-format blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or kind == 0:  # a block's zero padding
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: one record complete
            records.append(pb.Record.FromString(buf))
            buf = b""
    return records


def test_wandb_offline_run_holds_config_history_table_and_histogram(offline):
    pytest.importorskip("wandb")
    sinks = load_sinks(["jsonl", "wandb"], offline, CONFIG)
    assert sinks.names == ["jsonl", "wandb"]
    _drive(sinks)
    sinks.close()
    (folder,) = (offline / "wandb").glob("offline-run-*")
    (file,) = folder.glob("run-*.wandb")
    records = _wandb_records(file)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds and "exit" in kinds
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["learner"]["lr"] == 3e-06 and config["run"]["token"] == "<redacted>"
    history = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["reward_mean"], h["task/correct"]) for h in history] == [(1, 0.5, 0.5), (2, 0.75, 0.875)]
    assert "t_bcast_s" not in history[0] and history[1]["t_bcast_s"] == 79.3
    assert history[1]["staleness/_type"] == "histogram" and history[1]["staleness/values"] == [8, 6, 0, 2]
    assert history[1]["samples/_type"] == "table-file" and history[1]["samples/nrows"] == 2
    (table,) = (folder / "files" / "media" / "table").glob("samples_2_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["prompt", "response", "reward", "correct"] and data["data"][0][:3] == ["1+1=", "2", 1.0]


def test_wandb_sink_leaves_a_users_own_wandb_run_open(offline):
    wandb = pytest.importorskip("wandb")
    mine = wandb.init(project="mine", dir=str(offline.parent), mode="offline", reinit="create_new",
                      settings=wandb.Settings(console="off", silent=True))
    sinks = load_sinks(["wandb"], offline, CONFIG)
    _drive(sinks)
    sinks.close()  # finishes the sink's run only: W&B is not torn down under the user's run
    assert wandb.setup().most_recent_active_run is mine
    mine.log({"x": 1.0})
    mine.finish()
    wandb.teardown()


def test_mlflow_file_store_holds_params_metrics_and_artifacts(offline):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    sinks = load_sinks(["jsonl", "mlflow"], offline, CONFIG)
    assert sinks.names == ["jsonl", "mlflow"]
    run_id = sinks["mlflow"].run_id
    _drive(sinks)
    sinks.close()
    client = MlflowClient(tracking_uri=(offline / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["learner.lr"] == "3e-06" and run.data.params["run.token"] == "<redacted>"
    assert run.data.params["run.log_to"] == '["jsonl"]'
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "task/correct")] == [(1, 0.5), (2, 0.875)]
    assert [m.step for m in client.get_metric_history(run_id, "t_bcast_s")] == [2]
    assert {k: run.data.metrics[f"staleness/{k}"] for k in (0, 1, 3)} == {0: 8, 1: 6, 3: 2}
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert json.loads((artifacts / "config.json").read_text())["learner"]["lr"] == 3e-06
    table = json.loads((artifacts / "tables" / "samples" / "step_000002.json").read_text())
    assert table["columns"] == ["prompt", "response", "reward", "correct"] and table["data"][1][3] is False


# -- helpers ---------------------------------------------------------------------------------------------
def test_flatten_keeps_measurements_only():
    got = flatten({"a": 1, "b": None, "c": "x", "d": True, "task": {"correct": 0.5, "turns": {"p": 2}}, "e": float("nan")})
    assert got == {"a": 1.0, "d": 1.0, "task/correct": 0.5, "task/turns/p": 2.0}


def test_redact_hides_secrets_at_any_depth_and_keeps_unset_ones_visible():
    cfg = {"run": {"token": "t", "api_key": "k"}, "x": [{"db_password": "p", "HF_TOKEN": "h"}],
           "model": {"policy": "m", "token": None}, "rollout": {"max_new_tokens": 48, "tokens": 3}}
    assert redact(cfg) == {"run": {"token": "<redacted>", "api_key": "<redacted>"},
                           "x": [{"db_password": "<redacted>", "HF_TOKEN": "<redacted>"}],
                           "model": {"policy": "m", "token": None}, "rollout": {"max_new_tokens": 48, "tokens": 3}}


def _traj(group: str, i: int, prompt, reward: float) -> Trajectory:
    meta = Meta(group_id=group, prompt_ids=(1,), response_ids=(2,), logprobs=(-0.1,), worker="local-0",
                extra={"correct": reward > 0, "turns": i})
    return Trajectory(prompt=prompt, response=f"answer {i}", reward=reward, version=3, meta=meta)


def test_sample_rows_take_one_per_group_first_with_the_task_fields():
    chat = (Message(role="system", content="be brief"), Message(role="user", content="2+2?"))
    records = [_traj("g1", i, "1+1=", 1.0) for i in range(4)] + [_traj("g2", i, chat, 0.0) for i in range(4)]
    rows = sample_rows(records, limit=3)
    assert [(r["prompt"], r["response"]) for r in rows] == [("1+1=", "answer 0"), ("system: be brief\nuser: 2+2?", "answer 0"),
                                                            ("1+1=", "answer 1")]
    assert list(rows[0]) == ["prompt", "response", "reward", "version", "worker", "correct", "turns"]
    assert rows[1]["correct"] is False and rows[1]["version"] == 3 and len(sample_rows(records, limit=20)) == 8


# -- the trainer's use -----------------------------------------------------------------------------------
def test_run_log_to_must_start_with_jsonl():
    from echo2sdk.config import load_config
    from echo2sdk.errors import ConfigError

    assert load_config(None).run.log_to == ["jsonl"]
    assert load_config(None, ['run.log_to=["jsonl", "tensorboard"]']).run.log_to == ["jsonl", "tensorboard"]
    with pytest.raises(ConfigError, match=r"start it with 'jsonl'"):
        load_config(None, ['run.log_to=["tensorboard"]'])
