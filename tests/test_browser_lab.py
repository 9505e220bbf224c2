"""The quickstart in a real JupyterLab, driven by headless Chromium through Playwright.

Starts JupyterLab on 127.0.0.1 with a random port and token (its root a temporary folder
holding a copy of notebooks/quickstart.ipynb), opens the notebook, runs every cell through
JupyterLab's own "run all cells" command, and checks in the DOM that the planner widget and
the run's progress widget rendered and that no cell raised. Leaves screenshots in the test
output folder. Uses Debian's /usr/bin/chromium; never downloads a browser.
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
RUN_ALL_TIMEOUT_S = 240

pytestmark = [pytest.mark.browser, pytest.mark.notebook, pytest.mark.cluster, pytest.mark.timeout(360)]

playwright_api = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status


def _quiet_settings(directory: pathlib.Path) -> pathlib.Path:
    """User settings: no questions about news or updates (no network here), and every cell kept
    in the DOM (JupyterLab's default "full" windowing detaches cells scrolled far away)."""
    settings = {
        ("apputils-extension", "notification"): {"fetchNews": "false", "checkForUpdates": False,
                                                 "doNotDisturbMode": True},
        ("notebook-extension", "tracker"): {"windowingMode": "none"},
    }
    for (package, plugin), values in settings.items():
        folder = directory / "@jupyterlab" / package
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    return directory


class Lab:
    """One JupyterLab server in its own process group, stopped by :meth:`stop`."""

    def __init__(self, root: pathlib.Path, log_path: pathlib.Path):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.marker = secrets.token_hex(8)     # in the environment of every process this server starts
        self.root = root
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["JUPYTER_RUNTIME_DIR"] = str(root / ".runtime")
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(root / ".workspaces")
        env["PARALLAX_QUICKSTART_REPORT"] = str(root / "quickstart_report.html")
        env["PARALLAX_TEST_MARKER"] = self.marker
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
             f"--LabServerApp.workspaces_dir={root / '.workspaces'}",
             f"--LabServerApp.user_settings_dir={_quiet_settings(root / '.settings')}",
             "--LabApp.extension_manager=readonly", "--ServerApp.allow_remote_access=False",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}; see {self.log.name}")
            try:
                if _get(f"{self.url}/api/status?token={self.token}") == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer within {timeout_s:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        """Ask the server to shut down (it stops its kernels), then end its process group."""
        if self.process.poll() is None:
            try:
                request = urllib.request.Request(f"{self.url}/api/shutdown", method="POST",
                                                 headers={"Authorization": f"token {self.token}"})
                urllib.request.urlopen(request, timeout=5).close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=10)
        self.log.close()

    def leftovers(self, within_s: float = 30.0) -> list[str]:
        """Processes started by this server (kernel, controller, engines) still alive after ``within_s``."""
        import psutil

        def marked():
            found = []
            for p in psutil.process_iter(["pid"]):
                try:
                    if p.environ().get("PARALLAX_TEST_MARKER") == self.marker:
                        found.append(p)
                except (psutil.Error, OSError):
                    continue
            return found

        deadline = time.monotonic() + within_s
        left = marked()
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            left = marked()
        description = []
        for p in left:          # ours (they carry this server's marker): do not leak them
            try:
                description.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
                p.kill()
            except psutil.Error:
                pass
        return description


# JavaScript run in the page, against the app that --LabApp.expose_app_in_browser puts on window.
JS_NOTEBOOK_READY = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  return !!(w && w.content && w.content.model && w.sessionContext && w.sessionContext.session
            && w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle');
}"""
JS_RUN_ALL = "() => window.jupyterapp.commands.execute('notebook:run-all-cells')"
JS_CELL_STATE = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = w.content.model.cells;
  const out = {code: 0, executed: 0, errors: [], kernel: w.sessionContext.session.kernel.status};
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    out.code += 1;
    if (c.executionCount) out.executed += 1;
    for (const o of c.outputs.toJSON()) {
      if (o.output_type === 'error') out.errors.push(`cell ${i}: ${o.ename}: ${o.evalue}`);
    }
  }
  out.running = document.querySelectorAll('.jp-InputArea-prompt').length
    ? Array.from(document.querySelectorAll('.jp-InputArea-prompt')).filter(p => p.textContent.includes('*')).length : 0;
  return out;
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, test_output_dir):
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    server = Lab(root, test_output_dir / "browser_lab_server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    left = server.leftovers()
    assert not left, f"processes left running after JupyterLab shut down: {left}"


def test_quickstart_runs_in_jupyterlab(lab, test_output_dir):
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console_errors: list[str] = []
            page.on("console", lambda m: console_errors.append(m.text[:200]) if m.type == "error" else None)
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?reset&token={lab.token}")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=90_000, polling=500)
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")

            start = time.monotonic()
            page.evaluate(JS_RUN_ALL)
            state = {}
            while time.monotonic() - start < RUN_ALL_TIMEOUT_S:
                state = page.evaluate(JS_CELL_STATE)
                if state["errors"]:
                    break
                if state["executed"] == state["code"] and state["kernel"] == "idle" and not state["running"]:
                    break
                time.sleep(1.0)
            page.screenshot(path=str(test_output_dir / "browser_lab_quickstart.png"))
            assert not state.get("errors"), f"cells raised in JupyterLab: {state['errors']}; console: {console_errors}"
            assert state.get("executed") == state.get("code"), (
                f"not every cell ran within {RUN_ALL_TIMEOUT_S} s: {json.dumps(state)}")

            page.set_viewport_size({"width": 1400, "height": 2000})   # room for whole widgets
            planner = page.locator(".parallax-planner-view").first
            planner.wait_for(state="attached", timeout=30_000)
            assert planner.locator(".widget-slider").count() >= 2, "planner sliders did not render"
            assert planner.locator("table").count() >= 1, "planner cost table did not render"
            assert planner.locator("img").count() >= 1, "planner chart did not render"
            planner.scroll_into_view_if_needed()
            planner.screenshot(path=str(test_output_dir / "browser_lab_planner.png"))

            # the widget is live: a bad bandwidth typed in the browser shows the planner's error box
            bandwidth = planner.locator(".widget-text input").first
            bandwidth.fill("fast")
            bandwidth.press("Enter")
            error = planner.locator(".parallax-error").first
            error.wait_for(state="visible", timeout=30_000)
            assert "fast" in error.inner_text()
            bandwidth.fill("10Gbit/s")
            bandwidth.press("Enter")
            error.wait_for(state="detached", timeout=30_000)

            run_view = page.locator(".parallax-run-view").first
            run_view.wait_for(state="attached", timeout=30_000)
            assert run_view.locator(".progress-bar").count() >= 1, "the run's progress bar did not render"
            assert "done" in run_view.locator(".parallax-run-status").first.inner_text(), \
                "the run view does not show the run as done"
            run_view.scroll_into_view_if_needed()
            run_view.screenshot(path=str(test_output_dir / "browser_lab_run.png"))
            assert (lab.root / "quickstart_report.html").is_file(), "the notebook did not save its report"
        finally:
            browser.close()
