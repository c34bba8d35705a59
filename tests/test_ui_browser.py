"""The operator's page in a real browser: Debian's Chromium, headless, driven by Selenium
through Debian's chromedriver (scripts/chromium installs both), against real servers, a real
agent and a real ZooKeeper. One browser serves the whole module.

Screenshots land in the test's directory, or in ``$BLOBSVC_UI_SCREENSHOTS`` when set (how
docs/images/ui-*.png are made: ``BLOBSVC_UI_SCREENSHOTS=docs/images pytest tests/test_ui_browser.py``).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from benchmarks.harness.agent import run_agent
from benchmarks.harness.zk import ZooKeeper, running_zookeeper
from blobsvc import BlobClient, Settings, new_job_id
from blobsvc.checkpoints import CheckpointAborted, CheckpointStore
from blobsvc.ui import page_link

from .conftest import ServerThread, with_secret

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Without the background-networking flags Chromium dials Google's services at start, which a
# closed network refuses (and a test must not try).
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
LAPTOP, PHONE = (1280, 900), (390, 844)
WAIT = 20.0  # seconds: the page refreshes every 5

zookeeper = pytest.fixture(scope="module")(running_zookeeper)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("chromium is not installed: scripts/chromium install")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium")  # a fresh profile: no state from another run
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={LAPTOP[0]},{LAPTOP[1]}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver: Any) -> list[str]:
    """The console's errors since the last call (reading the log empties it)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _wait(driver: Any, condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except WebDriverException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}, within {WAIT:g}s; the page says: {driver.find_element(By.TAG_NAME, 'body').text}")


def _text(driver: Any, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _screenshot(driver: Any, tmp_path: Path, name: str, size: tuple[int, int]) -> Path:
    """The whole page (up to 2,400 pixels high) at ``size``'s width, as a PNG."""
    folder = Path(os.environ.get("BLOBSVC_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(*size)
    time.sleep(0.3)  # a layout pass at the new width
    width, tall = driver.execute_script("return [window.innerWidth, document.documentElement.scrollHeight]")
    sideways = driver.execute_script("return document.documentElement.scrollWidth > window.innerWidth")
    assert not sideways, f"the page scrolls sideways at {size[0]} pixels"
    clip = {"x": 0, "y": 0, "width": width, "height": min(tall, 2400), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
    path = folder / f"ui-{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    # 64 colours are plenty for the page's flat colours, and a third of the bytes in docs/.
    image = Image.open(path).convert("RGB")
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    driver.set_window_size(*LAPTOP)
    return path


def _base(server: ServerThread) -> str:
    address = server.server.http_address
    assert address is not None
    return f"http://127.0.0.1:{address[1]}"


@pytest.fixture
def standalone(settings: Settings) -> Iterator[ServerThread]:
    beating = replace(settings, http_port="0", agent_heartbeat_interval=0.2, agent_lost_after=1.0)
    running = ServerThread(beating).start()
    yield running
    running.stop()


def test_the_page_shows_checkpoints_an_abort_with_its_reason_and_a_killed_agent_turning_lost(
    browser: Any, standalone: ServerThread, tmp_path: Path
) -> None:
    _console_errors(browser)
    job = new_job_id()
    with BlobClient(standalone.address, timeout=10) as client:
        client.put(b"a jar's bytes", job=job, name="lib/udfs.jar")
    with CheckpointStore(standalone.address, "orders", retain=5, timeout=30) as store:
        for batch in range(3):
            with store.begin(tasks=["0", "1"]) as pending:
                pending.acknowledge("0", store.snapshot("0", b"state %d" % batch))
                pending.acknowledge("1", store.snapshot("1", b"unchanged state" * 500))  # reused after the first
        with pytest.raises(CheckpointAborted), store.begin(tasks=["0", "1"]) as declined:
            declined.acknowledge("0", store.snapshot("0", b"x"))
            declined.decline("1", "disk full")
    with run_agent(standalone.address, tmp_path / "cache") as agent:
        browser.get(f"{_base(standalone)}/ui/")
        _wait(browser, lambda: "live" in _text(browser, "hosts"), "the agent is listed live")
        history = _text(browser, "history")
        assert history.count("completed") == 3 and "aborted" in history and "disk full" in history, history
        assert "standalone" in _text(browser, "role")
        assert "lib/udfs.jar" not in _text(browser, "jobs")  # names come on demand
        browser.find_element(By.XPATH, f"//tr[td[text()='{job}']]//button").click()
        _wait(browser, lambda: "lib/udfs.jar" in _text(browser, "jobs"), "the job's names show on demand")
        _screenshot(browser, tmp_path, "laptop", LAPTOP)
        _screenshot(browser, tmp_path, "phone", PHONE)
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait(10)
        _wait(browser, lambda: "lost" in _text(browser, "hosts"), "the killed agent turns lost")
        lost_cell = browser.find_element(By.CSS_SELECTOR, "#hosts tr.lost td")
        assert lost_cell.value_of_css_property("color") != browser.find_element(By.ID, "history").value_of_css_property(
            "color"
        )  # lost hosts stand out
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    assert _console_errors(browser) == []


def test_a_secret_server_shows_nothing_but_a_refusal_without_a_signed_link(
    browser: Any, settings: Settings, tmp_path: Path
) -> None:
    server = ServerThread(replace(with_secret(settings, tmp_path, b"page secret"), http_port="0")).start()
    try:
        base = _base(server)
        browser.delete_all_cookies()
        browser.get(f"{base}/ui/")
        body = browser.find_element(By.TAG_NAME, "body").text
        assert body.startswith("this page needs a signed link") and "\n" not in body.strip()
        assert browser.find_elements(By.ID, "overview") == []
        _console_errors(browser)  # the refused page's own 403
        browser.get(page_link(base, b"page secret", 60))
        _wait(browser, lambda: "standalone" in _text(browser, "role"), "the signed link opens the page")
        assert browser.current_url == f"{base}/ui/"  # the token left the address bar
        assert "page secret" not in browser.page_source and "signature" not in browser.page_source
        assert _console_errors(browser) == []
    finally:
        browser.delete_all_cookies()
        server.stop()


def test_a_standby_names_the_leader_and_links_to_its_page(browser: Any, zookeeper: ZooKeeper, tmp_path: Path) -> None:
    def ha(name: str) -> Settings:
        return Settings(
            host="127.0.0.1", port="0", http_port="0", data_dir=tmp_path / name, recovery_mode="zookeeper",
            zookeeper=zookeeper.hosts, cluster_id="ui", ha_dir=str(tmp_path / "ha"), zookeeper_session_timeout=2.0,
        )  # fmt: skip

    leader = ServerThread(ha("leader")).start()
    try:
        _wait(browser, lambda: leader.server.ha.status()["role"] == "leader", "the first server leads")
        standby = ServerThread(ha("standby")).start()
        try:
            _console_errors(browser)
            browser.get(f"{_base(standby)}/ui/")
            _wait(browser, lambda: leader.address in _text(browser, "standby"), "the standby names the leader")
            assert "standby" in _text(browser, "role")
            link = browser.find_element(By.CSS_SELECTOR, "#standby a").get_attribute("href")
            assert link.startswith("http://127.0.0.1:") and link.endswith("/ui/")
            assert _console_errors(browser) == []
        finally:
            standby.stop()
    finally:
        leader.stop()
