"""A real browser and a real JupyterLab, for the browser tests and ``mlsys-lab doctor``.

:func:`find_browser` finds the system's Chromium and its driver (Debian's ``chromium`` and
``chromium-driver`` packages; nothing is downloaded). :func:`chromium` starts it headless under
Selenium (``offline=True`` cuts it off the network). :func:`jupyter_lab` runs a JupyterLab server
on 127.0.0.1 with a token, on a free port, in a given folder, that trusts no notebook (as on a
fresh clone), and always stops it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrowserNotFound", "Lab", "chromium", "find_browser", "free_port", "jupyter_lab"]

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver", "chromium-driver")
INSTALL_HINT = ("install Chromium and its driver: `$(command -v sudo) apt-get install -y "
                "chromium chromium-driver` (Debian; Ubuntu: chromium-browser "
                "chromium-chromedriver)")


class BrowserNotFound(RuntimeError):
    """No Chromium (or no chromedriver) on this machine."""


def find_browser() -> tuple[str, str]:
    """Paths of the Chromium executable and of chromedriver; raises :class:`BrowserNotFound`."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = next((p for p in map(shutil.which, DRIVERS) if p), None)
    for candidate in ("/usr/lib/chromium/chromedriver", "/usr/lib/chromium-browser/chromedriver"):
        if driver is None and os.access(candidate, os.X_OK):
            driver = candidate
    if browser is None or driver is None:
        missing = "Chromium" if browser is None else "chromedriver"
        raise BrowserNotFound(f"{missing} not found; {INSTALL_HINT}")
    return browser, driver


@contextlib.contextmanager
def chromium(offline: bool = False, width: int = 1400, height: int = 1000):
    """A headless Chromium under Selenium (yielded: the WebDriver); always quit on exit.

    ``offline=True`` switches the network off (DevTools network emulation, and every http(s)
    request is blocked), so a page can only use what it carries."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = find_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="mlsys-lab-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_page_load_timeout(60)
        if offline:
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*"]})
            driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, script, what, timeout=10.0, poll=0.05, on_timeout=None):
    """Run ``script`` in the page every ``poll`` seconds until it returns something true, and
    return that; after ``timeout`` seconds call ``on_timeout()`` (a screenshot, say) and raise
    ``AssertionError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(poll)
    if on_timeout is not None:
        on_timeout()
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: ``url(path)`` opens ``path`` (relative to ``root``) in Lab."""

    root: Path
    port: int
    token: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "") -> str:
        return f"{self.base}/lab/tree/{path}?token={self.token}&reset"


@contextlib.contextmanager
def jupyter_lab(root: Path, timeout: float = 90.0):
    """Run ``jupyter lab`` serving ``root`` on 127.0.0.1 (free port, random token, no notebook
    trusted, settings and workspaces in a temporary folder); yields a :class:`Lab`. The server
    and its kernels are stopped on exit, whatever happened."""
    root = Path(root).resolve()
    port, token = free_port(), secrets.token_hex(16)
    home = Path(tempfile.mkdtemp(prefix="mlsys-lab-jupyter-"))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), PYTHONUNBUFFERED="1")
    # Kernels import this very mlsys_lab, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    (home / "settings" / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    # No "would you like news?" toast over the notebook.
    (home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
     ).write_text('{"fetchNews": "false", "checkForUpdates": false}')
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--NotebookNotary.db_file=:memory:", "--ServerApp.allow_root=True",
           "--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class="
           "jupyterlab.NeverCheckForUpdate"]
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError("jupyter lab exited: " +
                                   (home / "server.log").read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}",
                                            timeout=2):
                    break
            except OSError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError("jupyter lab did not start in time: " + (
                        home / "server.log").read_text(errors="replace")[-2000:]) from error
                time.sleep(0.3)
        yield Lab(root, port, token)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)
