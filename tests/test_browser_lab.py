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
from browser_contrast import low_contrast

from parallax_nb import labels
from parallax_nb.types import Architecture

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
    """User settings: no questions about news or updates (no network here), every cell kept in
    the DOM (JupyterLab's default "full" windowing detaches cells scrolled far away). Saving
    widget state with the notebook is left to the environment's default (scripts/bootstrap.sh
    turns it on in JupyterLab's overrides.json), which the reopen test relies on."""
    settings = {
        ("@jupyterlab/apputils-extension", "notification"): {"fetchNews": "false", "checkForUpdates": False,
                                                             "doNotDisturbMode": True},
        ("@jupyterlab/notebook-extension", "tracker"): {"windowingMode": "none"},
    }
    for (package, plugin), values in settings.items():
        folder = directory.joinpath(*package.split("/"))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    return directory


class Lab:
    """One JupyterLab server in its own process group, stopped by :meth:`stop`."""

    def __init__(self, root: pathlib.Path, log_path: pathlib.Path):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.marker = secrets.token_hex(8)     # in the environment of every process this server starts
        self.console: list[str] = []          # the page's console errors
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
  const out = {code: 0, executed: 0, errors: [], expected: [], kernel: w.sessionContext.session.kernel.status};
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    out.code += 1;
    if (c.executionCount) out.executed += 1;
    const tags = c.getMetadata('tags') || [];
    for (const o of c.outputs.toJSON()) {
      if (o.output_type !== 'error') continue;
      const line = `cell ${i}: ${o.ename}: ${o.evalue}`;
      (tags.includes('raises-exception') ? out.expected : out.errors).push(line);
    }
  }
  out.running = Array.from(document.querySelectorAll('.jp-InputArea-prompt'))
    .filter(p => p.textContent.includes('*')).length;
  return out;
}"""

VIEWS = {"profile": ".parallax-profile-view", "planner": ".parallax-planner-view", "run": ".parallax-run-view",
         "report": ".pxr"}
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


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


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def executed(lab, browser, test_output_dir):
    """The quickstart run top to bottom by JupyterLab's "run all cells", at 1024 px wide with
    the file browser open (the narrow case); yields (page, final cell state)."""
    page = browser.new_page(viewport={"width": 1024, "height": 900})
    page.on("console", lambda m: lab.console.append(m.text[:200]) if m.type == "error" else None)
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?reset&token={lab.token}")
    page.wait_for_function(JS_NOTEBOOK_READY, timeout=90_000, polling=500)
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
    yield page, state
    page.close()


def _set_theme(page, theme: str) -> None:
    page.evaluate(f"() => window.jupyterapp.commands.execute('apputils:change-theme', {{theme: '{THEMES[theme]}'}})")
    light = "true" if theme == "light" else "false"
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
    time.sleep(1.0)      # the theme's stylesheet applies after the attribute flips


def test_quickstart_runs_in_jupyterlab(lab, executed, test_output_dir):
    page, state = executed
    assert not state.get("errors"), f"cells raised in JupyterLab: {state['errors']}; console: {lab.console}"
    assert state.get("executed") == state.get("code"), (
        f"not every cell ran within {RUN_ALL_TIMEOUT_S} s: {json.dumps(state)}")
    assert len(state["expected"]) == 1 and "ConfigError: unparsable bandwidth 'fast'" in state["expected"][0]
    shown = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text="unparsable bandwidth").first.inner_text().strip().splitlines()
    assert len(shown) <= 2 and shown[0].startswith("ConfigError: "), shown     # one line and its hint

    planner = page.locator(".parallax-planner-view").first
    planner.wait_for(state="attached", timeout=30_000)
    assert planner.locator(".widget-slider").count() >= 2, "planner sliders did not render"
    assert planner.locator("table").count() >= 1, "planner cost table did not render"
    assert planner.locator("svg.parallax-chart").count() == 2, "planner charts did not render"
    # the per-variable table's box stays inside the planner (a wider table scrolls in it, never
    # past the view's edge), and what the plan decides (method, partitions, the bytes under each
    # method) is in sight without scrolling
    edges = planner.evaluate("v => { const t = v.querySelector('table'); const r = e => e.getBoundingClientRect().right;"
                             " return {view: r(v), box: r(t.parentElement),"
                             " headers: Array.from(t.querySelectorAll('th')).map(h => [h.innerText, r(h)])}; }")
    assert edges["box"] <= edges["view"] + 1, f"the planner's table spills past the view: {edges}"
    in_sight = [text for text, right in edges["headers"] if right <= edges["box"] + 1]
    assert len(in_sight) >= 5 and in_sight[1:3] == ["method", "partitions"], edges
    for view in ("profile", "planner", "run"):
        box = page.locator(VIEWS[view]).first.bounding_box()
        panel = page.locator(".jp-NotebookPanel").first.bounding_box()
        assert box["x"] + box["width"] <= panel["x"] + panel["width"] + 1, f"the {view} view overflows"

    run_view = page.locator(".parallax-run-view").first
    assert run_view.locator(".progress-bar").count() >= 1, "the run's progress bar did not render"
    status = run_view.locator(".parallax-run-status").first.inner_text()
    assert "done in" in status and status.count("done") == 1, status
    assert run_view.locator("svg.parallax-chart").count() == 3
    assert (lab.root / "quickstart_report.html").is_file(), "the notebook did not save its report"


def test_planner_keeps_the_last_valid_plan_on_bad_input(executed):
    """Typed in the browser: a negative latency, a bandwidth without units, a partition count of
    0, and a click on "async" for a plan with AllReduce variables. Each shows its error in the
    user's terms, and the cards still show the last valid plan."""
    page, _ = executed
    planner = page.locator(".parallax-planner-view").first
    planner.scroll_into_view_if_needed()
    cards = planner.locator(".parallax-comm").first.inner_text()
    error = planner.locator(".parallax-error").first
    boxes = planner.locator(".widget-text input")   # bandwidth, latency (µs), max staleness, partitions
    assert boxes.count() == 4
    cases = [(0, "fast", "unparsable bandwidth 'fast'"), (1, "-5", "-5 µs"), (3, "0", "got 0")]
    for index, bad, expected in cases:
        box = boxes.nth(index)
        good = box.input_value()
        box.fill(bad)
        box.press("Enter")
        error.wait_for(state="visible", timeout=30_000)
        text = error.inner_text()
        assert expected in text and "last valid plan" in text, (bad, text)
        assert "latency_s" not in text and "e-06" not in text, (bad, text)
        assert planner.locator(".parallax-comm").first.inner_text() == cards, f"{bad!r} changed the plan shown"
        box.fill(good)
        box.press("Enter")
        error.wait_for(state="hidden", timeout=30_000)
        assert planner.locator(".parallax-comm").first.inner_text() == cards, f"restoring {good!r} changed the plan"
    # asynchronous training of a plan with AllReduce variables: refused in words, plan kept
    planner.get_by_role("button", name="async", exact=True).click()
    error.wait_for(state="visible", timeout=30_000)
    text = error.inner_text()
    assert "asynchronous training applies to PS variables only" in text and "last valid plan" in text, text
    assert planner.locator(".parallax-comm").first.inner_text() == cards
    planner.get_by_role("button", name="sync", exact=True).click()
    error.wait_for(state="hidden", timeout=30_000)


def test_an_asynchronous_plans_training_card_shows_the_straggler_outlook_in_both_themes(executed, test_output_dir):
    """PS, then "async" in the browser: the training card says what one worker 2x slower does
    to sync and async examples/s, readable (4.5:1) in the light and the dark theme; screenshots
    of the cards in test-output/. Back to HYBRID and sync afterwards."""
    page, _ = executed
    planner = page.locator(".parallax-planner-view").first
    planner.scroll_into_view_if_needed()
    card = planner.locator(".parallax-sync").first
    planner.get_by_role("button", name=labels.text(Architecture.PS), exact=True).first.click()   # not the method's
    planner.get_by_role("button", name="async", exact=True).click()
    page.wait_for_function("s => document.querySelector(s) && document.querySelector(s).innerText"
                           ".includes('With one worker 2x slower per step')", arg=".parallax-planner-view .parallax-sync",
                           timeout=30_000)
    text = card.inner_text()
    assert "asynchronous" in text and "unbounded staleness" in text and "examples/s (" in text, text
    # the value in the big type fits one line, as the other cards' figures do (it took three)
    value = card.locator("xpath=./div[2]")
    assert value.inner_text().strip() == "asynchronous"
    assert value.bounding_box()["height"] < 1.6 * planner.locator(".parallax-speedup-ps").first.locator(
        "xpath=./div[2]").bounding_box()["height"], value.bounding_box()
    try:
        for theme in ("light", "dark"):
            _set_theme(page, theme)
            card.evaluate("e => e.scrollIntoView({block: 'center'})")
            time.sleep(0.3)
            planner.locator(".parallax-comm").first.locator("xpath=..").screenshot(
                path=str(test_output_dir / f"browser_lab_async_outlook_{theme}.png"))
            low, measured = low_contrast(page, ".parallax-planner-view .parallax-sync")
            assert measured > 2 and not low, (theme, measured, low)
    finally:
        _set_theme(page, "light")
        planner.get_by_role("button", name="sync", exact=True).click()
        planner.get_by_role("button", name=labels.text(Architecture.HYBRID), exact=True).click()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_views_are_readable_in_light_and_dark_themes(executed, theme, test_output_dir):
    page, _ = executed
    _set_theme(page, theme)
    page.set_viewport_size({"width": 1024, "height": 2400})      # room for whole widgets
    for view, selector in VIEWS.items():
        element = page.locator(selector).first
        element.evaluate("e => e.scrollIntoView({block: 'start'})")
        time.sleep(0.3)
        box = element.bounding_box()      # the report is taller than the window: its first screenful
        clip = {"x": box["x"], "y": max(box["y"], 0), "width": box["width"],
                "height": min(box["height"], 2400 - max(box["y"], 0))}
        page.screenshot(path=str(test_output_dir / f"browser_lab_{view}_{theme}.png"), clip=clip)
    low, measured = low_contrast(page, ", ".join(list(VIEWS.values()) + [".parallax-phase-view"]))
    assert measured > 200, f"too little text measured: {measured}"
    assert not low, f"{len(low)} of {measured} texts under 4.5:1 in the {theme} theme: {low[:12]}"
    page.set_viewport_size({"width": 1024, "height": 900})
    if theme == "dark":
        _set_theme(page, "light")


def test_saved_notebook_reopens_with_every_view(lab, browser, executed, test_output_dir):
    """Saved in JupyterLab, the kernel shut down, the notebook opened in a fresh page: every
    view is there from what was saved (no "model not found"), and the saved file carries each
    view's HTML snapshot for renderers without widgets (GitHub, nbviewer, nbconvert)."""
    page, _ = executed
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    saved = json.loads((lab.root / NOTEBOOK.name).read_text())
    snapshots = [o["data"]["text/html"] for c in saved["cells"] for o in c.get("outputs", [])
                 if "parallax-snapshot" in "".join(o.get("data", {}).get("text/html", ""))]
    for css_class in ("parallax-profile-snapshot", "parallax-planner-snapshot", "parallax-run-snapshot"):
        assert any(css_class in "".join(html) for html in snapshots), f"no {css_class} in the saved notebook"
    request = urllib.request.Request(f"{lab.url}/api/kernels", headers={"Authorization": f"token {lab.token}"})
    for kernel in json.loads(urllib.request.urlopen(request, timeout=10).read()):
        urllib.request.urlopen(urllib.request.Request(f"{lab.url}/api/kernels/{kernel['id']}", method="DELETE",
                                                      headers={"Authorization": f"token {lab.token}"}), timeout=30)
    page.close()
    fresh = browser.new_page(viewport={"width": 1024, "height": 2400})
    try:
        fresh.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?reset&token={lab.token}")
        fresh.wait_for_selector(".parallax-run-view svg.parallax-chart", timeout=90_000)
        text = fresh.locator(".jp-Notebook").first.inner_text()
        assert "model not found" not in text
        for view in ("profile", "planner", "run"):
            assert fresh.locator(f"{VIEWS[view]} svg.parallax-chart").count() >= 1, f"{view} view missing"
        assert "done in" in fresh.locator(".parallax-run-status").first.inner_text()
        fresh.locator(VIEWS["run"]).first.screenshot(path=str(test_output_dir / "browser_lab_reopened_run.png"))
    finally:
        fresh.close()


# A model of 1,000 variables (a sparse table in five; the planner benchmark's, built without
# TensorFlow): the planner's stated scale, where the views list the largest TABLE_ROWS variables.
MANY_SOURCE = f'''\
import sys
sys.path.insert(0, {str(REPO / "benchmarks")!r})
import parallax_nb as px
from bench_planner import synthetic_profile
from parallax_nb.widgets import ProfileView
many = synthetic_profile(1000)
display(ProfileView(many))
px.plan(many, machines=8, workers_per_machine=4, bandwidth="10Gbit/s", architecture="auto")
'''


def test_a_thousand_variables_in_jupyterlab_list_the_largest_readably_in_both_themes(lab, browser, test_output_dir):
    """A notebook of 1,000 variables in JupyterLab: the profile's and the planner's tables each
    show TABLE_ROWS rows under a note naming where every variable is, each table scrolls in a
    box of its own with its header row in sight, AUTO's reasons are those of the variables
    listed (not 1,001 lines), and every text of both views
    reads at 4.5:1 in the light and the dark theme; screenshots in test-output/."""
    from parallax_nb.widgets.style import TABLE_ROWS

    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": MANY_SOURCE.splitlines(keepends=True)}
    notebook = {"cells": [cell], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "many.ipynb").write_text(json.dumps(notebook))
    page = browser.new_page(viewport={"width": 1024, "height": 900})
    try:
        page.goto(f"{lab.url}/lab/tree/many.ipynb?reset&token={lab.token}")
        page.wait_for_function(JS_NOTEBOOK_READY, timeout=90_000, polling=500)
        page.evaluate(JS_RUN_ALL)
        page.wait_for_selector(".parallax-planner-view table", timeout=120_000)
        state = page.evaluate(JS_CELL_STATE)
        assert not state["errors"], state["errors"]
        profile, planner = (page.locator(VIEWS[v]).first for v in ("profile", "planner"))
        for view, note in ((profile, "profile.dataframe()"), (planner, "planner.table")):
            rows = view.locator("table tbody tr")
            assert rows.count() == TABLE_ROWS, (note, rows.count())
            # the note says which rows these are before the first of them, not after the 100th
            caption = view.locator("div", has_text=f"The {TABLE_ROWS} ").filter(has_text=note).last
            assert caption.bounding_box()["y"] < rows.first.bounding_box()["y"], note
        reasons = planner.locator(".parallax-explanations li")
        assert reasons.count() <= TABLE_ROWS + 4, reasons.count()      # not one per variable: 1,001 lines
        assert planner.locator(".parallax-explanations ul").bounding_box()["height"] < 600   # and in a box of its own
        for view in (profile, planner):
            # the table scrolls in a box of its own, its header row in sight at any row
            box = view.locator("table").first.evaluate(
                "t => { let e = t; while (e && getComputedStyle(e).maxHeight === 'none') e = e.parentElement;"
                " if (!e) return null; e.scrollTop = e.scrollHeight / 2;"
                " const b = e.getBoundingClientRect(), h = t.querySelector('th').getBoundingClientRect();"
                " return {height: b.height, top: b.top, header: h.top, scrolled: e.scrollTop}; }")
            assert box and box["height"] < 600 and box["scrolled"] > 1000, box
            assert abs(box["header"] - box["top"]) < 2, box
        try:
            for theme in ("light", "dark"):
                _set_theme(page, theme)
                for name, view in (("profile", profile), ("planner", planner)):
                    view.locator("table").first.evaluate("e => e.parentElement.scrollIntoView({block: 'center'})")
                    time.sleep(0.3)
                    page.screenshot(path=str(test_output_dir / f"browser_lab_1000_{name}_{theme}.png"))
                planner.locator(".parallax-explanations").evaluate("e => e.scrollIntoView({block: 'start'})")
                time.sleep(0.3)
                page.screenshot(path=str(test_output_dir / f"browser_lab_1000_reasons_{theme}.png"))
                low, measured = low_contrast(page, f"{VIEWS['profile']}, {VIEWS['planner']}")
                assert measured > 200 and not low, (theme, measured, low[:12])
        finally:
            _set_theme(page, "light")
    finally:
        page.close()
