"""The live status page (run.status_port): its server's token checks and bounds, and a real run's page loaded in
a real headless Chromium (worker rows, the version and the reward curve advancing while the run goes on, the prompt
filter's facts, 401 without the token)."""

from __future__ import annotations

import http.client
import re
import shutil
import threading
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from echo2sdk.config import load_config
from echo2sdk.runtime.learner.status import StatusServer

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
LEAD_COPY = "/tmp/status_page.png"  # a copy of the screenshot, for a person to look at


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing (apt-get install chromium chromium-driver; scripts/setup.sh does as root)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing (pip install -e '.[test]')"
    return None


def _browser(profile):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1200",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)  # never a downloaded browser


def _status_code(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _cfg(tmp_path):
    return load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "rollout.nice=0", "learner.steps=10", "learner.trajectories_per_step=8", "learner.staleness=2",
        "learner.data_timeout_s=120", "run.progress=false", "run.heartbeat_s=0.5", "run.save_every=0",
        "run.status_port=0", "scheduler.prices={local-0 = 0.9, local-1 = 1.5}", f'run.out="{tmp_path / "run"}"',
        'task.adapter="mixture"', 'task.options={ mix = [{ adapter = "math" }, { adapter = "toy" }] }',  # Tasks card
    ])


def _request(server: StatusServer, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_server_needs_the_token_and_moves_a_url_token_into_a_cookie():
    server = StatusServer(lambda: {"run": {"step": 3}})
    server.start()
    try:
        bearer = {"Authorization": f"Bearer {server.token}"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{server.cookie}=wrong"}):
            assert _request(server, "GET", "/api/status", headers)[0] == 401
        assert _request(server, "GET", "/?token=wrong")[0] == 401
        code, _, body = _request(server, "GET", "/api/status", bearer)
        assert (code, body) == (200, b'{"run": {"step": 3}}')
        code, headers, _ = _request(server, "GET", f"/?token={server.token}")
        assert (code, headers["Location"]) == (303, "/")  # the address bar loses the token
        assert headers["Set-Cookie"] == f"{server.cookie}={server.token}; HttpOnly; SameSite=Strict; Path=/"
        code, headers, body = _request(server, "GET", "/app.js", {"Cookie": f"a=1; {server.cookie}={server.token}"})
        assert code == 200 and headers["Content-Type"].startswith("text/javascript") and b"/api/status" in body
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert _request(server, "GET", "/nothing", bearer)[0] == 404
        assert _request(server, "POST", "/api/status", bearer, b"{}")[0] == 501  # GET only
        assert _request(server, "GET", "/api/status", bearer, b"{}")[0] == 413  # no body
        assert _request(server, "GET", "/" + "a" * 3000, bearer)[0] == 414
    finally:
        server.stop()


def test_one_address_holding_its_connections_keeps_no_other_address_from_the_page():
    """Idle connections from one address (as many as the page serves at once, sending nothing) hold at most
    MAX_PER_ADDRESS slots: the rest are closed unread, and a client at another address (127.0.0.2, loopback too) is
    served meanwhile; once they close, the first address is served again."""
    import select
    import socket
    import time

    from echo2sdk.runtime.learner.status import server as status_server

    server = StatusServer(lambda: {"run": {"step": 1}})
    server.start()
    bearer = {"Authorization": f"Bearer {server.token}"}
    idle = [socket.create_connection((server.host, server.port), timeout=10)
            for _ in range(status_server.MAX_CONNECTIONS)]
    try:
        other = http.client.HTTPConnection(server.host, server.port, timeout=10, source_address=("127.0.0.2", 0))
        try:
            other.request("GET", "/api/status", headers=bearer)
            r = other.getresponse()
            assert (r.status, r.read()) == (200, b'{"run": {"step": 1}}')
        finally:
            other.close()
        # accepted one at a time, in order: by now the server has closed those over the cap (EOF: readable)
        closed, _, _ = select.select(idle, [], [], 0.5)
        assert set(closed) == set(idle[status_server.MAX_PER_ADDRESS:]) and all(s.recv(1) == b"" for s in closed)
        for s in idle:
            s.close()
        deadline = time.monotonic() + 10  # their threads see the close and give the slots back
        while True:
            try:
                assert _request(server, "GET", "/api/status", bearer)[0] == 200
                break
            except (http.client.RemoteDisconnected, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_page_files_ship_as_package_data():
    """A wheel holds exactly what pyproject.toml lists: every non-Python file of the page must be there."""
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    folder = root / "echo2sdk" / "runtime" / "learner" / "status"
    assert sorted(listed["echo2sdk.runtime.learner.status"]) == sorted(p.name for p in folder.iterdir() if p.suffix in
                                                                  (".html", ".js", ".css"))


def _watch(browser, shot, seen: dict) -> None:
    """On a helper thread while the run trains on the main one: wait (bounded) for both workers to show as
    active, the version to pass `seen["v0"]` and the reward curve to gain 5 points over `seen["p0"]`; then the
    screenshot. Any failure is kept in `seen["error"]` for the test to raise."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        wait = WebDriverWait(browser, 240, poll_frequency=0.2)
        wait.until(lambda b: sorted((wid, state) for wid, state, _ in _rows(b)) == [("local-0", "active"),
                                                                                   ("local-1", "active")])
        wait.until(lambda b: _page(b)["version"] > seen["v0"] and _page(b)["points"] >= seen["p0"] + 5)
        assert all(shown.startswith("v") for _, _, shown in _rows(browser))  # each worker's installed version
        wait.until(lambda b: sorted(_tasks(b)) == ["math", "toy"])  # a mixture's components, a row each
        page = _page(browser)
        assert (page["connection"], page["chain_nodes"], page["bars"]) == ("live", 2, 3)  # chains; Delta = 0..S
        assert page["failures"].endswith("/ 0")  # no adapter failures in the run
        # the run's wait split by cause: three numbers in seconds (tiny-random's groups are all filtered)
        assert re.fullmatch(r"[\d.]+ / [\d.]+ / [\d.]+ s", page["causes"]), page["causes"]
        # the prompt filter's last step (issue 44): skipped by reason, f measured / unskipped, its explore
        # probability; "off" (and no unskipped estimate) where this run's filter is off
        pct, off = r"(-|[\d.]+ %)", page["explore"] == "off"
        assert off or re.fullmatch(r"[\d.]+ %", page["explore"]), page["explore"]
        assert re.fullmatch("off" if off else r"\d+ \(\d+ / \d+ / \d+\)", page["skipped"]), page["skipped"]
        assert re.fullmatch(f"{pct} / {'off' if off else pct}", page["filter_rate"]), page["filter_rate"]
        assert re.fullmatch(r"-|[\d.]+", page["per_useful"]), page["per_useful"]
        assert browser.save_screenshot(str(shot))
    except BaseException as e:  # noqa: BLE001 - handed to the test's thread
        seen["error"] = e


# The DOM is read by one script per look: the page redraws every second, so elements found earlier go stale.
def _rows(browser) -> list:
    return browser.execute_script("return [...document.querySelectorAll('#workers tbody tr')].map(r => "
                                  "[r.dataset.worker, r.cells[1].textContent, r.cells[2].textContent])")


def _tasks(browser) -> list:
    return browser.execute_script("return document.getElementById('tasks-card').hidden ? [] : "
                                  "[...document.querySelectorAll('#tasks tbody tr')].map(r => r.dataset.task)")


def _page(browser) -> dict:
    return browser.execute_script(
        "const n = (q) => document.querySelectorAll(q).length;"
        "return {version: Number(document.getElementById('version').textContent),"
        " points: Number(document.getElementById('reward-curve').dataset.points),"
        " connection: document.getElementById('connection').textContent,"
        " failures: document.getElementById('failures').textContent,"
        " causes: document.getElementById('wait-causes').textContent,"
        " skipped: document.getElementById('skipped').textContent,"
        " filter_rate: document.getElementById('filter-rate').textContent,"
        " per_useful: document.getElementById('per-useful').textContent,"
        " explore: document.getElementById('explore').textContent,"
        " chain_nodes: n('#chains circle.node.active'), bars: n('#staleness rect.bar')}")


FACTS_SHOT = "/tmp/status_page_prompt_filter.png"  # the facts with the filter on, for a person to look at


@pytest.mark.integration
@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_prompt_filter_facts_in_a_headless_browser(tmp_path):
    """The page over a fixed state (fake_run.py: the recorded math run, its last step with the prompt filter's
    columns): prompts skipped by reason, f measured / unskipped, rollouts per useful one, the explore probability;
    then the same step with the filter off."""
    from fake_run import FILTER_ON, rows, view
    from selenium.webdriver.support.ui import WebDriverWait

    from echo2sdk.runtime.learner.status import page_state

    run = rows()
    run[-1].update(FILTER_ON)
    state = {"now": page_state(view(run))}
    server, browser = StatusServer(lambda: state["now"]), None
    server.start()
    facts = ("const t = (id) => document.getElementById(id).textContent;"
             "return [t('connection'), t('skipped'), t('filter-rate'), t('per-useful'), t('explore')]")
    f = f"{100 * run[-1]['filter_rate']:.1f} %"
    try:
        browser = _browser(tmp_path / "chromium-profile")
        browser.get(f"http://{server.host}:{server.port}/?token={server.token}")
        wait = WebDriverWait(browser, 60, poll_frequency=0.2)
        wait.until(lambda b: b.execute_script(facts)[0] == "live")
        assert browser.execute_script(facts)[1:] == ["3 (2 / 1 / 0)", f"{f} / 95.0 %", "1.33", "10.0 %"]
        assert browser.save_screenshot(FACTS_SHOT)
        run[-1].update(prompts_skipped=0, prompts_skipped_by_reason={}, prompt_explore=None,
                       filter_rate_unskipped=None, rollouts_per_useful=None)
        state["now"] = page_state(view(run))
        wait.until(lambda b: b.execute_script(facts)[1:] == ["off", f"{f} / off", "-", "off"])
    finally:
        if browser is not None:
            browser.quit()
        server.stop()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_status_page_in_a_headless_browser(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from echo2sdk.runtime.learner.recipe import Trainer

    tr, browser, watcher = Trainer(_cfg(tmp_path)), None, None
    try:
        tr.setup()  # the coordinator, the status page and the workers are up; nothing is trained yet
        url, token = tr.status.url, tr.status.token
        assert token != tr.coordinator.token  # the page has its own token: the workers' never reaches a browser
        assert _status_code(url) == _status_code(url + "api/status") == 401
        assert _status_code(url + "api/status?token=wrong") == 401
        assert _status_code(url + "api/status", {"Authorization": f"Bearer {token}"}) == 200

        browser = _browser(tmp_path / "chromium-profile")
        browser.get(f"{url}?token={token}")
        assert "token" not in browser.current_url  # moved into a cookie; the address bar keeps no token
        WebDriverWait(browser, 60, poll_frequency=0.2).until(lambda b: _page(b)["connection"] == "live")
        seen = {"v0": _page(browser)["version"], "p0": _page(browser)["points"]}
        assert seen == {"v0": 0, "p0": 0}  # before the first step
        shot = tmp_path / "status_page.png"
        watcher = threading.Thread(target=_watch, args=(browser, shot, seen), daemon=True)
        watcher.start()
        summary = tr.run()  # on this thread, while the browser watches the page
        watcher.join(300)
        assert not watcher.is_alive(), "the browser checks did not finish within 300 s of the run's end"
        if "error" in seen:
            raise seen["error"]
        shutil.copyfile(shot, LEAD_COPY)

        browser.delete_all_cookies()
        browser.get(url)
        assert "401" in browser.find_element(By.TAG_NAME, "body").text
    finally:
        if browser is not None:
            browser.quit()
        tr.close()
    assert summary["steps"] == 10
    with pytest.raises(urllib.error.URLError) as gone:  # the page closes with the run
        urllib.request.urlopen(url, timeout=5)
    assert isinstance(gone.value.reason, ConnectionRefusedError)
