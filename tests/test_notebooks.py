"""Both notebooks, executed top to bottom in a fresh kernel with nbclient.

The quickstart runs through ``python -m parallax_nb quickstart -o DIR`` (the README's main
job): it trains on 2 real MPI engines and must leave its report (HTML, CSV, JSON) and the
executed notebook in DIR, with no error cell, its widgets in the outputs, and no engine or
controller process left behind. The paper-scale notebook must run in under 3 minutes.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

pytestmark = [pytest.mark.notebook]

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")


def _env(marker: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PARALLAX_TEST_MARKER"] = marker        # inherited by the kernel, the controller and the engines
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _processes_with(marker: str) -> list:
    """Live processes whose environment carries ``marker`` (started by this test)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.pid != os.getpid() and p.environ().get("PARALLAX_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _assert_no_leftovers(marker: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    left = _processes_with(marker)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _processes_with(marker)
    if left:
        description = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for p in left:              # ours (they carry this test's marker): do not leak them
            try:
                p.kill()
            except Exception:
                pass
        pytest.fail(f"processes left running after the notebook: {description}")


def _outputs(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


def _raises(cell) -> bool:
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def _assert_clean(nb) -> None:
    """No error output except in cells tagged raises-exception, whose error must be short: a
    ParallaxError shown as its message and hint, not a traceback."""
    errors = [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code" and not _raises(c)
              for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    for cell in (c for c in nb.cells if c.cell_type == "code" and _raises(c)):
        shown = [o for o in cell.outputs if o.output_type == "error"]
        assert len(shown) == 1, f"{cell.source[:60]!r} should raise once"
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown[0].traceback]
        assert len(lines) <= 2 and lines[0].startswith(f"{shown[0].ename}: "), lines
        assert not any("File " in line or "Traceback" in line for line in lines), lines
    unexecuted = [c.source[:60] for c in nb.cells if c.cell_type == "code" and c.execution_count is None]
    assert not unexecuted, f"cells not executed: {unexecuted}"


def _widget_reprs(nb) -> str:
    return "\n".join(str(o.data.get("text/plain", "")) for o in _outputs(nb)
                     if o.output_type in ("display_data", "execute_result") and WIDGET_MIME in o.get("data", {}))


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_quickstart_command_runs_the_notebook_on_two_engines(tmp_path):
    marker = uuid.uuid4().hex
    out = tmp_path / "quickstart-output"
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "parallax_nb", "quickstart", "-o", str(out)],
                              cwd=tmp_path, env=_env(marker), capture_output=True, text=True, timeout=420)
    finally:
        _assert_no_leftovers(marker)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    executed = out / "quickstart.ipynb"
    report = out / "quickstart_report.html"
    for path in (executed, report, report.with_suffix(".csv"), report.with_suffix(".json")):
        assert path.is_file(), f"{path} missing"
        assert str(path) in proc.stdout, f"the command did not print {path}"
    nb = nbformat.read(executed, as_version=4)
    _assert_clean(nb)
    widgets = _widget_reprs(nb)
    for view in ("ProfileView", "PlannerView", "RunView"):
        assert view in widgets, f"no {view} in the executed quickstart"
    _assert_static_snapshots(nb, tmp_path)

    data = json.loads(report.with_suffix(".json").read_text())
    assert data["schema"] == "parallax_nb.report"
    measured = data["measured"]
    assert measured is not None, "the report has no run in it"
    assert measured["run"]["ranks"] == 2 and measured["run"]["steps"] > 0
    assert "lm-tiny" in report.read_text()
    print(f"quickstart command: {elapsed:.0f} s")


SNAPSHOTS = {"ProfileView": "parallax-profile-snapshot", "PlannerView": "parallax-planner-snapshot",
             "RunView": "parallax-run-snapshot"}


def _assert_static_snapshots(nb, tmp_path) -> None:
    """Every view's output carries its final state as HTML with inline SVG charts, and
    ``nbconvert --to html`` of the notebook as JupyterLab saves it by default (no widget
    state) shows them: what GitHub, nbviewer or a reopened notebook show without a kernel."""
    found = {}
    for o in _outputs(nb):
        data = o.get("data", {})
        kind = str(data.get("text/plain", "")).split(":", 1)[0]
        if WIDGET_MIME in data and kind in SNAPSHOTS:
            html = data.get("text/html", "")
            assert SNAPSHOTS[kind] in html and "<svg" in html and "<script" not in html.lower(), kind
            found[kind] = html
    assert set(found) == set(SNAPSHOTS), f"views without a snapshot: {set(SNAPSHOTS) - set(found)}"
    assert "done in" in found["RunView"], "the run's snapshot is not its final state"
    plain = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    plain.metadata.pop("widgets", None)
    saved = tmp_path / "saved_without_widget_state.ipynb"
    nbformat.write(plain, saved)
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(saved)], check=True,
                   capture_output=True, timeout=120)
    page = saved.with_suffix(".html").read_text()
    for kind, css_class in SNAPSHOTS.items():
        assert css_class in page, f"nbconvert --to html does not show the {kind} snapshot"
    assert len(re.findall(r'<svg [^>]*class="parallax-chart', page)) >= 6     # nbconvert reorders attributes
    assert "ConfigError" in page and "unparsable bandwidth" in page


@pytest.mark.timeout(300)
def test_paper_scale_notebook(tmp_path):
    from parallax_nb.cli.quickstart import execute_notebook

    marker = uuid.uuid4().hex
    start = time.monotonic()
    executed = execute_notebook(NOTEBOOKS / "paper_scale.ipynb", tmp_path, cell_timeout=240, env=_env(marker))
    elapsed = time.monotonic() - start
    _assert_no_leftovers(marker)
    nb = nbformat.read(executed, as_version=4)
    _assert_clean(nb)
    assert "PlannerView" in _widget_reprs(nb)
    assert any("image/png" in o.get("data", {}) for o in _outputs(nb)), "the scaling chart is missing"
    text = "\n".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream")
    assert "HYBRID = AR" in text and "faster per step" in text
    # HYBRID against the baselines the paper compares with, at the paper's testbed
    for model in ("LM1B", "ResNet-50"):
        for baseline in ("plain Horovod (defaults)", "TF parameter servers"):
            assert re.search(rf"{model} on 8 x 6 GPUs at 100Gbit/s: HYBRID runs a step [\d.]+x as fast as {re.escape(baseline)};",
                             text), text
    assert elapsed < 180, f"paper_scale.ipynb took {elapsed:.0f} s (budget 180 s)"


def test_quickstart_command_reports_a_failing_notebook(tmp_path):
    """A cell that raises fails the command with one line naming it, and leaves the executed copy."""
    bad = tmp_path / "bad.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nbformat.write(nb, bad)
    proc = subprocess.run([sys.executable, "-m", "parallax_nb", "quickstart", "--notebook", str(bad),
                           "-o", str(tmp_path / "out")], env=_env(uuid.uuid4().hex), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "ZeroDivisionError" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "out" / "bad.ipynb").is_file()
