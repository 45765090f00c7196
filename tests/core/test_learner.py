"""GRPO learner on a tiny random Llama: advantages, importance weights, KL, the update's direction."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from echo2sdk.core.learner import Learner, group_advantages  # noqa: E402
from echo2sdk.core.records import Meta, Trajectory  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny-random")


def test_group_advantages_are_normalized():
    a = group_advantages([1.0, 0.0, 0.0, 1.0], eps=1e-6)
    assert a == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5], eps=1e-4) == [0.0, 0.0]  # no signal in a uniform group


def _group(gid, responses, rewards, sampler_lp=None):
    out = []
    for resp, r in zip(responses, rewards):
        lp = sampler_lp(resp) if sampler_lp else [-1.0] * len(resp)
        meta = Meta(group_id=gid, prompt_ids=(5, 6, 7), response_ids=tuple(resp), logprobs=tuple(lp))
        out.append(Trajectory(prompt="p", response="y", reward=r, version=0, meta=meta))
    return out


def _logp(learner, responses):
    rows = learner._rows([_group("g", responses, [0.0] * len(responses))])
    with torch.no_grad():
        flat = learner._token_logprobs(rows).tolist()
    out, i = [], 0
    for r in responses:
        out.append(sum(flat[i : i + len(r)]))
        i += len(r)
    return out


def test_token_logprobs_match_a_plain_forward(tiny):
    lr = Learner(tiny, lr=1e-3, precision="fp32")
    resp = [11, 12, 13]
    (got,) = _logp(lr, [resp])
    ids = torch.tensor([[5, 6, 7] + resp], device=lr.device)
    with torch.no_grad():
        logits = lr.model(ids).logits[0].float()
    ref = sum(torch.log_softmax(logits[2 + i], -1)[t].item() for i, t in enumerate(resp))
    assert got == pytest.approx(ref, abs=1e-4)


def test_update_moves_probability_towards_rewarded_responses(tiny):
    lr = Learner(tiny, lr=3e-3, precision="fp32", micro_batch=2)
    good, bad = [21, 22, 23, 24], [31, 32, 33, 34]
    before = _logp(lr, [good, bad])
    for _ in range(3):
        st = lr.step([_group("g", [good, bad, good, bad], [1.0, 0.0, 1.0, 0.0])])
    after = _logp(lr, [good, bad])
    assert after[0] > before[0] and after[1] < before[1]
    assert st.tokens == 16 and st.t_train_s > 0 and math.isfinite(st.loss)
    assert st.t_forward_s + st.t_backward_s + st.t_optim_s <= st.t_train_s


def test_importance_weight_is_truncated_at_C(tiny):
    lr = Learner(tiny, lr=1e-4, precision="fp32", is_cap=2.0)
    # sampler log-probs far below the learner's: pi_old / pi_sampler is huge, so w = C exactly
    st = lr.step([_group("g", [[21, 22], [31, 32]], [1.0, 0.0], sampler_lp=lambda r: [-40.0] * len(r))])
    assert st.is_weight_mean == pytest.approx(2.0) and st.is_truncated_frac == 1.0
    # sampler == learner: w = 1 and nothing is truncated
    exact = _logp_tokens(lr, [[21, 22], [31, 32]])
    st = lr.step([_group("g", [[21, 22], [31, 32]], [1.0, 0.0], sampler_lp=lambda r: exact[tuple(r)])])
    assert st.is_weight_mean == pytest.approx(1.0, abs=1e-4) and st.is_truncated_frac == 0.0


def test_a_step_without_the_importance_weight_is_a_step_with_pi_sampler_equal_to_pi_old(tiny):
    """importance_weight=False ignores the sampler's log-probs: the same update as sampler log-probs = log pi_old
    (w_t = 1), and not the update the weight makes of stale sampler log-probs (w_t from 1 to C, token by token;
    a w_t equal on every token would not show: Adam's update does not change with the gradient's scale)."""
    responses, rewards = [[21, 22, 23], [31, 32], [41, 42, 43, 44], [51]], [1.0, 0.0, 0.5, 0.0]

    def stepped(importance_weight, stale):
        lr = Learner(tiny, lr=1e-2, precision="fp32", micro_batch=2, updates_per_step=2,
                     importance_weight=importance_weight)
        old = _logp_tokens(lr, responses)  # log pi_old: the step's first forward computes the same
        shift = (lambda t: 0.3 * (t % 4)) if stale else (lambda t: 0.0)  # pi_old / pi_sampler = e^{0.3 (t mod 4)}
        sampler = lambda r: [x - shift(t) for t, x in enumerate(old[tuple(r)])]  # noqa: E731
        st = lr.step([_group("g", responses, rewards, sampler_lp=sampler)])
        return st, {k: v.clone() for k, v in lr.model.state_dict().items()}

    off, w_off = stepped(False, stale=True)
    same, w_same = stepped(True, stale=False)
    on, w_on = stepped(True, stale=True)
    assert (off.is_weight_mean, off.is_truncated_frac) == (1.0, 0.0)
    assert same.is_weight_mean == pytest.approx(1.0, abs=1e-5) and on.is_weight_mean > 1.2 and on.is_truncated_frac > 0
    assert off.loss == pytest.approx(same.loss, rel=1e-5, abs=1e-7)
    assert all(torch.allclose(w_off[k], w_same[k], atol=1e-6) for k in w_off)
    assert not all(torch.allclose(w_off[k], w_on[k], atol=1e-6) for k in w_off)


def _logp_tokens(learner, responses):
    rows = learner._rows([_group("g", responses, [0.0] * len(responses))])
    with torch.no_grad():
        flat = learner._token_logprobs(rows).tolist()
    out, i = {}, 0
    for r in responses:
        out[tuple(r)] = [min(x, 0.0) for x in flat[i : i + len(r)]]
        i += len(r)
    return out


def test_kl_to_reference_starts_at_zero_and_grows(tiny):
    lr = Learner(tiny, lr=3e-3, precision="fp32", beta=0.1)
    g = _group("g", [[21, 22, 23], [31, 32, 33]], [1.0, 0.0])
    first = lr.step(g and [g])
    assert first.kl == pytest.approx(0.0, abs=1e-6)
    second = lr.step([g])
    assert second.kl > 0


def test_checkpoint_is_plain_hugging_face(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lr = Learner(tiny, lr=1e-3, precision="bf16")
    lr.step([_group("g", [[21, 22], [31, 32]], [1.0, 0.0])])
    lr.save(str(tmp_path / "ckpt"), tokenizer_from=tiny)
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    sd = lr.model.state_dict()
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k].cpu()), k


def test_shared_prompt_logprobs_match_per_row_forward(tiny):
    """A group's prompt runs once; the result must equal running every row on its own."""
    lr = Learner(tiny, lr=1e-3, precision="fp32")
    responses = [[11, 12, 13, 2], [14], [15, 16], [17, 18, 19, 20, 21]]
    rows = lr._rows([_group("g", responses, [1.0, 0.0, 1.0, 0.0])])
    with torch.no_grad():
        got = lr._token_logprobs(rows).tolist()
        want = []
        for r in responses:
            logits = lr.model(torch.tensor([[5, 6, 7] + r], device=lr.device)).logits[0].float()
            want += [torch.log_softmax(logits[2 + i], -1)[t].item() for i, t in enumerate(r)]
    assert got == pytest.approx(want, abs=1e-4)


def test_gradient_checkpointing_runs_every_row_and_agrees(tiny):
    """Without a KV cache (gradient checkpointing) each row runs prompt + response in one pass: same log-probs,
    same update."""
    responses = [[11, 12, 13, 2], [14], [15, 16], [17, 18, 19, 20, 21]]
    shared = Learner(tiny, lr=1e-3, precision="fp32")
    full = Learner(tiny, lr=1e-3, precision="fp32", gradient_checkpointing=True)
    rows = shared._rows([_group("g", responses, [1.0, 0.0, 1.0, 0.0])])
    with torch.no_grad():
        assert full._token_logprobs(rows).tolist() == pytest.approx(shared._token_logprobs(rows).tolist(), abs=1e-4)
    a = shared.step([_group("g", responses, [1.0, 0.0, 1.0, 0.0])])
    b = full.step([_group("g", responses, [1.0, 0.0, 1.0, 0.0])])
    assert b.loss == pytest.approx(a.loss, abs=1e-6) and b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)


def test_unit_plan_deals_prompt_units_round_robin_and_pads():
    from echo2sdk.core.learner import _Row, unit_plan

    def row(prompt, live=True):
        return _Row(ids=[*prompt, 9, 9], start=len(prompt), mask=[1.0 if live else 0.0] * 2, sampler_logprobs=[-1.0] * 2,
                    advantage=0.0)

    rows = [row((1,)), row((1,)), row((1,)), row((2,)), row((2,), live=False), row((3,))]
    assert unit_plan(rows, micro_batch=2) == [[0, 1], [2], [3], [5]]  # row 4 carries no loss
    assert unit_plan(rows, micro_batch=2, rank=0, world=3) == [[0, 1], [5]]
    assert unit_plan(rows, micro_batch=2, rank=2, world=3) == [[3], None]  # a zero-weight unit keeps step
    assert unit_plan([], micro_batch=2, rank=1, world=2) == []


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_step_loss_is_the_grpo_loss_of_its_batch(tiny, loss_type):
    """Learner.step computes core/grpo.py's L on its batch: same value as grpo_loss on a padded copy of it."""
    from echo2sdk.core.grpo import grpo_loss

    responses = [[11, 12, 13, 2], [14], [15, 16], [17, 18, 19, 20, 21]]
    group = _group("g", responses, [1.0, 0.0, 1.0, 0.0])
    lr = Learner(tiny, lr=1e-3, precision="fp32", micro_batch=2, loss_type=loss_type, max_completion_length=8)
    rows = lr._rows([group])
    with torch.no_grad():
        flat = lr._token_logprobs(rows)
    logp, mask = torch.zeros(4, 5), torch.zeros(4, 5)
    i = 0
    for b, r in enumerate(responses):
        logp[b, : len(r)], mask[b, : len(r)] = flat[i : i + len(r)], 1.0
        i += len(r)
    want = grpo_loss(logp, logp, torch.full((4, 5), -1.0), torch.tensor([r.advantage for r in rows]), mask,
                     loss_type=loss_type, epsilon=0.2, is_cap=2.0, max_completion_length=8).item()
    assert lr.step([group]).loss == pytest.approx(want, rel=1e-5)


def test_second_update_of_a_step_is_clipped_against_the_steps_pi_old(tiny):
    """pi_old stays the policy at the step's start: r_t = 1 on the first update (the clip never acts), the second
    sees the first's change (a large step moves r_t out of [1 - eps, 1 + eps] on some tokens)."""
    responses = [[21, 22, 23, 24], [31, 32, 33, 34]] * 2
    group = _group("g", responses, [1.0, 0.0, 1.0, 0.0])
    one = Learner(tiny, lr=0.05, precision="fp32", updates_per_step=1).step([group])
    two = Learner(tiny, lr=0.05, precision="fp32", updates_per_step=2).step([group])
    assert one.clip_frac == 0.0
    assert two.clip_frac > 0.0


def test_offline_steps_change_nothing_and_the_schedule_position_is_state(tiny):
    lr = Learner(tiny, lr=1e-2, precision="fp32", lr_scheduler="linear", warmup_steps=2, total_steps=4)
    group = _group("g", [[21, 22], [31, 32]], [1.0, 0.0])
    before = {k: v.clone() for k, v in lr.model.state_dict().items()}
    with lr.offline():
        assert lr.step([group]).lr == 0.0
    assert all(torch.equal(before[k], v) for k, v in lr.model.state_dict().items())
    assert lr.schedule_state()["steps_done"] == 0
    assert [lr.step([group]).lr for _ in range(3)] == pytest.approx([5e-3, 1e-2, 1e-2])  # warm-up, then linear
    other = Learner(tiny, lr=1e-2, precision="fp32", lr_scheduler="linear", warmup_steps=2, total_steps=4)
    other.load_schedule_state(lr.schedule_state())
    assert other.step([group]).lr == pytest.approx(5e-3) == lr.step([group]).lr  # a resumed learner goes on


def test_lr_scale_multiplies_one_steps_rate_and_moves_the_weights_less(tiny):
    """A partial batch's step (learner.partial_lr): the scheduled rate times lr_scale for that step only."""
    group = _group("g", [[21, 22], [31, 32]], [1.0, 0.0])
    full, half = (Learner(tiny, lr=1e-2, precision="fp32", updates_per_step=1) for _ in range(2))
    before = {k: v.clone() for k, v in full.model.state_dict().items()}
    assert half.step([group], lr_scale=0.5).lr == pytest.approx(5e-3) and full.step([group]).lr == pytest.approx(1e-2)
    moved = {name: sum(float((lr.model.state_dict()[k] - v).abs().sum()) for k, v in before.items())
             for name, lr in (("full", full), ("half", half))}
    assert 0 < moved["half"] < moved["full"]
    assert half.step([group]).lr == pytest.approx(1e-2)  # the next step is back at the scheduled rate


def test_the_fused_adamw_takes_the_loops_step(tiny):
    """One process uses torch's fused AdamW (core/learner_setup.adamw): three steps land where the per-parameter
    loop's do, to float rounding; a distributed learner (FSDP's DTensors) keeps the loop."""
    groups = [_group("g", [[21, 22], [31, 32]], [1.0, 0.0]), _group("h", [[41, 42, 43], [51]], [0.0, 1.0])]
    fused, loop = (Learner(tiny, lr=1e-2, weight_decay=0.1, precision="fp32") for _ in range(2))
    loop.opt = torch.optim.AdamW(loop.model.parameters(), lr=1e-2, weight_decay=0.1)
    assert fused.opt.defaults["fused"] is True and not loop.opt.defaults["fused"]
    before = {k: v.clone() for k, v in fused.model.state_dict().items()}
    for _ in range(3):
        assert fused.step(groups).loss == pytest.approx(loop.step(groups).loss, rel=1e-5, abs=1e-7)
    a, b = fused.model.state_dict(), loop.model.state_dict()
    moved = max(float((a[k] - before[k]).abs().max()) for k in a)
    assert moved > 1e-3 and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6 * max(moved, 1.0)


def test_a_saved_loop_state_loads_into_the_fused_learner_and_stays_fused(tiny):
    """A checkpoint written before the fused AdamW (its groups say fused None) resumes with the moments and the step
    it saved, and the learner keeps its own kernel: torch's load_state_dict would take the saved group's."""
    group = _group("g", [[21, 22], [31, 32]], [1.0, 0.0])
    old = Learner(tiny, lr=1e-2, precision="fp32")
    old.opt = torch.optim.AdamW(old.model.parameters(), lr=1e-2, fused=False)
    old.step([group])
    saved = old.optimizer_state()
    assert all(g["fused"] is False for g in saved["param_groups"])
    new = Learner(tiny, lr=1e-2, precision="fp32")
    new.load_optimizer_state(saved)
    assert all(g["fused"] is True for g in new.opt.param_groups)
    state = new.optimizer_state()["state"]
    assert {float(v["step"]) for v in state.values()} == {1.0}  # one update a step (the default)
    name = next(iter(state))
    assert torch.equal(state[name]["exp_avg"], saved["state"][name]["exp_avg"])
    new.step([group])  # and it steps


def _episodes(n=4, turns=3, seed=0):
    """A group of n multi-turn records of different lengths: actions (loss mask 1) between user turns (0)."""
    import random

    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        ids, mask = [], []
        for t in range(turns + rnd.randrange(2)):
            if t:
                u = [rnd.randrange(10, 2000) for _ in range(rnd.randint(3, 6))]
                ids, mask = ids + u, mask + [0] * len(u)
            a = [rnd.randrange(10, 2000) for _ in range(rnd.randint(2, 4))]
            ids, mask = ids + a, mask + [1] * len(a)
        meta = Meta(group_id=f"g{seed}", prompt_ids=(5, 6, 7, 8 + seed), response_ids=tuple(ids), loss_mask=tuple(mask),
                    logprobs=tuple(-rnd.uniform(0.5, 3.0) if m else 0.0 for m in mask))
        out.append(Trajectory(prompt="p", response="y", reward=rnd.random(), version=0, meta=meta))
    return out


def test_unit_plan_cuts_a_prompts_rows_to_the_token_budget_and_recomputes_longer_rows():
    from echo2sdk.core.learner import ONE_PASS, RECOMPUTE, SHARED, _Row, pass_plan, unit_plan, unit_tokens

    def row(prompt, n):
        return _Row(ids=[*prompt, *[9] * n], start=len(prompt), mask=[1.0] * n, sampler_logprobs=[-1.0] * n,
                    advantage=0.0)

    rows = [row((1, 1), 3), row((1, 1), 3), row((1, 1), 5), row((1, 1), 12), row((1, 1), 2), row((2,), 4)]
    assert unit_tokens(rows, [0, 1, 2]) == 2 + 3 * 5  # the prompt once, every response padded to the longest
    assert unit_plan(rows, micro_batch=8, token_budget=None) == [[0, 1, 2, 3, 4], [5]]
    # 2 + 2 x 3 fits in 10, 2 + 3 x 5 does not; row 3 alone (2 + 12) is over the budget: a unit of its own
    assert unit_plan(rows, micro_batch=8, token_budget=10) == [[0, 1], [2], [3], [4], [5]]
    # a unit of one row runs in one pass; the row over the budget recomputes
    assert pass_plan(rows, micro_batch=8, token_budget=10) == [SHARED, ONE_PASS, RECOMPUTE, ONE_PASS, ONE_PASS]
    assert pass_plan(rows, micro_batch=8, token_budget=None) == [SHARED, ONE_PASS]
    # two ranks: slots ([0, 1] | [2]), ([3] | [4]), ([5] | dummy): every rank runs a slot the same way
    assert unit_plan(rows, micro_batch=8, rank=1, world=2, token_budget=10) == [[2], [4], None]
    assert pass_plan(rows, micro_batch=8, world=2, token_budget=10) == [SHARED, RECOMPUTE, ONE_PASS]


@pytest.mark.parametrize("budget", [24, 1], ids=["cut-and-recompute", "every-row-recomputed"])
def test_token_budget_takes_the_same_step_as_whole_units(tiny, budget):
    """Cutting a group's multi-turn rows into units that fit the budget, and running the rows longer than it with
    gradient checkpointing, changes neither the loss, the statistics nor the gradient (KL on, two updates)."""
    kw = dict(lr=1e-3, precision="fp32", beta=0.1, updates_per_step=2, loss_type="grpo", micro_batch=8)
    groups = [_episodes(seed=0), _episodes(seed=1)[:3]]
    whole = Learner(tiny, token_budget=None, **kw)
    cut = Learner(tiny, token_budget=budget, **kw)
    rows = cut._rows(groups)
    from echo2sdk.core.learner import ONE_PASS, RECOMPUTE, pass_plan, unit_plan

    assert len(unit_plan(rows, 8)) == 2 < len(unit_plan(rows, 8, token_budget=budget))
    modes = pass_plan(rows, 8, token_budget=budget)
    assert RECOMPUTE in modes and (budget == 1 or ONE_PASS in modes)
    a, b = whole.step(groups), cut.step(groups)
    assert b.tokens == a.tokens
    assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-8)
    assert b.kl == pytest.approx(a.kl, rel=1e-4, abs=1e-9)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
    assert [s.gap for s in b.audit_sums] == pytest.approx([s.gap for s in a.audit_sums], rel=1e-5)
    scale = max(p.grad.abs().max().item() for p in whole.model.parameters())
    for (name, p), q in zip(whole.model.named_parameters(), cut.model.parameters()):
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * scale, name
        assert torch.allclose(p, q, atol=1e-6), name


def test_a_row_over_the_token_budget_keeps_only_its_layer_inputs_for_the_backward(tiny):
    """What the decoder keeps for a unit's backward pass: every layer's activations, or with the row recomputed
    (over the token budget) only each layer's input (counted: tensors saved for backward inside the decoder,
    parameters aside, plus the inputs gradient checkpointing holds)."""
    group = [_episodes(n=1, turns=8)[0]]

    def kept_bytes(learner):
        rows = learner._rows([group])
        params = {p.untyped_storage().data_ptr() for p in learner.model.parameters()}
        inside, seen = [False], {}

        def pack(t):
            if inside[0] and t.untyped_storage().data_ptr() not in params:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        def layer_input(m, args):
            if m.gradient_checkpointing and torch.is_grad_enabled():
                seen[args[0].untyped_storage().data_ptr()] = args[0].untyped_storage().nbytes()

        decoder = learner.model.get_decoder()
        hooks = [decoder.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True)),
                 decoder.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))]
        hooks += [layer.register_forward_pre_hook(layer_input) for layer in decoder.layers]
        coef = torch.cat([torch.tensor(r.mask) for r in rows]).to(learner.device)
        (mode,) = pass_plan(rows, learner.micro_batch, token_budget=learner.token_budget)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            learner._unit_loss(rows, coef, {}, 0, mode)
        for h in hooks:
            h.remove()
        return sum(seen.values())

    from echo2sdk.core.learner import pass_plan

    kept = kept_bytes(Learner(tiny, lr=1e-3, precision="fp32", token_budget=None))
    recomputed = kept_bytes(Learner(tiny, lr=1e-3, precision="fp32", token_budget=8))
    assert 0 < recomputed * 4 < kept


def test_token_budget_must_be_positive(tiny):
    with pytest.raises(ValueError, match="token_budget must be >= 1 or None, got 0"):
        Learner(tiny, lr=1e-3, token_budget=0)
