"""The HTML cost report, opened from a file:// path in headless Chromium (Debian's chromium,
driven by Playwright; no browser is downloaded): it renders its tables and embedded charts,
asks no other host for anything, logs no console error and runs no script, even with a
variable named ``<script>alert(1)</script>``. A screenshot is left in test-output/."""
import dataclasses
import os
import pathlib

import pytest

from parallax_nb import cost
from parallax_nb.plan import make_plan
from parallax_nb.report import report
from parallax_nb.report.build import run_cluster
from parallax_nb.types import ClusterSpec

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
EVIL = "<script>alert(1)</script>"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install -y chromium"),
]


@pytest.fixture(scope="module")
def report_file(test_output_dir):
    """A real report: tiny-LM profile (one variable renamed to a script tag), AUTO plan for
    8 machines x 2 workers, and a 2-rank run summary 10% above the model's bytes."""
    from parallax_nb.profile import profile_job
    from parallax_nb.workloads import lm_job

    prof = profile_job(lm_job("tiny"), steps=5)
    prof = dataclasses.replace(prof, variables=(dataclasses.replace(prof.variables[0], name=EVIL),
                                                *prof.variables[1:]))
    plan = make_plan(prof, ClusterSpec.create(machines=8, workers_per_machine=2, bandwidth="10Gbit/s"), "auto")
    est = cost.estimate(prof, plan, cluster=run_cluster(plan.cluster, 2))
    variables = {c.name: {"method": m.value, "kind": c.kind.value, "partitions": plan.partitions(c.name),
                          "bytes_sent_per_step": 0.55 * c.bytes_for(m), "bytes_received_per_step": 0.55 * c.bytes_for(m)}
                 for c, m in zip(est.variables, est.methods)}
    run = {"schema": "parallax_nb.run", "schema_version": 1, "ranks": 2, "machines": 1, "workers_per_machine": 2,
           "architecture": "auto", "steps": 5, "batch_size_per_rank": prof.batch_size,
           "step_time_s_median": 1.2 * est.step_time_s, "examples_per_s_median": 2 * prof.batch_size / est.step_time_s,
           "final_loss": 6.9, "variables": variables,
           "bytes_sent_per_step": 0.55 * est.bytes_per_machine_per_step,
           "bytes_received_per_step": 0.55 * est.bytes_per_machine_per_step}
    files = report(prof, plan, run, notes=f"browser test {EVIL}").save(test_output_dir / "report_browser.html")
    return files, prof


def test_report_renders_from_disk_with_no_other_host_and_no_console_error(report_file, test_output_dir):
    sync_api = pytest.importorskip("playwright.sync_api")
    files, prof = report_file
    requests, console_errors, dialogs = [], [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.on("request", lambda r: requests.append(r.url))
            page = context.new_page()
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(pathlib.Path(files.html).resolve().as_uri(), wait_until="load")

            table = page.locator("table.variables")
            assert table.is_visible()
            rows = table.locator("tbody tr")
            assert rows.count() == len(prof.variables)
            assert rows.nth(0).locator("td").nth(0).inner_text() == EVIL  # shown as text, in its row
            assert page.locator("table.architectures tbody tr").count() == 7   # 4 architectures, 3 baselines
            assert page.locator("table.measured").is_visible()
            images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
            assert len(images) == 2 and all(done and w > 100 and h > 100 for done, w, h in images), images
            assert page.evaluate("document.scripts.length") == 0
            page.screenshot(path=str(test_output_dir / "report_browser.png"), full_page=True)
        finally:
            browser.close()
    assert requests, "the browser recorded no request at all"
    assert all(url.startswith(("file://", "data:")) for url in requests), requests
    assert console_errors == []
    assert dialogs == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_report_follows_the_browsers_colour_scheme(report_file, test_output_dir, scheme):
    """Opened from disk with the browser preferring light or dark: every text of the page
    reads at 4.5:1 or more against what it sits on, and the page background follows."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from browser_contrast import low_contrast

    files, _ = report_file
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1024, "height": 900}, color_scheme=scheme)
            page.goto(pathlib.Path(files.html).resolve().as_uri(), wait_until="load")
            background = page.evaluate("getComputedStyle(document.querySelector('.pxr')).backgroundColor")
            dark = [int(v) for v in background[background.index("(") + 1:-1].split(",")[:3]]
            assert (max(dark) < 60) == (scheme == "dark"), background
            low, measured = low_contrast(page, ".pxr")
            assert measured > 100 and not low, f"{len(low)} of {measured} texts under 4.5:1: {low[:10]}"
            page.screenshot(path=str(test_output_dir / f"report_browser_{scheme}.png"), full_page=True)
        finally:
            browser.close()
