"""The learner step never aborts the run on data: a non-finite update is not applied, and a batch the step
raises on is dropped, counted (with the workers of its records) and training goes on."""

from __future__ import annotations

import json
import math

import pytest
from _peers import Client, LoopThread, wait

torch = pytest.importorskip("torch")

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.core.learner import Learner, NonFiniteUpdate  # noqa: E402
from echo2sdk.core.records import Meta, Trajectory  # noqa: E402
from echo2sdk.runtime.learner.recipe import Trainer  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402

pytestmark = pytest.mark.integration


def _group(gid: str, rewards=(1.0, 0.0)) -> list[Trajectory]:
    meta = Meta(group_id=gid, prompt_ids=(5, 6, 7), response_ids=(8, 9), logprobs=(-1.0, -1.0))
    return [Trajectory(prompt="p", response="y", reward=r, version=0, meta=meta) for r in rewards]


def test_a_non_finite_gradient_is_not_applied_and_the_next_step_is():
    learner = Learner(resolve_model("tiny-random"), lr=1e-2, precision="fp32")
    before = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    p = next(learner.model.parameters())
    hook = p.register_hook(lambda g: g * math.inf)  # one poisoned gradient
    with pytest.raises(NonFiniteUpdate, match="gradient norm nan|gradient norm inf"):
        learner.step([_group("g")])
    after = learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing applied
    assert learner.opt.state == {} or all(not s for s in learner.opt.state.values())  # no moment was updated
    hook.remove()
    st = learner.step([_group("g")])
    assert math.isfinite(st.grad_norm) and not torch.equal(before["model.embed_tokens.weight"],
                                                           learner.model.state_dict()["model.embed_tokens.weight"])


def _wire_group(gid: str, mask=None) -> list[dict]:
    meta = {"group_id": gid, "prompt_ids": [5, 6, 7], "response_ids": [8, 9], "logprobs": [-1.0, -1.0]}
    if mask is not None:
        meta["loss_mask"] = mask
    return [{"prompt": "p", "response": "y", "reward": r, "version": 0, "meta": meta} for r in (1.0, 0.0)]


def test_a_batch_the_learner_step_raises_on_is_dropped_and_the_run_finishes(tmp_path, caplog):
    """No local worker: one authenticated peer feeds 4 groups at version 0. The first has no loss-carrying token
    (the learner step raises ValueError on it, one group per step): dropped and counted; the next 3 train.
    (The zero-variance filter and the worker audit are off: they would set these hand-made groups aside.)"""
    cfg = load_config(None, [
        'model.policy="tiny-random"', 'task.adapter="toy"', "rollout.workers=0", "rollout.group_size=2",
        "learner.trajectories_per_step=2", "learner.steps=3", "learner.staleness=3", "learner.lr=1e-4",
        "learner.precision=\"fp32\"", "learner.data_timeout_s=60", "run.progress=false", "run.heartbeat_s=0.5",
        'broadcast.topology="direct"', "learner.filter_zero_variance=false",
        "learner.lie_threshold=0", f'run.out="{tmp_path}"',
    ])
    tr = Trainer(cfg)
    lt = LoopThread()
    try:
        tr.setup()

        async def feed():
            c = await Client.join(tr.coordinator.port, token=tr.coordinator.token, worker_id="feeder")
            groups = [_wire_group("empty", mask=[0, 0])] + [_wire_group(f"ok{i}") for i in range(3)]
            await c.push(groups, rid=1, batch="b1")
            return c, await c.recv()

        client, ack = lt.run(feed())
        assert ack["accepted"] == 8
        assert wait(lambda: tr.buffer.ready_groups() == 4, timeout=2), str(tr.buffer.stats())
        summary = tr.run()
        lt.run(client.close())
    finally:
        tr.close()
        lt.close()
    assert summary["steps"] == 3 and summary["batches_dropped"] == 1
    assert summary["batches_dropped_records_by_worker"] == {"feeder": 2}  # unnamed records are their sender's
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["batches_dropped"] for r in rows] == [1, 1, 1]
    assert "batch has no response token that carries loss" in caplog.text
