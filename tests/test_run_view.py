"""RunView reads a Run model: drive the model by hand, read the widget state (no browser, no
cluster); the last test runs the journey in a real kernel and reads the phases its widgets sent."""
import datetime
import time

import pytest

pytest.importorskip("ipywidgets")

from parallax_nb.cluster.handle import Run  # noqa: E402
from parallax_nb.errors import DistributedError  # noqa: E402
from parallax_nb.plan import make_plan  # noqa: E402
from parallax_nb.types import ClusterSpec, Profile, VariableProfile  # noqa: E402
from parallax_nb.widgets.run_view import RunView  # noqa: E402
from conftest import shown_text  # noqa: E402


def _profile() -> Profile:
    emb = VariableProfile(name="embedding/embeddings", shape=(1000, 16), dtype="float32", size_bytes=64000,
                          kind="sparse", rows_touched_mean=50, alpha_mean=0.05, alpha_p50=0.05, alpha_p95=0.06,
                          alpha_max=0.07, grad_bytes_per_step=50 * 64 + 50 * 8,
                          union_rows_by_workers=(50, 95, 135, 170, 200, 228, 252, 275))
    dense = VariableProfile(name="dense/kernel", shape=(16, 16), dtype="float32", size_bytes=1024, kind="dense",
                            rows_touched_mean=16, alpha_mean=1.0, alpha_p50=1.0, alpha_p95=1.0, alpha_max=1.0,
                            grad_bytes_per_step=1024, union_rows_by_workers=(16,) * 8)
    return Profile(model_name="toy", batch_size=8, steps=5, step_time_s=0.01, peak_memory_bytes=0,
                   variables=(emb, dense))


def assert_svg_charts(html: str, count: int) -> None:
    """``count`` well-formed inline SVG charts (what replaced the PNG)."""
    import re
    import xml.etree.ElementTree as ET

    charts = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert len(charts) == count, html[:300]
    for chart in charts:
        assert ET.fromstring(chart).tag.endswith("svg")


def _record(step, loss, sent=3000.0, received=1000.0):
    return {"step": step, "loss": loss, "examples_per_s": 100.0 + step, "step_time_s": 0.05,
            "bytes_sent": sent, "bytes_received": received,
            "bytes_by_variable": {"embedding/embeddings": (sent - 1000.0, received - 500.0),
                                  "dense/kernel": (1000.0, 500.0)}}


@pytest.fixture
def planned_run():
    profile = _profile()
    plan = make_plan(profile, ClusterSpec.create(machines=2), architecture="hybrid")
    return Run(plan=plan, steps=10, engines=2, profile=profile), plan


def test_progress_status_and_charts_follow_records(planned_run):
    run, _ = planned_run
    view = RunView(run, redraw_s=0.0)
    assert view.progress.value == 0 and view.progress.max == 10
    assert "starting" in view.status_text()
    run.set_status("running")
    run.add_records([_record(1, 5.0), _record(2, 4.5), _record(3, 4.0)])
    assert view.progress.value == 3
    data = view.chart_data()
    assert data["step"] == [1, 2, 3]
    assert data["loss"] == [5.0, 4.5, 4.0]
    assert data["examples_per_s"] == [101.0, 102.0, 103.0]
    assert data["bytes_per_step"] == [4000.0, 4000.0, 4000.0]   # sent + received
    assert_svg_charts(view.charts.value, 3)
    assert "loss 4.0000" in view.status_text() and "3/10 steps" in view.status_text()
    # records of another rank and duplicates do not change rank 0's history
    run.add_records([_record(4, 1.0)], rank=1)
    run.add_records([_record(3, 4.0)])
    assert view.chart_data()["step"] == [1, 2, 3]
    history = run.history
    assert list(history["step"]) == [1, 2, 3] and history["bytes_per_step"].iloc[-1] == 4000.0


def test_bytes_table_predicted_vs_measured(planned_run):
    run, plan = planned_run
    view = RunView(run, redraw_s=0.0)
    run.add_records([_record(1, 5.0, sent=3000.0), _record(2, 4.0, sent=5000.0)])
    rows = {r["name"]: r for r in view.bytes_rows()}
    assert set(rows) == {"embedding/embeddings", "dense/kernel"}
    assert rows["embedding/embeddings"]["method"] == "ps" and rows["dense/kernel"]["method"] == "ar"
    # measured: mean over steps of sent + received; embedding (2000+500, 4000+500) -> 3500
    assert rows["embedding/embeddings"]["measured_bytes_per_step"] == pytest.approx(3500.0)
    assert rows["dense/kernel"]["measured_bytes_per_step"] == pytest.approx(1500.0)
    # predicted for this run's topology (2 ranks, one per machine) equals the plan's own figures
    # for a 2-machine cluster of one worker each
    for v in plan.variables:
        assert rows[v.name]["predicted_bytes_per_step"] == pytest.approx(v.bytes_per_step)
    assert view.chart_data()["predicted_bytes_per_step"] == pytest.approx(plan.bytes_per_machine_per_step)
    assert "measured / predicted" in view.bytes_table.value and "embedding/embeddings" in shown_text(view.bytes_table.value)


def test_no_prediction_for_another_cluster_without_profile():
    plan = make_plan(_profile(), ClusterSpec.create(machines=8, workers_per_machine=6), architecture="auto")
    run = Run(plan=plan, steps=4, engines=2)
    assert run.predicted_bytes_by_variable() == {}
    view = RunView(run, redraw_s=0.0)
    assert view.chart_data()["predicted_bytes_per_step"] is None
    assert all(r["predicted_bytes_per_step"] is None for r in view.bytes_rows())


def test_prediction_is_a_ranks_share_on_the_plans_machines():
    """Engines on one host run as the plan's machines when the plan has that many workers: each
    rank is predicted its share of its machine's bytes (the runtime counts bytes per rank)."""
    plan = make_plan(_profile(), ClusterSpec.create(machines=2, workers_per_machine=2), architecture="auto",
                     local_aggregation=True)   # AUTO would choose it; the shares below are local aggregation's
    predicted = Run(plan=plan, steps=4, engines=4).predicted_bytes_by_variable()
    assert set(predicted) == {v.name for v in plan.variables}
    for v in plan.variables:
        assert predicted[v.name] == pytest.approx(v.bytes_per_step / 2)
    assert Run(plan=plan, steps=4, engines=3).predicted_bytes_by_variable() == {}


class _RecordingController:
    def __init__(self):
        self.stops = 0

    def request_stop(self):
        self.stops += 1


def test_stop_button_calls_run_stop():
    run = Run(steps=100, engines=2)
    controller = _RecordingController()
    run._controller = controller
    view = RunView(run)
    assert not view.stop_button.disabled
    view.stop_button.click()
    assert controller.stops == 1
    assert view.stop_button.disabled
    run.finish(history=[_record(s, 1.0) for s in range(1, 8)], stopped=True)
    assert run.status == "stopped" and view.progress.value == 7 and view.progress.bar_style == "warning"
    assert "stopped after 7 of 100 steps" in view.status_text()


def test_finished_and_failed_runs():
    run = Run(steps=3, engines=2)
    view = RunView(run, redraw_s=60.0)    # only the final redraw may draw the last steps
    run.set_status("running")
    run.finish(summary={"schema": "parallax_nb.run", "steps": 3}, history=[_record(s, 3.0 - s) for s in range(1, 4)])
    assert run.done and view.progress.value == 3 and view.progress.bar_style == "success"
    assert view.chart_data()["loss"] == [2.0, 1.0, 0.0] and view.stop_button.disabled
    assert run.summary()["steps"] == 3

    failing = Run(steps=5, engines=2)
    view = RunView(failing)
    err = DistributedError("rank 1 (engine 3 on host vm) failed: ValueError: bad shapes")
    err.rank, err.remote_traceback = 1, "Traceback ...\nValueError: bad shapes <b>"
    failing.fail(err)
    assert failing.status == "failed" and view.progress.bar_style == "danger"
    assert "rank 1 (engine 3 on host vm)" in view.error.value
    assert "&lt;b&gt;" in view.error.value        # remote text is escaped
    with pytest.raises(DistributedError):
        failing.wait(timeout=1)


def test_stop_button_works_while_a_kernel_cell_waits():
    """In a real Jupyter kernel, a click on Stop reaches run.stop() while the cell blocks in
    run.wait(); a cell queued meanwhile runs after it."""
    jupyter_client = pytest.importorskip("jupyter_client")
    import queue
    import time

    code = (
        "import threading\n"
        "from IPython.display import display\n"
        "from parallax_nb.cluster.handle import Run\n"
        "from parallax_nb.widgets.run_view import RunView\n"
        "class Controller:\n"
        "    def __init__(self, run): self.run = run\n"
        "    def request_stop(self):\n"
        "        threading.Timer(0.2, lambda: self.run.finish(history=[{'step': 1, 'loss': 1.0}], stopped=True)).start()\n"
        "run = Run(steps=100, engines=2); run._controller = Controller(run)\n"
        "view = RunView(run); display(view)\n"
        "print('BUTTON', view.stop_button.model_id, flush=True)\n"
        "run.wait(timeout=60)\n"
        "print('STATUS', run.status, flush=True)\n"
    )
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        kc.execute(code)
        outputs, button, deadline = [], None, time.monotonic() + 120
        while time.monotonic() < deadline and "STATUS" not in "".join(outputs):
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                pytest.fail("\n".join(msg["content"]["traceback"]))
            if button is None and "BUTTON" in "".join(outputs):
                button = "".join(outputs).split("BUTTON", 1)[1].split()[0]
                click = kc.session.msg("comm_msg", {"comm_id": button,
                                                    "data": {"method": "custom", "content": {"event": "click"}}})
                kc.shell_channel.send(click)
                kc.execute("print('AFTER', flush=True)")
        text = "".join(outputs)
        assert "STATUS stopped" in text, text
        while "AFTER" not in "".join(outputs) and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
        text = "".join(outputs)
        assert text.index("STATUS stopped") < text.index("AFTER")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_phases_tick_and_the_end_is_said_once(planned_run):
    run, _ = planned_run
    view = RunView(run, redraw_s=0.0)
    assert view.status_text().startswith("starting · 0.")
    charts = view.charts.value
    assert charts.count(">waiting for the first step</text>") == 3 and "<line" not in charts   # no fake axes
    run.set_phase("starting the cluster: engines 1 of 2 ready")
    assert "starting the cluster: engines 1 of 2 ready · " in view.status.value
    run.phase_started_at -= 3.0                     # three seconds later, the ticker redraws
    import time

    deadline = time.monotonic() + 3
    while "· 3." not in view.status.value and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "· 3." in view.status.value
    run.set_status("running")
    run.add_records([_record(1, 5.0)])
    assert view.status_text().startswith("training · ")
    run.set_phase("gathering the trained weights")
    run.add_records([_record(10, 4.0)])             # a late record does not hide the wrap-up
    assert view.status_text().startswith("gathering the trained weights · ")
    run.finish(history=[_record(s, 1.0) for s in range(1, 11)])
    text = view.status_text()
    assert text.startswith("done in ") and text.count("done") == 1 and "10/10 steps" in text


def test_a_plan_for_another_cluster_is_flagged(planned_run):
    plan = make_plan(_profile(), ClusterSpec.create(machines=2), architecture="hybrid")
    same = RunView(Run(plan=plan, steps=4, engines=2))
    assert same.warning.value == ""
    other = RunView(Run(plan=plan, steps=4, engines=3))
    text = other.warning.value
    assert "made for 2 machine(s) x 1 worker(s)" in text and "runs on 3 engines" in text
    assert "no prediction" in text and "profile=prof" in text
    with_profile = RunView(Run(plan=plan, steps=4, engines=3, profile=_profile())).warning.value
    assert "recomputed from the profile" in with_profile


def test_run_snapshot_and_smoothed_throughput(planned_run):
    run, _ = planned_run
    view = RunView(run, redraw_s=0.0)
    records = [dict(_record(s, 5.0 - s / 10), examples_per_s=40.0 if s % 2 else 3000.0) for s in range(1, 11)]
    run.finish(summary={"steps": 10}, history=records)
    bundle = view._repr_mimebundle_()
    html = bundle["text/html"]
    assert "parallax-run-snapshot" in html and "done in" in html and "<script" not in html.lower()
    assert_svg_charts(html, 3)
    assert "smoothed" in html and "raw" in html and "predicted" in html
    assert bundle["text/plain"].startswith("RunView: Run on 2 MPI engines: done in")


PHASE_CELL = '''
import time
get_ipython().run_line_magic("load_ext", "parallax_nb")
import parallax_nb as px
from parallax_nb.workloads import lm_job
job = lm_job("tiny")
print("MARK profile", time.time(), flush=True)
prof = px.profile(job, steps=5)
print("MARK cluster-start", time.time(), flush=True)
get_ipython().run_line_magic("parallax", "cluster start --engines 2")
print("MARK run", time.time(), flush=True)
run = px.run(job, px.plan(prof, machines=2).plan, engines=2, steps=6, profile=prof)
print("MARK cluster-stop", time.time(), flush=True)
get_ipython().run_line_magic("parallax", "cluster stop")
print("MARK end", time.time(), flush=True)
'''


def _sent_at(date) -> float:
    """A message header's date in seconds; jupyter_client hands it over parsed or as ISO text."""
    if isinstance(date, str):
        date = datetime.datetime.fromisoformat(date.replace("Z", "+00:00"))
    return date.timestamp()


def _phase_messages(kc, deadline):
    """(kernel time, text) of every phase label the kernel's widgets showed, and the MARK lines."""
    import queue
    import re

    phases, marks = [], {}
    while time.monotonic() < deadline and "end" not in marks:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle" and msg["parent_header"].get("msg_type") == \
                "execute_request":
            break
        if kind == "error":
            pytest.fail("\n".join(content["traceback"]))
        if kind == "stream":
            if content["name"] == "stderr" and "UsageError" in content["text"]:
                pytest.fail(content["text"])
            for name, at in re.findall(r"MARK (\S+) ([\d.]+)", content["text"]):
                marks[name] = float(at)
        if kind in ("comm_open", "comm_msg"):
            value = (content.get("data") or {}).get("state", {}).get("value")
            if isinstance(value, str) and ("parallax-phase" in value or "parallax-run-status" in value):
                text = re.sub(r"<[^>]+>", " ", value)
                phases.append((_sent_at(msg["header"]["date"]), " ".join(text.split())))
    return phases, marks


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_every_long_wait_names_its_phase_within_a_second():
    """In a real kernel: profiling, cluster start and stop, and a run's start-up, steps and
    wrap-up each show a phase (read from the widget state sent to the browser) at most 1 s
    after they begin, and the shown timer moves at least every second until they end."""
    jupyter_client = pytest.importorskip("jupyter_client")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        kc.execute(PHASE_CELL)
        phases, marks = _phase_messages(kc, time.monotonic() + 280)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert list(marks) == ["profile", "cluster-start", "run", "cluster-stop", "end"], marks
    order = list(marks)
    seen = {}
    for begin, end in zip(order, order[1:]):
        start, stop = marks[begin], marks[end]
        shown = [(t, text) for t, text in phases if start <= t <= stop + 0.5]
        seen[begin] = [text for _, text in shown]
        assert shown and shown[0][0] - start <= 1.0, (begin, shown[:3])
        times = [start] + [t for t, _ in shown]
        gaps = [b - a for a, b in zip(times, times[1:]) if b < stop - 0.2]
        assert max(gaps, default=0) <= 1.0, (begin, max(gaps), shown)
    assert any("step 5 of 5" in t for t in seen["profile"]) and any("done in" in t for t in seen["profile"])
    assert any("engines 2 of 2 ready" in t for t in seen["cluster-start"])
    run_phases = " | ".join(seen["run"])
    for phase in ("shipping the job to 2 engines", "building the model", "tracing the training step",
                  "training", "gathering the trained weights", "done in"):
        assert phase in run_phases, (phase, run_phases)
    assert any("stopping the engines" in t for t in seen["cluster-stop"])


def _executed_toy(plan, machines: int, workers: int):
    from parallax_nb.executed import ExecutedPlan, ExecutedVariable

    return ExecutedPlan(architecture=plan.architecture.value, ranks=machines * workers, machines=machines,
                        workers_per_machine=workers, local_aggregation=workers > 1,
                        variables=tuple(ExecutedVariable(v.name, v.method, _profile()[v.name].kind, v.partitions)
                                        for v in plan.variables))


def test_step_time_predicted_against_measured_after_the_run(planned_run):
    """Once done, the view shows the estimate of what ran beside the median step time of
    steps 2.. (step 1, the warm-up, left out), with the error in %; when no estimate can be
    made, the measurement and the reason."""
    from parallax_nb import cost

    run, plan = planned_run
    view = RunView(run, redraw_s=0.0)
    times = {1: 2.0, 2: 0.05, 3: 0.07, 4: 0.06}
    records = [dict(_record(s, 5.0 - s / 10), step_time_s=t) for s, t in times.items()]
    run.add_records(records)
    assert run.step_time_check() is None and "step time:" not in view.status.value   # not done yet
    executed = _executed_toy(plan, 2, 1)
    run.finish(summary={"steps": 4, "executed_plan": executed.to_dict()}, history=records)
    check = run.step_time_check()
    assert check.measured_step_time_s == pytest.approx(0.06) and check.measured_steps == "steps 2-4"
    expected = cost.estimate_executed(_profile(), executed, plan.cluster.replace(machines=2, workers_per_machine=1))
    assert check.predicted_step_time_s == pytest.approx(expected.step_time_s)
    assert check.error_pct == pytest.approx(100 * (0.06 / expected.step_time_s - 1))
    assert "uncalibrated" in check.basis
    assert f"measured 60.0 ms (median of steps 2-4), {check.error_pct:+.1f} %" in view.status.value
    assert check.line() in view.status_text()
    # a profile of another model gives no prediction: the view shows the measurement and why
    import dataclasses

    run.profile = dataclasses.replace(_profile(), variables=(
        dataclasses.replace(_profile().variables[0], name="other/embeddings"), *_profile().variables[1:]))
    check = run.step_time_check()
    assert check.predicted_step_time_s is None and check.error_pct is None
    assert check.measured_step_time_s == pytest.approx(0.06)
    assert check.basis.startswith("no prediction: ") and "other/embeddings" in check.basis, check.basis
    assert check.line().startswith("step time: measured 60.0 ms (median of steps 2-4); no prediction: ")
    assert check.line() in RunView(run).status_text()


def test_link_table_shows_payload_framing_and_coordination_beside_the_counters():
    """On 2 machines x 2 engines: per machine the link's counters beside the prediction, made of
    the cost model's payload for the machine, TCP/IP framing (x 1.0684) and the calibration's
    coordination rate times the run's median step time."""
    from parallax_nb.calibration import Calibration

    profile = _profile()
    plan = make_plan(profile, ClusterSpec.create(machines=2, workers_per_machine=2), architecture="hybrid")
    calibration = Calibration(machines=2, workers_per_machine=2, coordination_bytes_per_s=100_000.0, where="test")
    run = Run(plan=plan, steps=3, engines=4, profile=profile, calibration=calibration)
    run.hosts = ["m0", "m0", "m1", "m1"]
    for rank in (0, 2):
        run.add_records([dict(_record(s, 1.0), step_time_s=0.1 if s > 1 else 3.0, link_bytes=10_000 * s,
                              link_packets=10 * s) for s in (1, 2, 3)], rank=rank)
    payload = plan.bytes_per_machine_per_step
    prediction = run.link_prediction()
    assert prediction.payload_bytes == pytest.approx(payload)
    assert prediction.framing_bytes == pytest.approx(payload * 0.068370, rel=1e-5)
    assert prediction.coordination_bytes == pytest.approx(100_000.0 * 0.1)
    assert run.predicted_link_bytes_per_step() == pytest.approx(payload * 1.068370 + 10_000.0, rel=1e-6)
    view = RunView(run, redraw_s=0.0)
    table = view.bytes_table.value
    for text in ("+ TCP/IP framing", "+ coordination", "m0", "m1", "coordination 100 KB/s, calibrated on test"):
        assert text in table, text
    uncalibrated = Run(plan=plan, steps=3, engines=4, profile=profile)
    uncalibrated.hosts = run.hosts
    uncalibrated.add_records(run.records, rank=0)
    assert uncalibrated.link_prediction().coordination_bytes == 0.0
    assert "uncalibrated" in uncalibrated.link_prediction().coordination


def test_link_table_prices_every_call_of_what_ran_with_the_calibrated_link():
    """With a calibration that measured its links per call, the prediction is the payload times
    the measured framing plus each call of the executed plan's estimate at its measured bytes
    (inside a machine too), and the table says how many calls."""
    from parallax_nb import cost
    from parallax_nb.calibration import Calibration, LinkFit

    profile = _profile()
    plan = make_plan(profile, ClusterSpec.create(machines=2, workers_per_machine=2), architecture="hybrid")
    fits = {"alltoall/cross": LinkFit(2400.0, 2.04), "alltoall/all": LinkFit(2300.0, 2.02),
            "alltoall/machine": LinkFit(800.0, 0.0), "allreduce/all": LinkFit(3000.0, 2.0)}
    calibration = Calibration(2, 2, Calibration.defaults(2, 2, 1e9, 25e-6).fits, coordination_bytes_per_s=7e5,
                              busy_coordination_bytes_per_s=4e4, where="test", link_fits=fits)
    assert calibration.payload_framing_factor == pytest.approx(1.01)   # median of 1.02, 1.01, 1.0 ("machine" not)
    run = Run(plan=plan, steps=3, engines=4, profile=profile, calibration=calibration)
    run.hosts = ["m0", "m0", "m1", "m1"]
    records = [dict(_record(s, 1.0), step_time_s=0.1 if s > 1 else 3.0, link_bytes=10_000 * s, link_packets=10 * s)
               for s in (1, 2, 3)]
    for rank in (0, 2):
        run.add_records(records, rank=rank)
    before = run.link_prediction()
    assert before.call_bytes == 0.0 and before.calls == ()   # what ran is not known before the summary
    executed = _executed_toy(plan, 2, 2)
    run.finish(summary={"steps": 3, "executed_plan": executed.to_dict()}, history=records)
    prediction = run.link_prediction()
    calls = dict(cost.estimate_executed(profile, executed, plan.cluster, calibration).link.calls)
    assert calls and prediction.calls == tuple(sorted(calls.items()))
    assert sum(calls.values()) == prediction.call_count > 1
    expected_calls = sum(n * calibration.link_fit(*key.split("/")).overhead_bytes for key, n in calls.items())
    assert prediction.call_bytes == pytest.approx(expected_calls) and prediction.call_bytes > 0
    payload = prediction.payload_bytes
    # the payload split by the calls that carry it, each framed at its own measured factor:
    # the PS rows' alltoalls across machines x1.02, the dense allreduce x1.00 (not their median)
    shares = dict(prediction.payload_calls)
    assert set(shares) == {"alltoall/cross", "allreduce/all"} and sum(shares.values()) == pytest.approx(payload)
    assert prediction.framing_bytes == pytest.approx(shares["alltoall/cross"] * 0.02)
    assert 0 < prediction.framing_bytes < payload * 0.02
    assert prediction.total_bytes == pytest.approx(payload + prediction.framing_bytes + expected_calls + 4e4 * 0.1)
    table = RunView(run, redraw_s=0.0).bytes_table.value
    assert f"+ {prediction.call_count} calls' overhead" in table, table
    assert f"framing x{1 + prediction.framing_bytes / payload:.3f} and" in table


def test_a_thousand_variables_bytes_table_lists_those_with_the_most_bytes():
    """Past style.TABLE_ROWS variables the run's bytes table lists those with the most bytes
    (the larger of predicted and measured), in plan order, and says where every one is."""
    from parallax_nb.widgets import style
    from parallax_nb.widgets.run_view import render_bytes_table

    rows = [{"name": f"layer_{i:04d}/kernel", "method": "ar", "predicted_bytes_per_step": float((i * 37) % 1000 + 1),
             "measured_bytes_per_step": float((i * 37) % 1000 + 1) if i % 2 else None} for i in range(1000)]
    text = shown_text(render_bytes_table(rows))
    largest = sorted(rows, key=lambda r: -r["predicted_bytes_per_step"])[:style.TABLE_ROWS]
    assert [r["name"] for r in rows if r["name"] in text] == [r["name"] for r in rows if r in largest]
    assert f"The {style.TABLE_ROWS} of 1000 variables with the most bytes" in text
    assert "variables with the most bytes" not in shown_text(render_bytes_table(rows[:style.TABLE_ROWS]))
