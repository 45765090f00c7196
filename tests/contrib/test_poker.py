"""echo2-poker on the real pettingzoo/rlcard no-limit hold'em: the seat's view, opponents, chips,
fallbacks, re-deals, the LLM opponent, and conformance with a real (tiny) model."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("echo2_poker")
pytest.importorskip("pettingzoo")

from echo2_poker import hand_category, preflop_strength  # noqa: E402
from echo2_poker.cards import card_text  # noqa: E402

from echo2sdk.adapters import SandboxAdapter  # noqa: E402
from echo2sdk.errors import ConfigError, NameNotFound  # noqa: E402
from echo2sdk.testing import MockBackend, check_adapter  # noqa: E402


def _adapter(env="poker://nlhe_headsup_v1", **env_options):
    return SandboxAdapter(env=env, env_options=env_options or None, max_turns=12)


def _random_hand(adapter, seed, rng):
    """Play one hand with random legal replies; return (episode, state user messages, steps)."""
    ep = adapter.start(next(adapter.tasks(seed)), 0)
    states, steps = [ep.messages[-1]["content"]], []
    while True:
        st = ep.step(f"<answer>{rng.choice(ep.obs.legal)}</answer>")
        steps.append(st)
        if st.done:
            return ep, states, steps
        states.append(st.observation)


@pytest.mark.parametrize("env", ["poker://nlhe_headsup_v1", "poker://nlhe_6max_v1"])
def test_prompts_show_the_seat_s_own_cards_and_never_another_seat_s(env):
    adapter = _adapter(env, opponent="loose_aggressive")
    rng = random.Random(0)
    for seed in range(12):
        ep, states, _ = _random_hand(adapter, seed, rng)
        game = ep.sandbox._raw.game
        mine = [card_text(c.get_index()) for c in game.players[ep.sandbox.seat].hand]
        others = [card_text(c.get_index()) for p in game.players if p.player_id != ep.sandbox.seat for c in p.hand]
        for text in states:
            assert f"Your cards: {mine[0]} {mine[1]}." in text
            assert not any(card in text for card in others), (others, text)


def test_state_has_pot_stacks_history_and_legal_actions():
    adapter = _adapter(opponent="calling_station")
    ep = adapter.start(next(adapter.tasks(1)), 0)
    s, text = ep.obs.state, ep.messages[-1]["content"]
    assert {"hand", "board", "pot", "to_call", "stack", "opponents", "history", "position", "stage"} <= s.keys()
    assert f"Pot {s['pot']}, to call {s['to_call']}, your stack {s['stack']}." in text
    assert "Legal: " + ", ".join(ep.obs.legal) + "." in text
    assert ep.obs.legal[0] == "fold" and ("check" in ep.obs.legal) != ("call" in ep.obs.legal)


def test_chips_are_zero_sum_and_the_seed_fixes_the_hand():
    rng = random.Random(1)
    adapter = _adapter(opponent="tight_aggressive")
    for seed in range(10):
        ep, _, steps = _random_hand(adapter, seed, rng)
        payoffs = ep.sandbox._raw.get_payoffs()
        assert sum(payoffs) == 0 and ep.sandbox.chips == payoffs[ep.sandbox.seat]
        assert ep.result().info["fallbacks"] == 0 and ep.result().info["chips"] == sum(s.reward for s in steps)
    task = next(adapter.tasks(7))
    a, b = adapter.start(task, 0), adapter.start(task, 1)
    assert a.messages == b.messages and a.sandbox.hand_seed == b.sandbox.hand_seed


def test_calling_station_never_folds_or_raises():
    rng = random.Random(2)
    adapter = _adapter(opponent="calling_station")
    for seed in range(15):
        ep, _, _ = _random_hand(adapter, seed, rng)
        theirs = [a for st, p, a, _ in ep.sandbox.log if p != ep.sandbox.seat]
        assert set(theirs) <= {"check", "call"}


def test_malformed_reply_checks_or_folds_with_a_penalty():
    adapter = _adapter(opponent="calling_station")
    ep = adapter.start(next(adapter.tasks(0)), 0)
    legal = ep.obs.legal
    st = ep.step("I'd like to think about it")
    assert st.info["status"] == "unparsable" and st.info["action"] == ("check" if "check" in legal else "fold")
    res = ep.result()
    assert res.info["fallbacks"] == 1 and res.reward == pytest.approx(res.info["chips"] - 2.0)  # penalty: 1 big blind


def _scripted_hands(adapter, reply, seeds):
    """(the amount to call at the seat's first decision, the hand's result info) per hand when the seat always
    plays reply(legal actions)."""
    hands = []
    for seed in seeds:
        ep = adapter.start(next(adapter.tasks(seed)), 0)
        to_call = ep.obs.state["to_call"]
        while not ep.step(f"<answer>{reply(ep.obs.legal)}</answer>").done:
            pass
        hands.append((to_call, ep.result().info))
    return hands


def test_fold_preflop_vpip_and_their_rates_per_eval_cell():
    from echo2_poker import PokerPlugin

    from echo2sdk.adapters.evaluate import _stat

    adapter = _adapter(opponent="calling_station")
    folder = [i for _, i in _scripted_hands(adapter, lambda legal: "fold", range(8))]
    assert all(i["fold_preflop"] and i["folded"] and not i["vpip"] and not i["won"] for i in folder)
    caller = _scripted_hands(adapter, lambda legal: "call" if "call" in legal else "check", range(8))
    assert not any(i["fold_preflop"] or i["folded"] for _, i in caller)
    # the calling station only checks or calls: the seat puts chips in preflop exactly when it must call the
    # small blind's missing chip; as the big blind it checks
    assert [i["vpip"] for _, i in caller] == [to_call > 0 for to_call, _ in caller]
    assert {i["vpip"] for _, i in caller} == {True, False}
    stats = PokerPlugin().summarize(folder + [i for _, i in caller])
    assert stats["hands"] == 16 and stats["fold_preflop_rate"] == stats["fold_rate"] == 0.5
    assert stats["vpip_rate"] == sum(i["vpip"] for _, i in caller) / 16
    assert stats["win_rate"] == sum(i["won"] for _, i in caller) / 16
    assert _stat("fold_preflop_rate", 0.5) == "fold_preflop_rate 50%" and _stat("gold_diff", 3.0) == "gold_diff +3.00"


def test_free_fold_false_takes_fold_off_the_legal_actions_when_checking_is_free():
    checked = 0
    for free_fold in (True, False):
        adapter = _adapter(opponent="calling_station", free_fold=free_fold)
        for seed in range(8):
            ep = adapter.start(next(adapter.tasks(seed)), 0)
            if "check" not in ep.obs.legal:
                continue
            checked += 1
            assert ("fold" in ep.obs.legal) == free_fold
            assert ("Legal: fold," in ep.messages[-1]["content"]) == free_fold
            st = ep.step("<answer>fold</answer>")
            assert st.info["status"] == ("ok" if free_fold else "illegal")
            assert st.info["action"] == ("fold" if free_fold else "check")
    assert checked >= 4
    with pytest.raises(ConfigError, match=r"env_options.free_fold must be true or false, got 'no'"):
        _adapter(opponent="calling_station", free_fold="no").start(next(_adapter().tasks(0)), 0)


def test_a_hand_that_ends_before_the_seat_acts_is_redealt():
    # 6-max, tight opponents fold most hands: some seeds end before seat 0 acts and must be re-dealt
    adapter = _adapter("poker://nlhe_6max_v1", opponent="tight_aggressive", seat=2)
    redealt = 0
    for t, _ in zip(adapter.tasks(0), range(30)):
        ep = adapter.start(t, 0)
        redealt += ep.sandbox.hand_seed != t.info["seed"]
        assert ep.obs.legal  # the seat always has a decision
    assert redealt > 0


def test_hand_evaluator():
    assert hand_category(["Ah", "Ad", "Kc", "Ks", "2d"]) == 2
    assert hand_category(["5h", "4d", "3c", "2s", "Ad"]) == 4  # the wheel
    assert hand_category(["9h", "8h", "7h", "6h", "5h", "Ac"]) == 8
    assert hand_category(["Kh", "Kd", "Kc", "2s", "2d"]) == 6
    assert preflop_strength(["Ah", "Ad"]) > preflop_strength(["Kh", "Qh"]) > preflop_strength(["7d", "2c"])


def test_bad_options_are_named():
    with pytest.raises(NameNotFound, match=r"unknown poker env 'nlhe_headsup_v2'.*Did you mean 'nlhe_headsup_v1'"):
        SandboxAdapter(env="poker://nlhe_headsup_v2")
    with pytest.raises(NameNotFound, match=r"unknown poker opponent 'calling_statoin'.*Did you mean 'calling_station'"):
        _adapter(opponent="calling_statoin")
    with pytest.raises(ConfigError, match=r"env_options.seat must be an integer in \[0, 5\], got .*env_options.seat=6"):
        _adapter("poker://nlhe_6max_v1", seat=6)


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch")
    from echo2sdk.weights import resolve_model

    return resolve_model("tiny-random")


def test_llm_opponent_plays_through_a_backend(tiny):
    adapter = _adapter(opponent="llm", opponent_model=tiny, opponent_max_tokens=4)
    rng = random.Random(3)
    acted = 0
    for seed in range(3):
        ep, _, _ = _random_hand(adapter, seed, rng)
        llm = next(iter(ep.sandbox.policies.values()))
        acted += llm.replies
        assert llm.fallbacks == llm.replies  # a random tiny model never answers well: every reply falls back
    assert acted > 0


@pytest.mark.parametrize("env", ["poker://nlhe_headsup_v1", "poker://nlhe_6max_v1"])
def test_poker_conformance_with_a_real_model(tiny, env):
    from echo2sdk.backends.hf import HFBackend

    with HFBackend(tiny) as backend:
        report = check_adapter(SandboxAdapter(env=env, max_action_tokens=6), backend=backend, n=2, groups=2)
    assert report["records"] == 4 and report["failed"] == 0


def test_describe_hand_names_the_seats_own_hand_in_the_state():
    from echo2_poker.cards import describe_hand

    # preflop_strength: AKs 0.775, QJo 0.615, 87s 0.475, 72o 0.225
    assert describe_hand(["Ah", "Kh"], []) == "premium starting hand"
    assert describe_hand(["Qc", "Jd"], []) == "strong starting hand"
    assert describe_hand(["8c", "7c"], []) == "playable starting hand"
    assert describe_hand(["7h", "2c"], []) == "weak starting hand"
    assert describe_hand(["7h", "2c"], ["7c", "Kd", "2s"]) == "two pair"
    assert describe_hand(["7h", "2c"], ["Ac", "Kd", "Js"]) == "high card"
    assert describe_hand(["Ah", "Kc"], ["7c", "7d", "2s"]) == "pair on the board only"
    assert describe_hand(["7h", "Kc"], ["7c", "7d", "2s"]) == "three of a kind"
    plain, described = _adapter(opponent="calling_station"), _adapter(opponent="calling_station", describe_hand=True)
    for seed in range(6):
        a = plain.start(next(plain.tasks(seed)), 0).messages[-1]["content"]
        b = described.start(next(described.tasks(seed)), 0)
        lines = b.messages[-1]["content"].splitlines()
        assert lines[2] == f"You hold: {describe_hand(b.obs.state['hand'], b.obs.state['board'])}."
        assert "\n".join(lines[:2] + lines[3:]) == a  # the same deal, one line more
        assert "You hold" not in a
    from echo2_poker.table import PokerSandbox

    table = PokerSandbox(2, {"opponent": "calling_station", "describe_hand": True})
    try:
        table.reset(5)
        # the other seat's view (an LLM opponent's prompt) stays as it was
        assert "hand_strength" in table._view(0)[0] and "hand_strength" not in table._view(1)[0]
    finally:
        table.close()
    with pytest.raises(ConfigError, match=r"env_options.describe_hand must be true or false, got 1"):
        _adapter(describe_hand=1).start(next(_adapter().tasks(0)), 0)


def test_bench_poker_strategies_plays_the_eval_hands(capsys):
    """bench/poker_strategies.py: scripted seats on echo2 eval's held-out deals, a line per (opponent, strategy)
    and per strategy over the mixture, measured against the fold baseline."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / "bench" / "poker_strategies.py"
    spec = importlib.util.spec_from_file_location("poker_strategies", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--hands", "12"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    n = 3 * len(bench.STRATEGIES)
    cells, mixture = lines[:n], {d["strategy"]: d for d in lines[n:]}
    assert {(d["opponent"], d["strategy"]) for d in cells} == {(o, s) for o in bench.RULE_BASED for s in bench.STRATEGIES}
    assert mixture["fold"]["vs_fold"] == 0.0 and set(mixture) == set(bench.STRATEGIES)
    by = {(d["opponent"], d["strategy"]): d for d in cells}
    assert by[("calling_station", "call")]["fold_preflop_rate"] == 0.0  # never folds
    assert by[("loose_aggressive", "fold")]["chips_per_hand"] < 0  # folding loses the blinds
    shove = by[("calling_station", "all_in")]  # every hand an all-in the station calls: the luck allin_ev removes
    assert shove["allin_ev_sd"] < shove["chips_sd"] and by[("calling_station", "fold")]["allin_ev_sd"] == by[
        ("calling_station", "fold")]["chips_sd"]
    # echo2 eval's hands: the held-out stream, which no training run with run.seed = 0 deals
    from echo2sdk.adapters.evaluate import HELD_OUT_SEED, held_out_tasks

    adapter = _adapter(opponent="tight_aggressive")
    held_out = held_out_tasks(adapter, 12, 0)
    assert bench.eval_deals("tight_aggressive", 12, 0) == [t.info["seed"] for t in held_out]
    assert all(t.id.startswith(f"poker-{HELD_OUT_SEED}-") for t in held_out)
    train = adapter.tasks(0)  # a run with run.seed = 0: its first 200 deals
    assert not {t.info["seed"] for t in held_out} & {next(train).info["seed"] for _ in range(200)}
    # the push/fold curriculum: only the strategies legal there, each deciding preflop only
    bench.main(["--hands", "12", "--preflop", "push_fold", "--postflop", "tight_aggressive"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [d["strategy"] for d in lines[:3]] == list(bench.PUSH_FOLD) and len(lines) == 12
    assert all(d["preflop"] == "push_fold" and d["postflop"] == "tight_aggressive" for d in lines)
    bench.main(["--hands", "12", "--preflop", "push_fold", "--paired"])  # shove vs fold on the same deals
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(d["opponent"], d["hands"]) for d in lines] == [
        (o, h) for o in bench.RULE_BASED for h in ("premium_or_strong", "playable_or_weak")]
    assert sum(d["deals"] for d in lines[:2]) == 12 and all(0 <= d["shove_beats_fold"] <= 1 for d in lines)
    with pytest.raises(SystemExit):
        bench.main(["--paired"])


def test_postflop_rule_plays_the_seats_hand_from_the_flop_on():
    """env_options.postflop: the model decides preflop only; the named rule plays the seat's postflop streets (its
    actions are in the hand's history), and the hand's reward still arrives at the model's last step."""
    from echo2_poker.opponents import CallingStation
    from echo2_poker.table import PokerSandbox

    rng, reached_flop = random.Random(0), 0
    for postflop in ("calling_station", "tight_aggressive"):
        adapter = _adapter(opponent="loose_aggressive", postflop=postflop)  # it bets: the rule folds some hands
        for seed in range(16):
            ep, states, steps = _random_hand(adapter, seed, rng)
            assert all("Board: -." in text for text in states)  # every state the model saw was preflop
            log = ep.sandbox.log
            mine_postflop = [name for stage, player, name, _ in log if player == ep.sandbox.seat and stage != "preflop"]
            if mine_postflop:
                reached_flop += 1
                if postflop == "calling_station":  # the station's rule: never a fold or a raise
                    assert set(mine_postflop) <= {"check", "call"}
            # every chip of the hand, the rule's streets included, reached the model's steps: rlcard's own payoff
            assert sum(st.reward for st in steps) == pytest.approx(ep.sandbox._raw.get_payoffs()[ep.sandbox.seat])
            summary = ep.sandbox.summary()
            assert summary["decisions"] == len(steps)  # the model's decisions only
            assert summary["folded"] == any(st.info["action"] == "fold" for st in steps)  # not the rule's folds
    assert reached_flop >= 8
    # the rule sees the seat's own view: TightAggressive postflop folds air to a bet, the station never does
    table = PokerSandbox(2, {"opponent": "loose_aggressive", "postflop": "tight_aggressive"})
    try:
        folds = 0
        for seed in range(40):
            obs = table.reset(seed)
            while obs is not None:
                obs = table.step(CallingStation().act(obs.state, obs.legal, rng)).observation
            folds += any(p == 0 and n == "fold" and st != "preflop" for st, p, n, _ in table.log)
        assert folds >= 1
    finally:
        table.close()
    with pytest.raises(ConfigError, match=r"env_options.postflop must be one of model, calling_station, .*got 'shark'"):
        _adapter(postflop="shark").start(next(_adapter().tasks(0)), 0)


def test_push_fold_narrows_the_seats_preflop_choices_to_fold_or_all_in(monkeypatch):
    from echo2_poker.opponents import LooseAggressive
    from echo2_poker.table import PokerSandbox

    seen = set()
    adapter = _adapter(opponent="mixed", preflop="push_fold", free_fold=False, postflop="tight_aggressive")
    for seed in range(24):
        ep = adapter.start(next(adapter.tasks(seed)), 0)
        legal = ep.obs.legal
        seen.add(legal)
        assert legal in (("fold", "all_in"), ("check", "all_in")), legal
        assert "Legal: " + ", ".join(legal) + "." in ep.messages[-1]["content"]
        st = ep.step("<answer>raise_pot</answer>")  # rlcard's other actions are illegal now: the fallback plays
        assert st.info["status"] == "illegal" and st.info["action"] == ("check" if "check" in legal else "fold")
    assert seen == {("fold", "all_in"), ("check", "all_in")}
    # only the model's seat is narrowed, and only preflop: what the opponent's policy is offered keeps raises
    import echo2_poker.table as table_module

    offered = []

    class Recorder(LooseAggressive):
        def act(self, state, legal, rng):
            offered.append((state["stage"], tuple(legal)))
            return super().act(state, legal, rng)

    monkeypatch.setattr(table_module, "make_opponent", lambda *a: Recorder())
    table = PokerSandbox(2, {"opponent": "loose_aggressive", "preflop": "push_fold"})
    try:
        for seed in range(12):
            obs = table.reset(seed)
            while obs is not None:
                obs = table.step("all_in" if "all_in" in obs.legal else obs.legal[0]).observation
    finally:
        table.close()
    assert any(stage == "preflop" and "raise_pot" in legal for stage, legal in offered), offered
    monkeypatch.undo()
    # facing an all-in the seat may call it
    table = PokerSandbox(2, {"opponent": "calling_station", "preflop": "push_fold"})
    try:
        obs = table.reset(3)
        assert "call" not in obs.legal and "all_in" in obs.legal
        game = table._raw.game  # the other seat raised all in: rlcard offers fold and call only
        game.players[1].in_chips, game.players[1].remained_chips, game.round.raised[1] = 100, 0, 100
        assert table._view(0)[1] == ("fold", "call")
    finally:
        table.close()
    # a group's answers on one deal: the same choice gets exactly the same reward (opponents' draws and the
    # preflop runouts are seeded by the deal), so GRPO's advantage is the chosen action's value on that hand
    adapter = _adapter(opponent="mixed", preflop="push_fold", reward="allin_ev", postflop="tight_aggressive")
    differs = 0
    for seed in range(8):
        task = next(adapter.tasks(seed))
        rewards = {}
        for action in ("all_in", "fold", "all_in", "fold"):
            ep = adapter.start(task, 0)
            total, st = 0.0, None
            while st is None or not st.done:
                legal = ep.obs.legal
                st = ep.step(f"<answer>{action if action in legal else legal[0]}</answer>")
                total += st.reward
            rewards.setdefault(action, set()).add(total)
        assert all(len(r) == 1 for r in rewards.values()), (seed, rewards)
        differs += rewards["all_in"] != rewards["fold"]
    assert differs >= 6
    with pytest.raises(ConfigError, match=r"env_options.preflop must be one of all, push_fold, got 'shove'"):
        _adapter(preflop="shove").start(next(_adapter().tasks(0)), 0)


class ScriptedSeat(MockBackend):
    """A "model" that answers the action its name says, every turn (`echo2 eval` rows without a real model)."""

    def __init__(self, model: str, **_: object):
        super().__init__(model, answer=f"<answer>{model}</answer>")


def test_eval_compares_the_all_in_expectation_hand_by_hand(monkeypatch):
    from echo2sdk.adapters.evaluate import differences, evaluate, format_table

    opts = {"preflop": "push_fold", "reward": "allin_ev", "postflop": "tight_aggressive"}
    table = evaluate("poker://nlhe_headsup_v1", {"fold": "fold", "shove": "all_in"}, hands=40, max_new_tokens=32,
                     opponents=["calling_station", "tight_aggressive"], backend=f"{__name__}:ScriptedSeat",
                     env_options=opts)
    diffs = differences(table, "chips")["shove"]
    assert set(diffs) == {"chips", "expected_chips"}
    for opp in ("calling_station", "tight_aggressive"):
        fold, shove = table["fold"][opp], table["shove"][opp]
        assert len(fold.paired["expected_chips"]) == len(shove.paired["expected_chips"]) == 40
        assert diffs["chips"][opp].mean == pytest.approx(shove.mean - fold.mean)
        mean_ev = lambda c: sum(c.paired["expected_chips"]) / 40  # noqa: E731
        assert diffs["expected_chips"][opp].mean == pytest.approx(mean_ev(shove) - mean_ev(fold))
        # the expectation takes the board's luck out: its paired interval is the narrower one
        assert diffs["expected_chips"][opp].ci95 < diffs["chips"][opp].ci95
    text = format_table(table, env="poker://nlhe_headsup_v1", hands=40, seed=0)
    assert "shove minus fold, expected_chips per hand, paired over the same hands" in text
    # without allin_ev there is no expectation to pair: only the metric's line
    plain = evaluate("poker://nlhe_headsup_v1", {"fold": "fold", "shove": "all_in"}, hands=4, max_new_tokens=32,
                     opponents=["calling_station"], backend=f"{__name__}:ScriptedSeat", env_options={"preflop": "push_fold"})
    assert set(differences(plain, "chips")["shove"]) == {"chips"}
    # one failed hand stops the evaluation (leaving it out would shift the pairing of every later hand)
    from echo2_poker.table import PokerSandbox

    step, calls = PokerSandbox.step, []

    def third_step_breaks(self, action):
        calls.append(action)
        if len(calls) == 3:
            raise RuntimeError("the table broke")
        return step(self, action)

    monkeypatch.setattr(PokerSandbox, "step", third_step_breaks)
    with pytest.raises(RuntimeError, match="1 of 4 hands against calling_station failed: RuntimeError: the table broke"):
        evaluate("poker://nlhe_headsup_v1", {"fold": "fold"}, hands=4, max_new_tokens=32, opponents=["calling_station"],
                 backend=f"{__name__}:ScriptedSeat", env_options={"preflop": "push_fold"})


def test_worked_examples_follow_the_tables_options(caplog):
    """The two worked turns before the first state come from the table (example_turns) and are rendered like every
    state: with default options the text the serializer used to hold fixed; describe_hand adds the hand line,
    free_fold = false drops fold where checking is free, push_fold shows fold and all in preflop."""
    def shown(**options):
        ep = _adapter(opponent="calling_station", **options).start(next(_adapter().tasks(0)), 0)
        return [m["content"] for m in ep.messages[1:5]]

    fmt = "Always output exactly one of the legal actions as <answer>ACTION</answer>."
    assert shown() == [
        "Preflop. You are P1 (big blind).\nYour cards: 9c 4d. Board: -.\nPot 8, to call 4, your stack 98.\n"
        "Others: P0 stack 94.\nBetting: [preflop]; P0 raise_pot 6.\nLegal: fold, call, raise_pot, all_in.\n" + fmt,
        "<answer>fold</answer>",
        "Flop. You are P0 (small blind).\nYour cards: Kh Qh. Board: Ks 7d 2h.\nPot 4, to call 0, your stack 98.\n"
        "Others: P1 stack 98.\nBetting: [preflop]; you call 2; P1 check.\n"
        "Legal: fold, check, raise_half_pot, raise_pot, all_in.\n" + fmt,
        "<answer>raise_half_pot</answer>",
    ]
    view = shown(describe_hand=True, free_fold=False)
    assert "\nYou hold: weak starting hand.\n" in view[0] and "\nYou hold: pair.\n" in view[2]
    assert "Legal: fold, call, raise_pot, all_in." in view[0]  # facing a raise fold stays
    assert "Legal: check, raise_half_pot, raise_pot, all_in." in view[2]
    push = shown(describe_hand=True, preflop="push_fold")
    assert "Legal: fold, all_in." in push[0] and push[1] == "<answer>fold</answer>"
    assert "Your cards: As Ad." in push[2] and "You hold: premium starting hand." in push[2]
    assert "Legal: fold, all_in." in push[2] and push[3] == "<answer>all_in</answer>"
    # a renderer with no answer() cannot format them: none are shown, and a warning (once) says so
    import logging

    class Bare:
        def instructions(self, legal):
            return "Answer with an action."

        def parse(self, text, legal):
            return _adapter().renderer.parse(text, legal)

    adapter = _adapter(opponent="calling_station")
    adapter.renderer = Bare()
    with caplog.at_level(logging.WARNING, logger="echo2sdk.adapters.sandbox"):
        for seed in range(2):
            roles = [m["role"] for m in adapter.start(next(adapter.tasks(seed)), 0).messages]
            assert roles == ["system", "user"]
    assert [r.getMessage() for r in caplog.records].count(
        "poker://nlhe_headsup_v1: the env offers worked example turns but the action renderer Bare has no "
        "answer(action) to format them in: the prompt shows none") == 1


def test_the_push_fold_example_config_builds_its_curriculum():
    from pathlib import Path

    from echo2sdk.config import load_config

    cfg = load_config(Path(__file__).parents[2] / "examples" / "poker_pushfold.toml")
    assert cfg.run.out == "runs/poker_pushfold"
    assert not cfg.learner.advantages_scaled  # the better of the two recipes in docs/adapters.md
    adapter = SandboxAdapter(env=cfg.task.adapter, **cfg.task.options)
    ep = adapter.start(next(adapter.tasks(cfg.run.seed)), 0)
    assert ep.obs.legal in (("fold", "all_in"), ("check", "all_in")) and "You hold: " in ep.messages[-1]["content"]
    assert ep.sandbox.allin_ev and ep.sandbox.postflop.name == "tight_aggressive"


def test_summarize_splits_preflop_folds_by_starting_hand():
    from echo2_poker.cards import preflop_band
    from echo2_poker.plugin import PokerPlugin

    extras = [{"fold_preflop": True, "preflop_band": "weak"}] * 3 + [{"fold_preflop": False, "preflop_band": "weak"}]
    extras += [{"fold_preflop": True, "preflop_band": "premium"}, {"fold_preflop": False, "preflop_band": "strong"}]
    extras += [{"fold_preflop": False, "preflop_band": "playable"}]
    stats = PokerPlugin().summarize(extras)
    assert stats["fold_preflop_weak_rate"] == 0.75 and stats["fold_preflop_strong_rate"] == 0.5
    assert "fold_preflop_strong_rate" not in PokerPlugin().summarize(extras[:4])  # no strong hand: no rate
    adapter = _adapter(opponent="calling_station")
    for seed in range(4):
        ep = adapter.start(next(adapter.tasks(seed)), 0)
        hand = ep.obs.state["hand"]
        while not ep.step("<answer>call</answer>").done:  # illegal when checking is free: the fallback checks
            pass
        assert ep.sandbox.summary()["preflop_band"] == preflop_band(hand)  # what the record's meta.extra carries


def _play_scripted(opponent, strategy, deals, **options):
    """`strategy(state, legal)` in the model's seat of a PokerSandbox, hand by hand: (sandbox, summaries,
    rewards handed out per hand)."""
    from echo2_poker.table import PokerSandbox

    table = PokerSandbox(2, {"opponent": opponent, **options})
    summaries, rewards = [], []
    for deal in deals:
        obs, total = table.reset(deal), 0.0
        while obs is not None:
            tr = table.step(strategy(obs.state, obs.legal))
            obs, total = tr.observation, total + tr.reward
        summaries.append(table.summary())
        rewards.append(total)
    return table, summaries, rewards


def test_allin_ev_reward_is_the_chips_expectation_with_less_luck():
    """env_options.reward = allin_ev: after an all-in before the river the hand's reward is the seat's mean
    result over the boards still to come; the dealt chips stay in the summary. Over 300 all-in hands the two
    agree in mean (the paired difference within 3 standard errors) while the reward's spread drops."""
    import statistics

    def shove(state, legal):
        return "all_in" if "all_in" in legal else legal[0]

    _, summaries, rewards = _play_scripted("calling_station", shove, range(300), reward="allin_ev")
    chips = [s["chips"] for s in summaries]
    assert rewards == [s["expected_chips"] for s in summaries]
    assert sum(r != c for r, c in zip(rewards, chips)) > 250  # a shove the station calls: every hand adjusted
    diff = [c - r for c, r in zip(chips, rewards)]
    assert abs(statistics.mean(diff)) < 3 * statistics.stdev(diff) / len(diff) ** 0.5
    assert statistics.stdev(rewards) < 0.5 * statistics.stdev(chips)
    # the default reward is the chips themselves, and no summary says otherwise
    _, plain, plain_rewards = _play_scripted("calling_station", shove, range(20))
    assert plain_rewards == [s["chips"] for s in plain] == chips[:20] and "expected_chips" not in plain[0]


def test_allin_ev_leaves_folds_and_river_showdowns_alone_and_counts_the_unseen_cards():
    def passive(state, legal):  # checks or calls to the river: no all-in, a showdown on the full board
        return "check" if "check" in legal else "call"

    table, summaries, rewards = _play_scripted("calling_station", passive, range(20), reward="allin_ev")
    assert rewards == [s["chips"] for s in summaries] == [s["expected_chips"] for s in summaries]
    assert table.expected is None and any(s["chips"] for s in summaries)

    def fold(state, legal):
        return "fold" if "fold" in legal else legal[0]

    _, summaries, rewards = _play_scripted("loose_aggressive", fold, range(20), reward="allin_ev")
    assert rewards == [s["chips"] for s in summaries] == [s["expected_chips"] for s in summaries]

    def flop_shove(state, legal):  # call preflop, all in on the flop: the last two board cards are enumerated
        return "call" if state["stage"] == "preflop" and "call" in legal else ("all_in" if "all_in" in legal else legal[0])

    table, summaries, _ = _play_scripted("calling_station", flop_shove, [3], reward="allin_ev")
    game = table._raw.game
    board, pool = table.unseen(3)
    held = {c.get_index() for p in game.players for c in p.hand}
    assert len(board) == 3 and len(pool) == 52 - 4 - 3 and len(held) == 4
    assert not {c.get_index() for c in pool} & (held | {c.get_index() for c in board})
    assert game.public_cards[3].get_index() in {c.get_index() for c in pool}  # the dealt turn is one of the boards
    assert table.expected is not None and table.expected == summaries[0]["expected_chips"]


def test_allin_ev_through_the_adapter_and_a_bad_reward_named():
    adapter = _adapter(opponent="calling_station", reward="allin_ev")
    ep = adapter.start(next(adapter.tasks(5)), 0)
    while not (st := ep.step("<answer>all_in</answer>")).done:
        pass
    info = ep.result().info
    assert st.reward == ep.sandbox.summary()["expected_chips"] != info["chips"]  # the shove met a call
    with pytest.raises(ConfigError, match=r"env_options.reward must be one of chips, allin_ev, got 'ev'"):
        _adapter(reward="ev")
    from echo2_poker.plugin import PokerPlugin

    stats = PokerPlugin().summarize([{"expected_chips": 3.0}, {"expected_chips": -1.0}, {}])
    assert stats["expected_chips_mean"] == 1.0


@pytest.mark.parametrize("street", ["flop", "turn"])
def test_allin_ev_equals_a_brute_force_count_of_every_runout(street):
    """Heads-up, the seat calls down to `street` and moves all in; the station calls. Every runout is counted
    here independently of the sandbox's judge: rlcard's hand ranking only, the pot arithmetic by hand (win:
    +the matched chips, loss: -them, tie: 0). The reward must equal that mean exactly (both enumerate)."""
    import itertools

    from rlcard.games.limitholdem.utils import compare_hands

    def shove_on(state, legal):
        if state["stage"] == street and "all_in" in legal:
            return "all_in"
        return "check" if "check" in legal else "call"

    checked = 0
    for deal in range(40):
        table, summaries, rewards = _play_scripted("calling_station", shove_on, [deal], reward="allin_ev")
        if table.expected is None:  # the hand ended otherwise (e.g. no all-in was legal)
            continue
        game = table._raw.game
        known = {"flop": 3, "turn": 4}[street]
        board = [c.get_index() for c in game.public_cards[:known]]
        held = {c.get_index() for p in game.players for c in p.hand}
        pool = [s + r for r in "A23456789TJQK" for s in "SHDC" if s + r not in held and s + r not in board]
        mine, theirs = table.seat, 1 - table.seat
        matched = min(game.players[mine].in_chips, game.players[theirs].in_chips)
        total, n = 0.0, 0
        for rest in itertools.combinations(pool, 5 - known):
            hands = [None, None]
            for j in (mine, theirs):
                hands[j] = [c.get_index() for c in game.players[j].hand] + board + list(rest)
            win = compare_hands(hands)
            total += 0 if win[mine] == win[theirs] else (matched if win[mine] else -matched)
            n += 1
        assert n == (990 if street == "flop" else 44)
        assert rewards[0] == summaries[0]["expected_chips"] == pytest.approx(total / n, abs=1e-9)
        checked += 1
        if checked == 3:
            break
    assert checked == 3
