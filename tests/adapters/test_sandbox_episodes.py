"""Multi-turn episodes through the rollout plane and into the learner, on a tiny random Llama and a real
gymnasium FrozenLake: token bookkeeping, turn-aware masks, failed episodes, the learner's GRPO + IS path."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from echo2sdk.adapters import SandboxAdapter  # noqa: E402
from echo2sdk.backends.hf import HFBackend  # noqa: E402
from echo2sdk.core.episodes import EpisodeStats, continuation_ids, play_episodes  # noqa: E402
from echo2sdk.core.contracts import SamplingParams  # noqa: E402
from echo2sdk.core.learner import Learner  # noqa: E402
from echo2sdk.core.records import Trajectory  # noqa: E402
from echo2sdk.runtime.worker.process import RolloutWorker  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny-random")


@pytest.fixture(scope="module")
def backend(tiny):
    b = HFBackend(tiny)
    yield b
    b.close()


def _adapter(**kw):
    opts = {"env_options": {"is_slippery": False}, "max_turns": 3, "max_action_tokens": 6, **kw}
    return SandboxAdapter(env="gym://FrozenLake-v1", **opts)


def test_records_hold_exactly_the_tokens_the_sampler_saw(backend, tiny):
    adapter = _adapter()
    tasks = [t for _, t in zip(range(2), adapter.tasks(0))]
    stats = EpisodeStats()
    groups = play_episodes(backend, adapter, tasks, 3, SamplingParams(max_new_tokens=6, seed=3), version=2, stats=stats)
    assert [len(g) for g in groups] == [3, 3] and stats.failed == 0
    learner = Learner(tiny, lr=1e-4, precision="fp32")
    rows = learner._rows(groups)
    with torch.no_grad():
        logp = learner._token_logprobs(rows).tolist()
    i = 0
    for g, task in zip(groups, tasks):
        for r in g:
            m = r.meta
            assert r.version == 2 and m.group_id == task.id
            assert m.prompt_ids == tuple(backend.encode_chat([mm.model_dump() for mm in r.prompt[:2]]))
            roles = [mm.role for mm in r.prompt]
            assert roles[:2] == ["system", "user"] and roles[2::2] == ["assistant"] * r.meta.extra["turns"]
            assert sum(m.loss_mask) > 0 and len(m.loss_mask) == len(m.response_ids)
            for lp, sampled, mask in zip(logp[i : i + len(m.response_ids)], m.logprobs, m.loss_mask):
                if mask:  # the learner recomputes pi_sampler on the very same context (same weights here)
                    assert lp == pytest.approx(sampled, abs=2e-3)
                else:  # an env turn: no loss, no log-prob
                    assert lp == 0.0 and sampled == 0.0
            i += len(m.response_ids)
            assert Trajectory.from_wire(r.to_wire()) == r


def test_user_turns_inside_the_response_come_from_the_chat_template(backend):
    glue = continuation_ids(backend, "Turn 2.")
    full = backend.encode_chat(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
         {"role": "user", "content": "Turn 2."}]
    )
    assert full[-len(glue) :] == glue and glue[0] != backend.eos_token_id  # starts right after the closing eos


def test_malformed_replies_get_fallback_and_penalty_and_are_counted(backend):
    adapter = _adapter(penalty=0.25)
    task = next(adapter.tasks(0))
    ep = adapter.start(task, 0)
    st = ep.step("no idea")
    assert st.reward == pytest.approx(-0.25) and st.info["status"] == "unparsable" and st.info["action"] == "left"
    st = ep.step("<answer>jump</answer>")
    assert st.info["status"] == "illegal"
    st = ep.step("<answer>right</answer>")
    assert st.info["status"] == "ok" and st.reward == 0.0
    res = ep.result()
    assert (res.info["illegal"], res.info["unparsable"], res.info["fallbacks"]) == (1, 1, 2)
    assert res.reward == pytest.approx(-0.5)


class _Exploding:
    """A real FrozenLake sandbox that raises on its second step (a crashing env server, say)."""

    def __init__(self, inner):
        self.inner, self.steps = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("sandbox lost its connection")
        return self.inner.step(action)


class _FlakyAdapter(SandboxAdapter):
    def start(self, task, index):  # episode 0 of each group gets the faulty sandbox
        ep = super().start(task, index)
        if index == 0:
            ep.sandbox = _Exploding(ep.sandbox)
        return ep


def test_a_sandbox_that_raises_is_a_recorded_failed_episode_not_a_crashed_worker(backend, tiny):
    opts = _adapter(max_action_tokens=4).options()
    adapter = _FlakyAdapter(**{k: v for k, v in opts.items()})
    worker = RolloutWorker("127.0.0.1:9", "token", worker_id="w-test")
    worker.backend, worker.adapter, worker.max_len = backend, adapter, 2048
    tasks = [t for _, t in zip(range(2), adapter.tasks(1))]
    wire = worker.rollout(tasks, 3, SamplingParams(max_new_tokens=4, seed=0))  # the worker's own rollout step
    groups = [[Trajectory.from_wire(r) for r in g] for g in wire]
    assert worker.episode_stats.failed == 2 and "sandbox lost its connection" in worker.episode_stats.errors[0]
    for g in groups:
        failed = [r for r in g if r.meta.extra["failed"]]
        assert len(failed) == 1 and "RuntimeError: sandbox lost its connection" in failed[0].meta.extra["error"]
        assert sum(failed[0].meta.loss_mask) == 0 and failed[0].reward == 0.0
    # the learner consumes the groups unchanged; the failed episode carries no gradient and no group weight
    learner = Learner(tiny, lr=1e-4, precision="fp32")
    rows = learner._rows(groups)
    assert [r.advantage for r, t in zip(rows, [t for g in groups for t in g]) if t.meta.extra["failed"]] == [0.0, 0.0]
    st = learner.step(groups)
    assert math.isfinite(st.loss) and st.tokens == sum(sum(t.meta.loss_mask) for g in groups for t in g)


def test_a_group_where_every_episode_failed_is_dropped_and_counted(backend):
    class AllBroken(SandboxAdapter):
        def make_sandbox(self):
            raise OSError("env server unreachable")

    adapter = AllBroken(**_adapter().options())
    stats = EpisodeStats()
    groups = play_episodes(backend, adapter, [next(adapter.tasks(0))], 2, SamplingParams(max_new_tokens=4), version=0, stats=stats)
    assert groups == [] and stats.dropped_groups == 1 and stats.failed == 2


def test_turn_and_context_limits_end_episodes_with_the_forfeit_outcome(backend):
    adapter = _adapter()
    task = next(adapter.tasks(0))
    stats = EpisodeStats()
    (group,) = play_episodes(backend, adapter, [task], 2, SamplingParams(max_new_tokens=4, seed=1), version=0, stats=stats, max_len=260)
    for r in group:
        assert r.meta.extra["aborted"] in ("turn_limit", "context_limit")
        assert len(r.meta.prompt_ids) + len(r.meta.response_ids) <= 260  # never rejected as too_long
    assert stats.aborted == 2


def test_multi_turn_update_moves_the_rewarded_episode_up(tiny, backend):
    adapter = _adapter(metadata_spec="grpo:turn_mask+adv_norm@batch")
    groups = play_episodes(backend, adapter, [next(adapter.tasks(5))], 2, SamplingParams(max_new_tokens=5, seed=2), version=0)
    good, bad = groups[0]
    # same records, rewards forced apart: GRPO must raise log pi of the first episode's actions
    g = [good.model_copy(update={"reward": 1.0}), bad.model_copy(update={"reward": 0.0})]
    learner = Learner(tiny, lr=3e-3, precision="fp32")

    def score(t):
        with torch.no_grad():
            lp = learner._token_logprobs(learner._rows([[t, t]]))
        return float(lp[: len(t.meta.response_ids)].sum())

    before = score(g[0]), score(g[1])
    for _ in range(3):
        learner.step([g])
    after = score(g[0]), score(g[1])
    assert after[0] > before[0] and after[1] < before[1]
