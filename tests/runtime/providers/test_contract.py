"""The provider contract, run against both built-in providers: `local` (real processes) and `skypilot` (SkyPilot's
SDK calls answered by a recording fake, fake_sky.py: no cloud is reachable from CI). start, stop, running, close;
idempotent start and stop; close stops all; the run ledger written before each launch; failures and timeouts
reported and cleaned up; `echo2 fleet status|down` with no provider object alive."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.providers import fleet_down, fleet_status, load_provider
from echo2sdk.runtime.providers.ledger import read_ledger

sys.path.insert(0, str(Path(__file__).parent))
from fake_sky import FakeSky  # noqa: E402
from waiting import eventually  # noqa: E402

TOKEN = "contract-test-token-" + "x" * 40



class Local:
    """`local`, with a stand-in interpreter that just sleeps: the contract is about the processes, not the worker."""

    name = "local"

    def __init__(self, tmp: Path):
        self.python = tmp / "python"
        # its argv stays `... -m echo2sdk.cli worker ... --id NAME` (what fleet down checks before it kills)
        self.python.write_text("#!/bin/sh\ntrap 'kill $!; exit 0' TERM\nsleep 60 &\nwait\n")
        self.python.chmod(0o755)

    def make(self, run_dir: Path, **kw):
        return load_provider("local", run={"connect": "127.0.0.1:9", "token": TOKEN, "run_dir": str(run_dir),
                                           "log_dir": str(run_dir / "workers")}, python=str(self.python), **kw)

    def broken(self, run_dir: Path):
        return load_provider("local", run={"connect": "127.0.0.1:9", "token": TOKEN, "run_dir": str(run_dir),
                                           "log_dir": str(run_dir / "workers")},
                             python=str(run_dir / "no-such-python"))

    def alive(self, provider, name):  # the machine itself, not what the provider believes
        p = provider.procs.get(name)
        return p is not None and p.poll() is None


class Sky:
    name = "skypilot"

    def __init__(self, tmp: Path):
        self.fake = FakeSky(tmp / "fake-sky", launch_s=0.2, fail=["^bad-"], hang=["^slow-"])

    def make(self, run_dir: Path, **kw):
        machines = {t: {"accelerators": "L4:1"} for t in ("l4", "bad", "slow")}
        return load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(run_dir),
                                              "machines": machines}, setup="true", sky=self.fake, **kw)

    def broken(self, run_dir: Path):
        return self.make(run_dir)

    def alive(self, provider, name):
        return provider.cluster(name) in self.fake.clusters()


@pytest.fixture(params=["local", "skypilot"])
def kind(request, tmp_path, monkeypatch):
    k = Local(tmp_path) if request.param == "local" else Sky(tmp_path)
    if request.param == "skypilot":
        monkeypatch.setitem(sys.modules, "sky", k.fake)  # what `echo2 fleet` imports
    return k


def test_start_is_recorded_before_the_launch_and_is_idempotent(kind, tmp_path):
    p = kind.make(tmp_path)
    try:
        p.start("l4-0", 0.5)
        p.start("l4-0", 0.5)  # again while launching or up: nothing more
        eventually(lambda: kind.alive(p, "l4-0"), what="l4-0 up")
        assert "l4-0" in p.running()
        recs = [json.loads(x) for x in (tmp_path / "machines.jsonl").read_text().splitlines()]
        assert [r["event"] for r in recs if r["machine"] == "l4-0"][0] == "launch"
        assert sum(r["event"] == "launch" for r in recs) == 1
        if kind.name == "skypilot":
            (launch,) = kind.fake.calls("launch")
            assert launch["t"] > recs[0]["t"] - 0.01  # the ledger line was on disk first
            assert launch["cluster"] == p.cluster("l4-0") and re.fullmatch(r"e2-[0-9a-f]{6}-l4-0", launch["cluster"])
            assert launch["options"]["down"] is True and launch["options"]["idle_minutes_to_autostop"] == 10
    finally:
        p.close()


def test_stop_ends_the_machine_and_is_idempotent(kind, tmp_path):
    p = kind.make(tmp_path)
    try:
        p.start("l4-0", 0.5)
        p.start("l4-1", 0.5)
        eventually(lambda: kind.alive(p, "l4-0") and kind.alive(p, "l4-1"), what="both up")
        p.stop("l4-0")
        p.stop("l4-0")
        p.stop("never-started")
        eventually(lambda: not kind.alive(p, "l4-0"), what="l4-0 ended")
        assert p.running() == ["l4-1"]
        eventually(lambda: read_ledger(tmp_path)["l4-0"].down, what="l4-0 down in the ledger")
        assert read_ledger(tmp_path)["l4-1"].state in ("launch", "up")
    finally:
        p.close()


def test_close_stops_everything_it_started(kind, tmp_path):
    p = kind.make(tmp_path)
    for i in range(3):
        p.start(f"l4-{i}", 0.5)
    eventually(lambda: all(kind.alive(p, f"l4-{i}") for i in range(3)), what="three up")
    p.close()
    assert not any(kind.alive(p, f"l4-{i}") for i in range(3))
    assert p.running() == []
    assert all(m.down for m in read_ledger(tmp_path).values())
    p.close()  # twice: nothing left to do


def test_a_failed_launch_is_reported_once_and_cleaned_up(kind, tmp_path):
    p = kind.broken(tmp_path)
    name = "bad-0" if kind.name == "skypilot" else "l4-0"
    try:
        p.start(name, 1.0)
        got: dict[str, str] = {}
        eventually(lambda: got.update(p.failures()) or name in got, what="the failure reported")
        assert p.failures() == {}  # reported once
        assert name not in p.running()
        m = read_ledger(tmp_path)[name]
        if kind.name == "skypilot":
            assert "no capacity" in got[name]
            eventually(lambda: read_ledger(tmp_path)[name].down, what="the failed cluster torn down")
            assert [c["cluster"] for c in kind.fake.calls("down")] == [p.cluster(name)]
        else:
            assert "no-such-python" in got[name] and m.state == "failed"
    finally:
        p.close()


def test_fleet_status_and_down_need_no_provider_alive(kind, tmp_path):
    p = kind.make(tmp_path)
    p.start("l4-0", 0.5)
    p.start("l4-1", 0.7)
    eventually(lambda: kind.alive(p, "l4-0") and kind.alive(p, "l4-1"), what="both up")
    # the learner is gone without closing anything (its provider object is simply dropped)
    rows = {r["machine"]: r for r in fleet_status(tmp_path)}
    assert set(rows) == {"l4-0", "l4-1"} and all(r["now"] not in ("down", "gone") for r in rows.values())
    assert rows["l4-1"]["price_per_hour"] == 0.7 or kind.name == "local"
    assert fleet_down(tmp_path) == {"l4-0": "down", "l4-1": "down"}
    assert not kind.alive(p, "l4-0") and not kind.alive(p, "l4-1")
    assert all(m.down for m in read_ledger(tmp_path).values())
    assert fleet_down(tmp_path) == {}  # nothing left
    if kind.name == "local":
        for proc in p.procs.values():
            proc.wait(5)


def test_skypilot_launch_timeout_cancels_and_downs(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky", hang=["^slow-"])
    p = load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"slow": {"accelerators": "L4:1"}}},
                      setup="true", sky=fake, launch_timeout_s=0.3)
    p.start("slow-0", 1.0)
    time.sleep(0.4)
    failures = p.failures()
    assert "not up after launch_timeout_s = 0.3 s" in failures["slow-0"]
    eventually(lambda: read_ledger(tmp_path)["slow-0"].down, what="the hung launch cancelled and downed")
    assert fake.calls("api_cancel") and fake.clusters() == {}
    p.close()


def test_skypilot_reports_a_preempted_cluster(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky")
    p = load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"l4": {"accelerators": "L4:1", "use_spot": True}}},
                      setup="true", sky=fake)
    p.start("l4-0", 0.3)
    eventually(lambda: fake.clusters().get(p.cluster("l4-0"), {}).get("status") == "UP" and p.running() == ["l4-0"])
    fake.preempt(p.cluster("l4-0"))
    assert p.running() == []
    assert "preempted" in p.failures()["l4-0"]
    p.close()


def test_skypilot_refuses_bad_settings_by_name(tmp_path):
    run = {"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="unknown resources \\['cloud'\\].*infra"):
        load_provider("skypilot", run={**run, "machines": {"l4": {"cloud": "aws"}}})
    with pytest.raises(ConfigError, match="ports are the provider's"):
        load_provider("skypilot", run={**run, "machines": {"l4": {"ports": [1]}}})
    with pytest.raises(ConfigError, match="connect = '0.0.0.0:7000'"):
        load_provider("skypilot", run={**run, "connect": "0.0.0.0:7000"})
    with pytest.raises(ConfigError, match="the port is 0"):
        load_provider("skypilot", run={**run, "connect": "learner:0"})
    p = load_provider("skypilot", run={**run, "machines": {"l4": {}}}, sky=FakeSky(tmp_path / "s"))
    with pytest.raises(ConfigError, match="machine type 'h100', not among"):
        p.start("h100-0", 2.0)
    assert not (tmp_path / "machines.jsonl").exists()  # refused before anything was recorded or launched


def test_the_real_skypilot_builds_and_validates_the_task_offline(tmp_path, monkeypatch):
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install 'echo2sdk[skypilot]')")
    monkeypatch.setenv("HOME", str(tmp_path))
    p = load_provider("skypilot", run={"connect": "learner.example.com:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"l4": {"accelerators": "L4:1", "use_spot": True, "disk_size": 64}}},
                      packages=["echo2-math"], envs={"HF_HUB_OFFLINE": "1"})
    t = p.task("l4-2", 0.45)
    assert isinstance(t, sky.Task) and t.name == "l4-2"
    (r,) = list(t.resources)
    assert r.accelerators == {"L4": 1} and r.use_spot and r.disk_size == 64 and r.ports == ["7420"]
    assert "pip install torch && pip install 'echo2sdk[hf]==" in t.setup
    assert t.run.startswith("echo2 worker --connect learner.example.com:7000 --id l4-2 --price 0.45 --relay-port 7420")
    assert "pip install" in t.setup and "echo2-math" in t.setup
    assert t.envs == {"HF_HUB_OFFLINE": "1"} and set(t.secrets) == {"ECHO2_CREDENTIAL"}
    credential = t.secrets["ECHO2_CREDENTIAL"].get_secret_value()  # SkyPilot keeps it as a pydantic SecretStr
    assert credential.startswith("l4-2:") and TOKEN not in credential
    # what SkyPilot shows and keeps as the task's YAML (dashboard, `sky status -v`): secrets redacted
    shown = json.dumps(t.to_yaml_config(use_user_specified_yaml=True), default=str)
    assert TOKEN not in shown and credential.split(":")[1] not in shown and "ECHO2_CREDENTIAL" in shown
    with pytest.raises(Exception, match="(?i)accelerator|invalid"):
        load_provider("skypilot", run={"connect": "h:1", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"l4": {"accelerators": "L4:x"}}}).task("l4-0", 1.0)
    assert not (tmp_path / "machines.jsonl").exists()  # building a task launches and records nothing


class _Table:
    """The coordinator's worker table as the live loop reads it: nobody has joined (the machines are launching)."""

    def __init__(self):
        self.workers: dict = {}
        self.active: dict[str, bool] = {}

    def set_active(self, worker_id, active):
        self.active[worker_id] = active


def test_a_failed_launch_is_retried_on_the_next_cheapest_type_and_reported(tmp_path):
    from echo2sdk.core.scheduler import Scheduler
    from echo2sdk.runtime.learner.live_loop import LiveLoop

    fake = FakeSky(tmp_path / "fake-sky", launch_s=0.05, fail=["^h100-"])
    p = load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"h100": {"accelerators": "H100:1"}, "l4": {"accelerators": "L4:1"}}},
                      setup="true", sky=fake)
    s = Scheduler(heartbeat_s=1.0, window_s=10.0, sustain_s=0.0)
    for i in range(2):  # mu_target 3: one h100 ($2/h, 4 rollouts/s) is the cheapest cover; both l4s fall short
        s.add_worker(f"h100-{i}", 2.0, 4.0, kind="h100")
        s.add_worker(f"l4-{i}", 0.6, 1.0, kind="l4")
    s.set_target(3.0)
    events: list[dict] = []
    loop = LiveLoop(s, _Table(), p, on_event=events.append)
    try:
        loop.apply(s.provision(0.0))
        launched = lambda: [c["cluster"].split("-", 2)[2] for c in fake.calls("launch")]  # noqa: E731
        eventually(lambda: launched() == ["h100-0"], what="h100-0 launched")
        eventually(lambda: read_ledger(tmp_path)["h100-0"].state in ("failed", "down"), what="h100-0 failed")
        loop.tick(1.0)
        eventually(lambda: len(launched()) == 3, what="the retries launched")
        assert launched() == ["h100-0", "l4-0", "l4-1"]  # not h100-1: the type that failed is skipped
        failed = [e for e in events if e["event"] == "launch_failed"]
        assert failed and failed[0]["worker"] == "h100-0" and "no capacity" in failed[0]["reason"]
        assert any(e["event"] == "activate" and e["worker"] == "l4-0" for e in events)
        eventually(lambda: set(fake.clusters()) == {p.cluster("l4-0"), p.cluster("l4-1")}, what="the l4s up, h100-0 down")
    finally:
        p.close()
    assert fake.clusters() == {}


def test_dry_run_prints_the_launch_plan_and_launches_nothing(tmp_path, capsys, monkeypatch):
    from echo2sdk.cli import main

    monkeypatch.setitem(sys.modules, "sky", None)  # a dry run needs no SkyPilot: importing it would fail here
    monkeypatch.setenv("ECHO2_TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    example = Path(__file__).parents[3] / "examples" / "math_skypilot.toml"
    assert main(["run", str(example), "--dry-run", "--out", str(tmp_path / "run")]) == 1  # no wheels built yet
    assert "problem: provider 'skypilot': wheels: 'dist' is not a .whl file" in capsys.readouterr().out
    (tmp_path / "dist").mkdir()
    for whl in ("echo2sdk-0.1.0-py3-none-any.whl", "echo2_math-0.1.0-py3-none-any.whl"):
        (tmp_path / "dist" / whl).write_bytes(b"")  # a dry run reads no wheel
    assert main(["run", str(example), "--dry-run", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert ("setup: pip install torch && pip install '/tmp/echo2-wheels/echo2sdk-0.1.0-py3-none-any.whl[hf]' "
            "/tmp/echo2-wheels/echo2_math-0.1.0-py3-none-any.whl") in out
    assert "validated: no: skypilot (the skypilot provider's SkyPilot) is not installed" in out
    assert "nothing launched" in out and "provider: skypilot, workers connect to learner.example.com:7000" in out
    assert "l4             4     0.450    1.800  accelerators=L4:1 use_spot=True disk_size=64" in out
    assert "at most $3.820/h with every machine up" in out
    assert ("run: echo2 worker --connect learner.example.com:7000 --id l4-0 --price 0.45 --relay-port 7420 "
            "--bootstrap") in out
    assert "secrets: ECHO2_CREDENTIAL" in out and TOKEN not in out
    assert not (tmp_path / "run").exists()  # nothing written, nothing launched


def test_skypilot_close_does_not_wait_on_a_hung_launch(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky", hang=["^slow-"])
    p = load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                       "machines": {"slow": {"accelerators": "L4:1"}}}, setup="true", sky=fake)
    p.start("slow-0", 1.0)
    eventually(lambda: p.cluster("slow-0") in fake.clusters(), what="the launch under way")
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 5  # the cancel + down, not the launch's sky.get
    assert fake.clusters() == {} and read_ledger(tmp_path)["slow-0"].down


def _sky(tmp_path, fake, **kw):
    return load_provider("skypilot", run={"connect": "127.0.0.1:7000", "token": TOKEN, "run_dir": str(tmp_path),
                                          "machines": {"l4": {"accelerators": "L4:1"}}}, setup="true", sky=fake, **kw)


def _settled(fake, seconds=0.8):
    """The fake's clusters once nothing has changed for `seconds` (a leak would show up within that)."""
    last, since = None, time.monotonic()
    while time.monotonic() - since < seconds:
        now = fake.clusters()
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.05)
    return last


def test_skypilot_a_stop_before_the_launch_request_returns_leaves_no_cluster(tmp_path):
    # SkyPilot creates the cluster's record well into its launch: a down before then finds nothing, while the launch
    # goes on. The provider cancels the request and waits for it to end before it downs.
    fake = FakeSky(tmp_path / "fake-sky", submit_s=0.2, record_s=0.3, launch_s=0.5)
    p = _sky(tmp_path, fake)
    p.start("l4-0", 0.5)
    p.stop("l4-0")  # the launch has not even returned its request id
    eventually(lambda: read_ledger(tmp_path)["l4-0"].down, what="l4-0 recorded down")
    assert _settled(fake) == {}
    p.close()


def test_skypilot_a_machine_started_again_while_going_down_is_launched_after_and_tracked(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky", launch_s=0.1)
    p = _sky(tmp_path, fake)
    p.start("l4-0", 0.5)
    eventually(lambda: p.running() == ["l4-0"], what="up")
    p.stop("l4-0")
    p.start("l4-0", 0.5)  # e.g. released with stop_released, then wanted again at once
    eventually(lambda: len(fake.calls("launch")) == 2 and p.running() == ["l4-0"], what="launched again")
    assert list(_settled(fake)) == [p.cluster("l4-0")]
    p.close()
    assert fake.clusters() == {} and read_ledger(tmp_path)["l4-0"].down


def test_skypilot_after_close_nothing_launches(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky")
    p = _sky(tmp_path, fake)
    p.close()
    p.start("l4-0", 0.5)
    time.sleep(0.2)
    assert fake.calls("launch") == [] and not (tmp_path / "machines.jsonl").exists()


def test_skypilot_secret_envs_travel_as_secrets_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    fake = FakeSky(tmp_path / "fake-sky")
    p = _sky(tmp_path, fake, secret_envs=["HF_TOKEN"], envs={"HF_HUB_OFFLINE": "0"})
    assert p.spec("l4-0", 0.5)["secrets"] == ["ECHO2_CREDENTIAL", "HF_TOKEN"]
    t = p.task("l4-0", 0.5)
    assert t.secrets["HF_TOKEN"] == "hf_secret_value_123" and "HF_TOKEN" not in t.envs
    p.start("l4-0", 0.5)
    eventually(lambda: read_ledger(tmp_path)["l4-0"].state == "up")
    p.close()
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or "hf_secret_value_123" not in f.read_text()
    with pytest.raises(ConfigError, match=r"envs \['HF_TOKEN'\] are secrets"):
        _sky(tmp_path, fake, secret_envs=["HF_TOKEN"], envs={"HF_TOKEN": "x"})
    with pytest.raises(ConfigError, match=r"secret_envs \['NOT_SET_ANYWHERE'\] are not set"):
        _sky(tmp_path, fake, secret_envs=["NOT_SET_ANYWHERE"])
    with pytest.raises(ConfigError, match="unknown scheduler.provider_options \\['autostop'\\]"):
        _sky(tmp_path, fake, autostop=5)


def test_fleet_down_trusts_a_ledger_no_further_than_the_run(tmp_path):
    import subprocess

    from echo2sdk.runtime.providers.local import process_started

    other = subprocess.Popen(["sleep", "30"])  # an unrelated process of ours, with its real pid and start time
    try:
        lines = [{"t": 1, "provider": "local", "event": "launch", "machine": "local-0", "handle": {}, "spec": {}},
                 {"t": 2, "provider": "local", "event": "up", "machine": "local-0",
                  "handle": {"pid": other.pid, "started": process_started(other.pid)}}]
        ledger = tmp_path / "machines.jsonl"
        ledger.write_text("".join(json.dumps(x) + "\n" for x in lines))
        ledger.chmod(0o600)
        fleet_down(tmp_path)
        assert other.poll() is None  # not an echo2 worker: never signalled
        ledger.write_text(json.dumps({**lines[0], "provider": "this:s"}) + "\n")
        with pytest.raises(ConfigError, match="provider 'this:s', not one registered"):
            fleet_down(tmp_path)
        ledger.chmod(0o666)
        with pytest.raises(ConfigError, match="no one else may write"):
            fleet_status(tmp_path)
    finally:
        other.kill()
        other.wait()


def test_fleet_down_refuses_a_run_whose_learner_still_holds_it(tmp_path):
    import signal
    import subprocess

    code = ("import sys, time\nfrom echo2sdk.runtime.providers.ledger import Ledger\n"
            "Ledger(sys.argv[1], 'local').down('nothing')\nprint('held', flush=True)\ntime.sleep(60)\n")
    learner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert learner.stdout.readline().strip() == "held"  # its first ledger line took the lock
        with pytest.raises(ConfigError, match=f"still going \\(process {learner.pid} holds"):
            fleet_down(tmp_path)
        assert fleet_down(tmp_path, force=True) == {}
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        assert fleet_down(tmp_path) == {}  # a killed learner's lock is gone with it
    finally:
        learner.kill()
        learner.wait(10)


def test_a_failed_warm_up_launch_is_replaced_by_another_type_and_backs_that_type_off(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.calibration import Provisioning

    fake = FakeSky(tmp_path / "fake-sky", launch_s=0.05, fail=["^h100-"])
    monkeypatch.setitem(sys.modules, "sky", fake)  # the provider imports sky when it first needs it
    cfg = load_config(None, [
        "scheduler.enabled=true", "scheduler.provider=\"skypilot\"", "scheduler.initial_machines=1",
        "scheduler.provider_options={connect=\"127.0.0.1:7000\", setup=\"true\"}",
        "scheduler.machines=[{name=\"h100\", count=2, price_per_hour=2.0, mu=8.0, resources={accelerators=\"H100:1\"}},"
        " {name=\"l4\", count=2, price_per_hour=0.6, mu=1.0, resources={accelerators=\"L4:1\"}}]"])
    coordinator = SimpleNamespace(host="127.0.0.1", port=7000, token=TOKEN, worker_config={})
    prov = Provisioning(cfg, coordinator, metrics=None, out=tmp_path / "run")
    try:
        assert prov.launch_initial() == ["h100-0"]  # rho 0.25 < 0.6: the h100 first
        eventually(lambda: "h100-0" in prov.warmup_failed and len(prov.initial) == 2, what="replaced")
        assert prov.initial == ["h100-0", "l4-0"]  # not h100-1: its type failed
        assert "no capacity" in prov.warmup_failed["h100-0"]
        eventually(lambda: set(fake.clusters()) == {prov.provider.cluster("l4-0")}, what="l4-0 up, h100-0 down")
    finally:
        prov.stop()
    assert fake.clusters() == {}
