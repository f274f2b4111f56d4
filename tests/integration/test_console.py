"""The web console (docs/operations.md, "The console") in a real headless browser: Debian's chromium
driven by selenium. The page served by router B of a running line3 mesh shows the three routers and
their links up, the topic and subscription in use, and router C going down within seconds of its
SIGKILL. A screenshot is kept (its path is printed).

The browser comes from Debian (`chromium`, `chromium-driver`): a session fixture installs them with
apt-get when they are missing, and fails loudly if it cannot. ONCEMESH_NO_BROWSER_INSTALL=1 skips
the installation (the test is then skipped when no browser is there)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncemesh.clients.runtime import Client
from oncemesh.harness.procs import wait_for
from tests.conftest import EXAMPLES
from tests.integration.test_single_router import run

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@pytest.fixture(scope="session")
def browser_installed() -> None:
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    if os.environ.get("ONCEMESH_NO_BROWSER_INSTALL"):
        pytest.skip("no chromium/chromedriver, and ONCEMESH_NO_BROWSER_INSTALL is set")
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "chromium", "chromium-driver"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if out.returncode != 0:  # (the package lists may be missing or stale)
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, env=env)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if out.returncode != 0 or not Path(CHROMEDRIVER).exists():
        pytest.fail(f"could not install Debian's chromium and chromium-driver for the console test (set "
                    f"ONCEMESH_NO_BROWSER_INSTALL=1 to skip it):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


@pytest.fixture
def browser(browser_installed: None, tmp_path: Path) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]'")
    os.environ.setdefault("SE_OFFLINE", "true")  # (Selenium Manager: never download a driver)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER,
                                                            log_output=str(tmp_path / "chromedriver.log")))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_console_shows_the_mesh_and_a_router_going_down(mesh_of: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    topo = tmp_path / "line3.toml"
    topo.write_text('[defaults]\nhttp_listen = "127.0.0.1:0"\nhttp_console = true\naudit_status_file = "audit.json"\n\n'
                    + (EXAMPLES / "line3.toml").read_text())
    # what `oncemesh audit` would write (the console reads any JSON object: verdict, violations)
    (tmp_path / "audit.json").write_text(json.dumps({"verdict": "FAIL", "updated": "2026-11-26T08:00:00Z",
                                                     "violations": [{"kind": "lost", "gid": "g-1"}]}))
    mesh = mesh_of(topo)
    url_a, _, url_c = mesh.urls()

    async def traffic() -> None:
        sub_c = await Client(url_c).start()
        pub_c = await Client(url_a).start()
        try:
            sub = sub_c.subscriber("orders.<b>eu</b>", "s1", expiry=600)  # (a name that is not HTML)
            await sub.wait_attached(20)
            pub = pub_c.publisher("orders.<b>eu</b>", "p")
            futs = [await pub.send(f"m{i}") for i in range(20)]
            assert len(await sub.get_many(20, timeout=20)) == 20
            for f in futs:
                assert (await asyncio.wait_for(f, 20)).accepted
            await sub.detach()
        finally:
            await pub_c.close()
            await sub_c.close()

    run(traffic())
    http_b = json.loads(mesh.ready_file("B").read_text())["http"]
    browser.get(f"http://{http_b}/console")
    wait = WebDriverWait(browser, 20, poll_frequency=0.1)

    # (the page redraws every second: read it in one script call, never through element handles
    # that the next redraw makes stale)
    def state(css: str) -> str | None:
        got: str | None = browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e && e.getAttribute('data-state')", css)
        return got

    def cells(css: str) -> list[str]:
        got: list[str] = browser.execute_script(
            "const r = document.querySelector(arguments[0]);"
            "return r ? Array.from(r.querySelectorAll('td'), td => td.textContent) : []", css)
        return got

    def text(css: str) -> str:
        got: str = browser.execute_script("const e = document.querySelector(arguments[0]); "
                                          "return e ? e.textContent : ''", css)
        return got

    wait.until(lambda _: all(state(f"#router-{r}") == "up" for r in "ABC")
               and state("#link-A-B") == "up" and state("#link-B-C") == "up")
    assert cells("#topics tr[data-topic]")[:3] == ["orders.<b>eu</b>", "fifo", "1"]  # shown as text, not HTML
    assert browser.execute_script("return document.querySelectorAll('#topics b').length") == 0
    assert cells("#subscriptions tr[data-sid]")[1:6] == [cells("#subscriptions tr[data-sid]")[1], "s1", "suspended",
                                                         "C", "0"]
    assert "3 of 3 routers up" in text("#status")
    assert "status: FAIL" in text("#audit") and '"kind":"lost"' in text("#violations")

    # messages published now wait for the suspended subscription (its home is C): rates and counts move
    stop = threading.Event()

    def publish() -> None:
        async def main() -> None:
            c = await Client(url_a).start()
            try:
                pub = c.publisher("orders.<b>eu</b>", "p2")
                for i in range(100):
                    await pub.send(f"x{i}")
                    await asyncio.sleep(0.02)
                while not stop.is_set():
                    await asyncio.sleep(0.05)
            finally:
                await c.close()

        asyncio.run(main())

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        def moving() -> bool:
            a, sub = cells("#row-A"), cells("#subscriptions tr[data-sid]")
            return len(a) > 5 and a[2] not in ("-", "0.0") and int(a[5]) > 0 and sub[5] not in ("-", "0")

        wait.until(lambda _: moving())  # A: received/s and in flight; C: the subscription's backlog

        killed = time.monotonic()
        mesh.kill_router("C")
        WebDriverWait(browser, 10, poll_frequency=0.05).until(
            lambda _: state("#router-C") == "down" and state("#link-B-C") == "down")
        seen = time.monotonic() - killed
    finally:
        stop.set()
        publisher.join(30)
    print(f"console: router C shown down {seen:.2f} s after its SIGKILL")
    assert seen < 5.0
    assert state("#router-A") == "up" and state("#link-A-B") == "up"
    assert "(down: C)" in text("#status")
    assert state("#row-C") == "down"
    shot = tmp_path / "console.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    artefacts = os.environ.get("ONCEMESH_ARTEFACTS")
    if artefacts:  # (a folder kept after the run: CI uploads it)
        Path(artefacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artefacts) / "console.png")
    print(f"console screenshot: {shot}")


def test_console_json_is_off_unless_asked_for_and_reads_the_audit_file(make_router: Any, tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    off = make_router("O", settings={"http_listen": "127.0.0.1:0"})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"http://{off.status()['http']}/console.json", timeout=10)
    assert ei.value.code == 404 and b"http_console = true" in ei.value.read()
    audit = tmp_path / "audit.json"
    on = make_router("P", settings={"http_listen": "127.0.0.1:0", "http_console": True,
                                    "audit_status_file": str(audit)})
    url = f"http://{on.status()['http']}/console.json"

    def get() -> tuple[dict[str, Any], Any]:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read()), r.headers

    doc, headers = get()
    assert headers["Access-Control-Allow-Origin"] == "*" and doc["router"] == "P"
    assert doc["audit"] == {"file": str(audit), "error": "not written yet (is the audit running?)"}
    audit.write_text(json.dumps({"status": "pass", "violations": [{"n": i} for i in range(30)]}))
    a = wait_for(lambda: get()[0]["audit"].get("status") and get()[0]["audit"], 10, "the audit file read again")
    assert (a["status"], a["violation_count"], len(a["violations"])) == ("pass", 30, 20)
    # the shape `oncemesh audit` writes (spark/audit.py): a count, the latest in recent_violations
    audit.write_text(json.dumps({"updated": 1795690000.0, "judgements": 60, "violations": 1,
                                 "recent_violations": [{"class": "duplicated", "gid": "g1"}]}))
    a = wait_for(lambda: get()[0]["audit"].get("violation_count") == 1 and get()[0]["audit"], 10,
                 "the audit's own status file")
    assert a["status"] == "1 violation(s)" and a["violations"] == [{"class": "duplicated", "gid": "g1"}]
    audit.write_text("[1, 2]")  # (the JSON is made at most twice a second: read until it changes)
    wait_for(lambda: get()[0]["audit"].get("error") == "not a JSON object", 10, "the broken audit file")
