"""Cost-aware closed-loop activation (paper §3.4, §4.3, C.2.1, D)."""

from __future__ import annotations

import random

import pytest

from echo2sdk.core.scheduler import ACTIVE, FAILED, STANDBY, Scheduler
from echo2sdk.errors import CapacityError

# ---------------------------------------------------------------- closed loop


class Fleet:
    """Drives a Scheduler with heartbeats: each active worker delivers rollouts at its true rate times
    a noise factor; failed workers fall silent."""

    def __init__(self, sched: Scheduler, rates: dict[str, float], noise: float = 0.0, seed: int = 0):
        self.s, self.rates, self.noise = sched, rates, noise
        self.count = dict.fromkeys(rates, 0.0)
        self.dead: set[str] = set()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.actions = []

    def run(self, seconds: float, dt: float = 1.0):
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now += dt
            for name, w in self.s.workers.items():
                if w.state != ACTIVE or name in self.dead:
                    continue
                factor = max(0.0, 1 + self.rng.uniform(-self.noise, self.noise))
                self.count[name] += self.rates[name] * factor * dt
                self.s.heartbeat(name, self.now, rollouts=self.count[name])
            self.actions += self.s.step(self.now)
        return self


def _sched(**kw):
    kw = {"window_s": 20.0, "heartbeat_s": 1.0, "sustain_s": 10.0, "release_margin": 0.15, **kw}
    return Scheduler(**kw)


def _pool(s: Scheduler, active=(), **offers):
    for name, (price, mu) in offers.items():
        s.add_worker(name, price, mu, active=name in active)


def test_calibrate_sets_target_from_the_capacity_rule():
    s = _sched(gamma=1.1)
    target = s.calibrate(T_train=100.0, T_bcast=40.0, R=128, kappa=2)
    assert s.mu_min == pytest.approx(1.6) and target == pytest.approx(1.76)


def test_calibrate_rejects_an_infeasible_configuration():
    with pytest.raises(CapacityError, match=r"infeasible.*T_bcast = 250"):
        _sched().calibrate(T_train=100.0, T_bcast=250.0, R=128, kappa=2)


def test_step_without_a_target_is_a_clear_error():
    with pytest.raises(CapacityError, match="no mu_target"):
        _sched().step(0.0)


def test_provision_activates_lowest_rho_first():
    s = _sched()
    _pool(s, expensive=(3.0, 1.0), cheap=(0.3, 0.3), mid=(0.6, 0.3), cheapest=(0.2, 0.3))
    s.set_target(0.85)
    acts = s.provision(0.0)
    assert [a.worker for a in acts] == ["cheapest", "cheap", "mid"]  # rho 0.67, 1.0, 2.0; 'expensive' 3.0 unused
    assert all(a.kind == "activate" for a in acts)
    assert s.standby() == ["expensive"]


def test_sustained_shortfall_activates_the_cheapest_standby_worker():
    s = _sched()
    _pool(s, active=("w1", "w2"), w1=(0.35, 0.5), w2=(0.35, 0.5), pricey=(3.0, 1.0), cheap=(0.3, 0.4))
    s.set_target(0.9)
    f = Fleet(s, {"w1": 0.5, "w2": 0.5, "pricey": 1.0, "cheap": 0.4}).run(40)
    assert f.actions == []  # 1.0 >= 0.9, below 1.035: inside the band
    f.rates["w2"] = 0.25  # slows down: mu_pool drops to 0.75 < 0.9
    f.run(60)
    acts = [(a.kind, a.worker) for a in f.actions]
    assert acts == [("activate", "cheap")]
    t_act = f.actions[0].at
    assert t_act >= 40 + 10  # not before the sustain interval


def test_release_the_most_expensive_first_and_only_while_the_rest_meets_the_target():
    s = _sched()
    rates = {"c1": 0.5, "c2": 0.5, "c3": 0.5, "exp": 0.5, "vexp": 0.5}
    prices = {"c1": 0.3, "c2": 0.3, "c3": 0.3, "exp": 1.0, "vexp": 2.0}
    for n in rates:
        s.add_worker(n, prices[n], rates[n], active=True)
    s.set_target(1.2)  # 2.5 available: release until 1.5 (>= 1.2 * 1.15 = 1.38 stops below)
    f = Fleet(s, rates).run(200)
    released = [a.worker for a in f.actions if a.kind == "release"]
    assert released == ["vexp", "exp"]  # gradual, most expensive first
    assert sorted(s.active()) == ["c1", "c2", "c3"]
    gaps = [b.at - a.at for a, b in zip(f.actions, f.actions[1:])]
    assert all(g >= s.cooldown_s for g in gaps)


def test_no_release_when_it_would_drop_below_target():
    s = _sched()
    _pool(s, active=("a", "b"), a=(0.3, 1.0), b=(3.0, 1.0))
    s.set_target(1.5)  # 2.0 > 1.5 * 1.15, but either alone is below 1.5
    f = Fleet(s, {"a": 1.0, "b": 1.0}).run(200)
    assert f.actions == []


def test_hysteresis_no_thrashing_under_noisy_heartbeats():
    s = _sched(window_s=20.0, sustain_s=15.0)
    rates = {f"w{i}": 0.2 for i in range(6)}
    for n in rates:
        s.add_worker(n, 0.35, 0.2, active=True)
    s.add_worker("spare", 0.35, 0.2)
    s.set_target(1.1)  # true mu_pool 1.2: inside [1.1, 1.265]
    f = Fleet(s, rates, noise=0.6, seed=3).run(1500)
    assert f.actions == [], f.actions
    # Instantaneous noise does cross both thresholds; the window and the sustain interval absorb it.
    assert s.mu_pool(f.now) == pytest.approx(1.2, rel=0.15)


def test_single_noisy_dip_is_ignored_but_a_sustained_one_is_not():
    s = _sched(window_s=10.0, sustain_s=20.0)
    rates = {"a": 0.6, "b": 0.6, "c": 0.6}
    _pool(s, active=("a", "b"), a=(0.3, 0.6), b=(0.3, 0.6), c=(0.3, 0.6))
    s.set_target(1.1)
    f = Fleet(s, rates).run(30)
    f.rates["b"] = 0.2
    f.run(8)  # a dip shorter than the sustain interval
    f.rates["b"] = 0.6
    f.run(40)
    assert f.actions == []
    f.rates["b"] = 0.2
    f.run(60)
    # c restores the target; then b, now the worst rho (0.3 $/h for 0.2/s), is the one released.
    assert [(a.kind, a.worker) for a in f.actions] == [("activate", "c"), ("release", "b")]


def test_failed_worker_is_replaced_at_once_from_the_standby_pool():
    s = _sched(sustain_s=30.0, fail_after_s=5.0)
    _pool(s, active=("a", "b"), a=(0.35, 0.5), b=(0.35, 0.5), spare_exp=(2.0, 0.5), spare=(0.35, 0.5))
    s.set_target(1.0)
    f = Fleet(s, {n: 0.5 for n in ("a", "b", "spare_exp", "spare")}).run(30)
    assert f.actions == []
    f.dead.add("b")
    t_fail = f.now
    f.run(20)
    kinds = [(a.kind, a.worker) for a in f.actions]
    assert kinds == [("failed", "b"), ("activate", "spare")]
    assert f.actions[1].at - t_fail <= 5.0 + 2.0  # detection + one tick, no sustain wait
    assert s.workers["b"].state == FAILED and s.workers["spare"].state == ACTIVE


def test_gamma_headroom_absorbs_a_failure_without_replacement():
    s = _sched(fail_after_s=5.0, release_margin=0.5)
    rates = {f"w{i}": 0.25 for i in range(5)}
    for n in rates:
        s.add_worker(n, 0.35, 0.25, active=True)
    s.add_worker("spare", 0.35, 0.25)
    s.set_target(0.95)  # 1.25 active; losing one leaves 1.0 >= 0.95
    f = Fleet(s, rates).run(30)
    f.dead.add("w0")
    f.run(60)
    assert [(a.kind, a.worker) for a in f.actions] == [("failed", "w0")]
    assert s.workers["spare"].state == STANDBY


def test_mark_failed_from_the_coordinator_and_recalibration_flag():
    s = _sched()
    for n in "abcd":
        s.add_worker(n, 0.35, 0.5, active=True)
    s.add_worker("e", 0.35, 0.5)
    s.calibrate(T_train=10.0, T_bcast=2.0, R=8, kappa=2)  # mu_min = 16/18, target 0.978
    assert not s.recalibration_due
    s.mark_failed("a", 1.0)
    assert s.recalibration_due  # 1 change >= 25% of 4 active
    assert s.step(1.5) == []  # b, c, d (1.5 by their priors) still meet the target: nothing to replace
    assert s.mu_pool(1.5) == pytest.approx(1.5)
    s.calibrate(T_train=10.0, T_bcast=2.0, R=8, kappa=2)
    assert not s.recalibration_due


def test_provision_uses_the_configured_solver():
    # the example: b has the lower rho, d alone reaches the target at 0.12 $/h instead of 0.55
    picked = {}
    for solver in ("exact", "greedy"):
        s = _sched(solver=solver)
        _pool(s, b=(0.55, 4.5), d=(0.12, 0.7))
        s.set_target(0.63)
        picked[solver] = [a.worker for a in s.provision(0.0)]
    assert picked == {"exact": ["d"], "greedy": ["b"]}
    assert Scheduler().solver == "exact"
    with pytest.raises(CapacityError, match="solver must be 'exact' or 'greedy', got solver='lp'"):
        Scheduler(solver="lp")


def test_random_order_is_the_ablation_and_differs_from_rho_order():
    orders = set()
    for seed in range(8):
        s = _sched(order="random", seed=seed)
        _pool(s, a=(0.3, 1.0), b=(1.0, 1.0), c=(3.0, 1.0))
        s.set_target(1.0)
        orders.add(s.provision(0.0)[0].worker)
    assert len(orders) > 1
    with pytest.raises(CapacityError, match="order must be"):
        Scheduler(order="cheapest")


def test_scheduler_rejects_bad_parameters_by_name():
    with pytest.raises(CapacityError, match="gamma must be >= 1.*0.9"):
        Scheduler(gamma=0.9)
    with pytest.raises(CapacityError, match="window_s"):
        Scheduler(window_s=0)
    with pytest.raises(CapacityError, match="unknown worker 'zz'"):
        _sched().mu_i("zz", 1.0)


# ---------------------------------------------------------------- the live loop against a coordinator


class FakeCoordinator:
    def __init__(self, **prices):
        from types import SimpleNamespace

        self.workers = {
            w: SimpleNamespace(worker_id=w, alive=True, active=True, trajectories=0, price_per_hour=p)
            for w, p in prices.items()
        }
        self.calls = []

    def set_active(self, wid, active):
        self.calls.append((wid, active))
        self.workers[wid].active = active
        return True


class FakeProvider:
    def __init__(self):
        self.started, self.stopped = [], []

    def start(self, name, price_per_hour=0.0):
        self.started.append((name, price_per_hour))

    def stop(self, name):
        self.stopped.append(name)


def test_live_loop_deactivates_surplus_replaces_a_dropped_worker_and_uses_the_provider():
    from echo2sdk.runtime.learner.live_loop import LiveLoop

    coord = FakeCoordinator(cheap=0.3, mid=0.5, pricey=3.0)
    s = Scheduler(window_s=6.0, heartbeat_s=1.0, sustain_s=3.0, fail_after_s=3.0)
    for wid, info in coord.workers.items():
        s.add_worker(wid, info.price_per_hour, 1.0)
    s.add_worker("standby-0", 0.4, 1.0)  # a machine the provider can start
    s.set_target(1.5)
    decided = s.provision(0.0)
    assert {a.worker for a in decided} == {"cheap", "standby-0"}  # rho 0.3 and 0.4 (priors 1.0 each)
    provider = FakeProvider()
    loop = LiveLoop(s, coord, provider, period_s=1.0)
    loop.apply(decided)
    assert provider.started == [("standby-0", 0.4)]  # not registered yet: the provider starts it
    loop.tick(0.5)
    assert [w for w, i in coord.workers.items() if i.active] == ["cheap"]  # the others idle, registered
    # it joins; both deliver 1 rollout/s
    from types import SimpleNamespace

    coord.workers["standby-0"] = SimpleNamespace(worker_id="standby-0", alive=True, active=False, trajectories=0,
                                                 price_per_hour=0.4)
    for t in range(1, 12):
        for wid in ("cheap", "standby-0"):
            coord.workers[wid].trajectories += 1
        assert loop.tick(float(t)) == []
    assert coord.workers["standby-0"].active  # woken once it registered
    coord.workers["cheap"].alive = False  # killed: the coordinator dropped it
    acts = loop.tick(12.0)
    assert [(a.kind, a.worker) for a in acts] == [("failed", "cheap"), ("activate", "mid")]
    assert coord.workers["mid"].active and not coord.workers["pricey"].active
    assert provider.stopped == ["cheap"]
    coord.workers["late"] = SimpleNamespace(worker_id="late", alive=True, active=True, trajectories=0, price_per_hour=0.1)
    loop.tick(13.0)
    assert not coord.workers["late"].active and s.workers["late"].state == STANDBY  # newcomers wait on standby
    kinds = [e["event"] for e in loop.events if e["event"] != "status"]
    assert kinds == ["activate", "activate", "failed", "activate", "joined"]  # 2 provisioned, 1 replaced


@pytest.mark.integration
def test_real_coordinator_local_provider_failover(tmp_path):
    """Real coordinator, real worker processes started by the `local` provider (MockBackend): the
    scheduler keeps the cheaper worker busy and the other registered but idle; killing the busy one
    makes the idle one take over. Prices travel in the workers' registration."""
    import time as _time

    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.runtime.coordinator import Coordinator
    from echo2sdk.runtime.learner.live_loop import LiveLoop
    from echo2sdk.runtime.providers import load_provider
    from echo2sdk.testing import ToyAdapter

    buf = StalenessBuffer(staleness=2, group_size=3, capacity_groups=4)
    coord = Coordinator(
        buffer=buf, tasks=ToyAdapter().tasks(0), vocab_size=256, max_len=512, token="tok", heartbeat_s=0.2,
        worker_timeout_s=3.0,
        worker_config={"model": "mock", "adapter": "echo2sdk.testing:ToyAdapter", "adapter_options": {},
                       "backend": "echo2sdk.testing:MockBackend", "backend_options": {}, "group_size": 3,
                       "tasks_per_request": 1, "sampling": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}},
    )
    host, port = coord.start()
    provider = load_provider("local", connect=f"{host}:{port}", token="tok", log_dir=tmp_path)
    coord.join_idle()
    try:
        provider.start("cheap", 0.3)
        provider.start("pricey", 0.9)

        def wait(pred, timeout=60.0):
            end = _time.monotonic() + timeout
            while _time.monotonic() < end and not pred():
                _time.sleep(0.1)
            return pred()

        assert wait(lambda: len(coord.alive_workers()) == 2)
        assert {w.worker_id: w.price_per_hour for w in coord.alive_workers()} == {"cheap": 0.3, "pricey": 0.9}
        s = Scheduler(window_s=2.0, heartbeat_s=0.2, sustain_s=0.5, fail_after_s=3.0)
        for w in coord.alive_workers():
            s.add_worker(w.worker_id, w.price_per_hour, 1.0)
        s.set_target(0.5)
        loop = LiveLoop(s, coord, provider, period_s=0.2)
        loop.apply(s.provision(_time.monotonic()))
        loop.start()
        assert wait(lambda: coord.workers["cheap"].trajectories > 0)
        idle_before = coord.workers["pricey"].trajectories
        _time.sleep(1.0)
        assert coord.workers["pricey"].trajectories == idle_before == 0  # registered, alive, idle
        assert coord.workers["pricey"].alive and not coord.workers["pricey"].active
        provider.procs["cheap"].kill()
        assert wait(lambda: coord.workers["pricey"].trajectories > 0, 30.0)
        kinds = [(e["event"], e["worker"]) for e in loop.events if e["event"] in ("failed", "activate")]
        assert kinds == [("activate", "cheap"), ("failed", "cheap"), ("activate", "pricey")]
        loop.stop()
    finally:
        provider.close()
        coord.stop()


def test_a_failed_workers_machine_is_stopped_only_if_it_does_not_rejoin_within_the_grace():
    """Workers re-dial a lost connection. The replacement is activated at once either way; the failed
    worker's machine is stopped after stop_failed_after_s unless it came back (then it waits on standby)."""
    from types import SimpleNamespace

    from echo2sdk.runtime.learner.live_loop import LiveLoop

    coord = FakeCoordinator(a=0.3, b=0.4, c=0.5, d=0.6)
    s = Scheduler(window_s=6.0, heartbeat_s=1.0, sustain_s=3.0, fail_after_s=3.0)
    for wid, info in coord.workers.items():
        s.add_worker(wid, info.price_per_hour, 1.0)
    s.set_target(1.5)
    provider = FakeProvider()
    loop = LiveLoop(s, coord, provider, period_s=1.0, stop_failed_after_s=10.0)
    loop.apply(s.provision(0.0))  # a and b
    for t in range(1, 6):
        for wid in ("a", "b"):
            coord.workers[wid].trajectories += 1
        loop.tick(float(t))
    coord.workers["a"].alive = False  # dropped (a freeze, a blip)
    acts = loop.tick(6.0)
    assert [(x.kind, x.worker) for x in acts] == [("failed", "a"), ("activate", "c")]  # replaced at once
    assert provider.stopped == []
    coord.workers["a"] = SimpleNamespace(worker_id="a", alive=True, active=True, trajectories=5, price_per_hour=0.3)
    loop.tick(8.0)  # it re-joined within the grace: standby, and its machine is kept
    assert s.workers["a"].state == STANDBY and not coord.workers["a"].active
    loop.tick(30.0)
    assert provider.stopped == []
    coord.workers["b"].alive = False  # dropped, and never back
    loop.tick(31.0)
    loop.tick(40.0)
    assert provider.stopped == []
    loop.tick(41.5)
    assert provider.stopped == ["b"]
    kinds = [e["event"] for e in loop.events if e["event"] not in ("status", "activate", "release")]
    assert kinds == ["failed", "rejoined", "failed", "stopped"]
