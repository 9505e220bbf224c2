"""The sync/async flag through the user's journey (issue 16): the executed plan and the run
record, the command line, the magics, the planner model and view, the report and the run view.
Unit tests: no MPI here (tests/test_async_trainer.py runs the CLI on 2 ranks)."""
from __future__ import annotations

import json
from html import escape as html_escape
import os
import re
import subprocess
import sys

import pytest

from parallax_nb.errors import ConfigError, PlanError
from parallax_nb.executed import ExecutedPlan
from parallax_nb.plan import make_plan, plan_for_kinds
from parallax_nb.runtime.executed import executed_plan
from parallax_nb.runtime.result import StepRecord, TrainResult
from parallax_nb.runtime.topology import Topology
from parallax_nb.staleness import DEFINITION, MeasuredStaleness, describe_sync
from parallax_nb.types import ClusterSpec

from conftest import REPO
from test_cost import lm_profile

KINDS = {"table": "sparse", "dense/kernel": "dense"}
TABLE = {"table": {"method": "ps", "kind": "sparse", "partitions": 2},
         "dense/kernel": {"method": "ps", "kind": "dense", "partitions": 2}}


def _async_plan(k=2):
    return plan_for_kinds(KINDS, "ps", partitions=2, model_name="m", sync=False, max_staleness=k)


# ----------------------------------------------------------------------------- executed plan, run record


def test_measured_staleness_is_the_mean_and_max_of_each_ranks_steps_ahead():
    measured = MeasuredStaleness.from_steps_ahead([[0, 1, 2, 1], [0, 0, 0, 0], [0, 2]], max_staleness=2)
    assert [(r.rank, r.steps, r.mean_steps_ahead, r.max_steps_ahead) for r in measured.ranks] == \
        [(0, 4, 1.0, 2), (1, 4, 0.0, 0), (2, 2, 1.0, 2)]
    assert measured.mean_steps_ahead == pytest.approx(6 / 10) and measured.max_steps_ahead == 2
    assert measured.describe() == ("steps ahead of the slowest: mean 0.60, max 2 "
                                   "(rank 0: mean 1.00, max 2; rank 1: mean 0.00, max 0; rank 2: mean 1.00, max 2)")
    d = json.loads(json.dumps(measured.to_dict()))
    assert d["definition"] == DEFINITION and d["max_staleness"] == 2
    assert MeasuredStaleness.from_dict(d) == measured
    with pytest.raises(ConfigError, match="lacks field 'per_rank'"):
        MeasuredStaleness.from_dict({"max_staleness": 1})
    with pytest.raises(ConfigError, match=r"steps ahead are >= 0, got \[0, -1\]"):
        MeasuredStaleness.from_steps_ahead([[0, -1]], None)


def test_executed_plan_records_sync_and_max_staleness_and_round_trips():
    ran = executed_plan(_async_plan(2), TABLE, Topology.blocks(2, 1), local_aggregation=False)
    assert (ran.sync, ran.max_staleness) == (False, 2) and ran.changes == ()
    assert ran.describe_sync() == "asynchronous, max staleness 2"
    d = json.loads(json.dumps(ran.to_dict()))
    assert (d["sync"], d["max_staleness"]) == (False, 2)
    assert ExecutedPlan.from_dict(d) == ran
    unbounded = executed_plan(_async_plan(None), TABLE, Topology.blocks(2, 1), local_aggregation=False)
    assert unbounded.describe_sync() == "asynchronous, unbounded staleness"
    sync = executed_plan(_async_plan().with_sync(True), TABLE, Topology.blocks(2, 1), local_aggregation=False)
    assert (sync.sync, sync.max_staleness, sync.describe_sync()) == (True, None, "synchronous")
    older = {k: v for k, v in sync.to_dict().items() if k not in ("sync", "max_staleness")}
    assert ExecutedPlan.from_dict(older) == sync   # a run.json written before the flag reads as synchronous
    with pytest.raises(ConfigError, match="'max_staleness' must be null or a whole number >= 0, got -1"):
        ExecutedPlan.from_dict({**ran.to_dict(), "max_staleness": -1})
    with pytest.raises(ConfigError, match="'sync' must be true or false, got 'no'"):
        ExecutedPlan.from_dict({**ran.to_dict(), "sync": "no"})


def _result(plan, steps_ahead=None, staleness=None):
    history = [StepRecord(step=i + 1, loss=1.0, examples_per_s=10.0, step_time_s=0.1, bytes_sent=0.0,
                          bytes_received=0.0, steps_ahead=None if steps_ahead is None else steps_ahead[i])
               for i in range(3)]
    ran = executed_plan(plan, TABLE, Topology.blocks(2, 1), local_aggregation=False)
    return TrainResult(steps_done=3, history=history, weights={}, stopped_early=False, ranks=2, machines=2,
                       architecture="ps", variables=TABLE, executed_plan=ran, staleness=staleness)


def test_run_summary_and_history_carry_sync_and_the_measured_staleness():
    measured = MeasuredStaleness.from_steps_ahead([[0, 1, 1], [0, 0, 0]], max_staleness=1)
    result = _result(_async_plan(1), steps_ahead=[0, 1, 1], staleness=measured)
    summary = json.loads(json.dumps(result.summary()))
    assert (summary["sync"], summary["max_staleness"]) == (False, 1)
    assert summary["executed_plan"]["sync"] is False
    assert summary["staleness"]["per_rank"][0] == {"rank": 0, "steps": 3, "mean_steps_ahead": pytest.approx(2 / 3),
                                                   "max_steps_ahead": 1}
    assert summary["staleness"]["max_steps_ahead"] == 1
    assert [r.to_row()["steps_ahead"] for r in result.history] == [0, 1, 1]
    sync = _result(_async_plan().with_sync(True))
    summary = sync.summary()
    assert (summary["sync"], summary["max_staleness"], summary["staleness"]) == (True, None, None)
    assert "steps_ahead" not in sync.history[0].to_row()


def test_describe_sync():
    assert describe_sync(True, None) == "synchronous"
    assert describe_sync(False, 0) == "asynchronous, max staleness 0"
    assert describe_sync(False, None) == "asynchronous, unbounded staleness"


# ----------------------------------------------------------------------------- command line


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "parallax_nb", *map(str, args)], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def profile_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("async_cli") / "profile.json"
    lm_profile().to_json(str(path))
    return path


def test_cli_plan_async_writes_an_asynchronous_plan(profile_json, tmp_path):
    from parallax_nb.plan import Plan

    out = tmp_path / "plan.json"
    result = _cli("plan", profile_json, "--machines", 4, "--arch", "ps", "--async", "--max-staleness", 2, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "asynchronous (max_staleness=2)" in result.stdout
    plan = Plan.from_json(str(out))
    assert (plan.sync, plan.max_staleness) == (False, 2)
    # the outlook of sync against async with one worker 2x slower (the default straggler), bounded by k
    assert "With 1 worker of 4 2x slower per step" in result.stdout and "max staleness 2" in result.stdout
    sync, unbounded = (float(re.search(rf"{label} +([0-9.]+) examples/s", result.stdout)[1])
                       for label in ("synchronous", "asynchronous, unbounded"))
    assert unbounded > sync > 0
    result = _cli("plan", profile_json, "--machines", 4, "--arch", "ps", "--async", "--straggler", 3, "-o", out)
    assert result.returncode == 0 and "asynchronous (unbounded)" in result.stdout
    assert "With 1 worker of 4 3x slower per step" in result.stdout and "max staleness" not in result.stdout
    assert Plan.from_json(str(out)).max_staleness is None
    synchronous = _cli("plan", profile_json, "--machines", 4, "--arch", "ps", "-o", out)
    assert synchronous.returncode == 0 and "slower per step" not in synchronous.stdout


@pytest.mark.parametrize("flags, message", [
    (["--arch", "hybrid", "--async"], "asynchronous training applies to PS variables only; 3 variable(s) of "
                                      "'lm_like' are AllReduce"),
    (["--arch", "ar", "--async"], "every variable of 'lm_like' is AllReduce"),
    (["--arch", "ps", "--async", "--max-staleness", "-1"], "--max-staleness must be a whole number >= 0, got -1"),
    (["--arch", "ps", "--max-staleness", "2"], "--max-staleness 2 applies to asynchronous training, and --async "
                                               "was not given"),
    (["--arch", "ps", "--async", "--straggler", "0.5"], "--straggler must be a finite number >= 1 (how many times "
                                                        "slower the slow worker's step is), got 0.5"),
    (["--arch", "ps", "--async", "--straggler", "nan"], "--straggler must be a finite number >= 1"),
    (["--arch", "ps", "--straggler", "2"], "--straggler 2 applies to the outlook of asynchronous training, and "
                                           "--async was not given"),
])
def test_cli_plan_refuses_bad_sync_flags_and_writes_nothing(profile_json, tmp_path, flags, message):
    out = tmp_path / "plan.json"
    result = _cli("plan", profile_json, "--machines", 4, *flags, "-o", out)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists() and not result.stdout   # refused before the tables were printed


@pytest.mark.parametrize("flags, message", [
    (["--async", "--max-staleness", "-3"], "--max-staleness must be a whole number >= 0, got -3"),
    (["--max-staleness", "1"], "--max-staleness 1 applies to asynchronous training, and --async was not given"),
    (["--async", "--partitions", "auto"], "--async does not take --partitions auto yet"),
    (["--async", "--arch", "hybrid"], "asynchronous training applies to PS variables only; 1 variable(s) of "
                                      "'constant_gradient' are AllReduce ['bias/bias']"),
])
def test_cli_run_refuses_bad_sync_flags_before_mpirun(tmp_path, flags, message):
    out = tmp_path / "out"
    result = _cli("run", "async_trainer_cases:constant_gradient_job", "--np", 2, "--steps", 2, "--output", out, *flags)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "ranks:" not in result.stderr   # mpirun never started
    assert not out.exists()


def test_cli_run_refuses_async_with_an_optimizer_the_owners_cannot_apply_before_mpirun(tmp_path):
    out = tmp_path / "out"
    result = _cli("run", "async_trainer_cases:nadam_job", "--np", 2, "--steps", 2, "--output", out, "--async",
                  "--arch", "ps")
    assert result.returncode == 2, result.stderr
    assert "has no owner rule for Nadam" in result.stderr and "Traceback" not in result.stderr
    assert "SGD, Adam, AdamW, Adagrad, RMSprop" in result.stderr and "sync=True" in result.stderr
    assert "ranks:" not in result.stderr and not out.exists()   # mpirun never started, nothing written
    plan = tmp_path / "async.json"   # an asynchronous plan file, without --async
    plan_for_kinds({"table/embeddings": "sparse", "bias/bias": "dense"}, "ps", model_name="constant_gradient",
                   sync=False).to_json(str(plan))
    result = _cli("run", "async_trainer_cases:nadam_job", "--np", 2, "--plan", plan, "--steps", 2, "--output", out)
    assert result.returncode == 2 and "has no owner rule for Nadam" in result.stderr, result.stderr
    assert "ranks:" not in result.stderr and not out.exists()


def test_cli_run_refuses_async_with_a_plan_file_that_has_allreduce_variables(tmp_path):
    plan = tmp_path / "hybrid.json"
    plan_for_kinds({"table/embeddings": "sparse", "bias/bias": "dense"}, "hybrid",
                   model_name="constant_gradient").to_json(str(plan))
    out = tmp_path / "out"
    result = _cli("run", "async_trainer_cases:constant_gradient_job", "--plan", plan, "--steps", 2, "--output", out,
                  "--async")
    assert result.returncode == 2
    assert "are AllReduce ['bias/bias']: an allreduce is a barrier at every step" in result.stderr
    assert "-> plan with --arch ps (every variable on the parameter servers), or drop --async" in result.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- planner model and view


def test_planner_model_holds_sync_and_max_staleness_and_keeps_the_last_valid_plan():
    from parallax_nb.planner import plan as make_planner

    planner = make_planner(lm_profile(), machines=4, architecture="ps")
    assert (planner.sync, planner.max_staleness, planner.plan.sync) == (True, None, True)
    planner.set(sync=False, max_staleness="2")
    assert planner.error is None and (planner.plan.sync, planner.plan.max_staleness) == (False, 2)
    planner.max_staleness = ""
    assert planner.error is None and planner.plan.max_staleness is None and not planner.plan.sync
    planner.architecture = "hybrid"   # AllReduce variables: the Plan refuses, the last valid plan stays
    assert isinstance(planner.error, PlanError)
    assert planner.error.message.startswith("asynchronous training applies to PS variables only; 3 variable(s) of "
                                            "'lm_like' are AllReduce ['lstm/kernel', 'lstm/bias', "
                                            "'projection/kernel']")
    assert planner.plan.architecture.value == "ps" and not planner.plan.sync
    assert "-- architecture ps, asynchronous, unbounded staleness\n" in planner.summary()
    assert "ERROR in latest inputs (showing the last valid plan): asynchronous training" in planner.summary()
    planner.sync = True
    assert planner.error is None and planner.plan.sync and planner.plan.architecture.value == "hybrid"
    planner.set(architecture="ps", sync=False, max_staleness=-1)
    assert isinstance(planner.error, ConfigError)
    assert planner.error.message == "max staleness must be a whole number >= 0 or empty (unbounded), got -1"
    planner.set(sync=True, max_staleness=3)   # a bound on a synchronous plan: the Plan's refusal
    assert "max_staleness=3 applies to asynchronous training, and this plan is synchronous" in planner.error.message
    with pytest.raises(PlanError, match="are AllReduce"):   # invalid initial inputs raise (no plan to keep)
        make_planner(lm_profile(), machines=4, architecture="hybrid", sync=False)


def test_planner_view_toggle_and_field_drive_the_model_and_show_its_error():
    from parallax_nb.planner import plan as make_planner
    from parallax_nb.widgets.planner_view import PlannerView

    planner = make_planner(lm_profile(), machines=4, architecture="ps")
    view = PlannerView(planner)
    assert view.sync.value is True and view.max_staleness.disabled and view.max_staleness.value == ""
    assert "synchronous" in view.summary.value and "every step ends at a barrier" in view.summary.value
    assert "slower per step" not in view.summary.value
    view.sync.value = False
    assert planner.sync is False and not planner.plan.sync and not view.max_staleness.disabled
    view.max_staleness.value = "1"
    assert planner.plan.max_staleness == 1
    assert ">asynchronous <" in view.summary.value and "max staleness 1; PS without a barrier" in view.summary.value
    # the outlook with a straggler, the same figures as the CLI's and the report's
    from parallax_nb.cost.asynchronous import straggler_outlook

    o = straggler_outlook(planner.estimate, max_staleness=1)
    assert o.async_examples_per_s > o.sync_examples_per_s == o.bounded_examples_per_s
    assert (f"With one worker 2x slower per step: sync {o.sync_examples_per_s:,.0f}, async "
            f"{o.async_examples_per_s:,.0f} examples/s ({o.async_examples_per_s / o.sync_examples_per_s:.2f}x), "
            f"max staleness 1: {o.bounded_examples_per_s:,.0f} in the long run") in view.summary.value
    view.architecture.value = "hybrid"
    assert view.error.layout.display is None
    assert "asynchronous training applies to PS variables only" in view.error.value
    assert "Showing the last valid plan (4 machine(s) x 1 worker(s), 10Gbit/s, architecture ps, asynchronous, " \
           "max staleness 1)" in view.error.value
    assert planner.plan.architecture.value == "ps"
    view.sync.value = True    # back to sync clears the bound: a valid hybrid plan again
    assert planner.error is None and planner.max_staleness is None and planner.plan.architecture.value == "hybrid"
    assert view.error.layout.display == "none" and view.max_staleness.disabled
    planner.set(architecture="ps", sync=False, max_staleness=2)   # code changes show in the controls
    assert view.sync.value is False and view.max_staleness.value == "2"
    view.close()


# ----------------------------------------------------------------------------- magics


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "parallax_nb")
    ip.user_ns["lm_prof"] = lm_profile()
    ip.user_ns["hybrid_plan"] = plan_for_kinds({"table/embeddings": "sparse", "bias/bias": "dense"}, "hybrid",
                                               model_name="constant_gradient")
    return ip


def _usage_error(shell, line: str) -> str:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as info:
        shell.run_line_magic("parallax", line)
    return str(info.value)


def test_magic_plan_async(shell):
    shell.run_line_magic("parallax", "plan lm_prof --machines 4 --arch ps --async --max-staleness 2 -o async_planner")
    planner = shell.user_ns["async_planner"]
    assert (planner.plan.sync, planner.plan.max_staleness) == (False, 2)
    assert shell.user_ns["plan"] is planner.plan
    shell.run_line_magic("parallax", "plan lm_prof --machines 4 --arch ps --async -o unbounded")
    assert not shell.user_ns["unbounded"].plan.sync and shell.user_ns["unbounded"].plan.max_staleness is None
    shell.run_line_magic("parallax", "plan lm_prof --machines 4 --arch ps -o synchronous")
    assert shell.user_ns["synchronous"].plan.sync


@pytest.mark.parametrize("line, message", [
    ("plan lm_prof --arch hybrid --async -o bad", "asynchronous training applies to PS variables only; 3 variable(s) "
                                                  "of 'lm_like' are AllReduce"),
    ("plan lm_prof --arch ps --async --max-staleness -1 -o bad", "--max-staleness must be a whole number >= 0, got -1"),
    ("plan lm_prof --arch ps --max-staleness 2 -o bad", "--max-staleness 2 applies to asynchronous training, and "
                                                        "--async was not given"),
    ("run async_trainer_cases:constant_gradient_job --max-staleness 1 -o bad", "--async was not given"),
    ("run async_trainer_cases:constant_gradient_job --async --max-staleness -2 -o bad",
     "--max-staleness must be a whole number >= 0, got -2"),
    ("run async_trainer_cases:constant_gradient_job --plan hybrid_plan --async -o bad",
     "are AllReduce ['bias/bias']: an allreduce is a barrier at every step -> plan with --arch ps"),
])
def test_magic_refuses_bad_sync_flags_before_anything_starts(shell, line, message):
    from parallax_nb.cluster import cluster as cluster_module

    error = _usage_error(shell, line)
    assert message in error
    assert "bad" not in shell.user_ns
    assert cluster_module.current_default_cluster() is None   # no engines were started


def test_magic_help_lists_the_sync_flags(shell, capsys):
    from parallax_nb.magics import USAGE

    assert "[--async [--max-staleness K]]" in USAGE
    for sub in ("plan", "run"):
        shell.run_line_magic("parallax", f"{sub} --help")
        out = " ".join(capsys.readouterr().out.split())
        assert "--async" in out and "--max-staleness K" in out and "0: lock-step; default: unbounded" in out


# ----------------------------------------------------------------------------- report and run view


def _async_lm_plan(k=1):
    return make_plan(lm_profile(), ClusterSpec.create(machines=2), "ps").with_sync(False, k)


def _async_run_summary(plan, per_rank=((0, 1, 1, 0), (0, 0, 0, 0))):
    from test_report import run_summary_for

    summary = run_summary_for(lm_profile(), plan, 2, {}, 0.0)
    ran = executed_plan(plan, {n: {"method": "ps", "kind": plan[n].kind.value, "partitions": plan.partitions(n)}
                               for n in plan.names}, Topology.blocks(2, 1), local_aggregation=False)
    measured = MeasuredStaleness.from_steps_ahead([list(r) for r in per_rank], plan.max_staleness)
    return dict(summary, executed_plan=ran.to_dict(), sync=False, max_staleness=plan.max_staleness,
                staleness=measured.to_dict())


def test_report_says_async_and_max_staleness_and_the_measured_staleness(tmp_path):
    import csv

    from parallax_nb.report import Report, report
    from test_report import Tables

    plan = _async_lm_plan(1)
    files = report(lm_profile(), plan, _async_run_summary(plan)).save(tmp_path / "r.html")
    data = json.loads(open(files.json).read())
    assert (data["plan"]["sync"], data["plan"]["max_staleness"]) == (False, 1)
    assert data["plan"]["training"] == "asynchronous, max staleness 1"
    assert data["measured"]["training"] == "asynchronous, max staleness 1"
    assert data["measured"]["staleness"]["per_rank"][0]["mean_steps_ahead"] == pytest.approx(0.5)
    assert any("trains asynchronously (asynchronous, max staleness 1): the estimated step times and bytes above "
               "are of synchronous steps" in a and "once per push" in a for a in data["assumptions"])
    outlook = data["plan"]["straggler_outlook"]   # sync against async, one worker 2x slower, bound 1
    assert outlook[0].startswith("With 1 worker of 2 2x slower per step") and "max staleness 1" in outlook[-1]
    html = open(files.html).read()
    assert "asynchronous, max staleness 1" in html and "<h3>Measured staleness</h3>" in html
    assert "Synchronous or asynchronous, with a straggler" in html and html_escape(outlook[2].strip()) in html
    assert html_escape(DEFINITION) in html
    assert Tables(html).tables["staleness"] == [["rank", "steps", "mean steps ahead", "max steps ahead"],
                                                ["0", "4", "0.50", "1"], ["1", "4", "0.00", "0"],
                                                ["all ranks", "8", "0.25", "1"]]
    rows = list(csv.DictReader(open(files.csv)))
    assert {(r["training"], r["max_staleness"], r["training_run"], r["mean_steps_ahead_run"],
             r["max_steps_ahead_run"]) for r in rows} == {("asynchronous, max staleness 1", "1",
                                                           "asynchronous, max staleness 1", "0.25", "1")}
    assert "<h3>Measured staleness</h3>" in Report.from_json(files.json).html()   # redrawn from the JSON alone
    sync_plan = plan.with_sync(True)
    sync_data = report(lm_profile(), sync_plan).to_dict()
    assert sync_data["plan"]["training"] == "synchronous" and sync_data["plan"]["max_staleness"] is None
    assert "straggler_outlook" not in sync_data["plan"]
    bad = dict(_async_run_summary(plan), max_staleness=-1)
    with pytest.raises(ConfigError, match="field 'max_staleness' must be null or a whole number >= 0, got -1"):
        report(lm_profile(), plan, bad)


def test_run_view_shows_async_and_the_measured_staleness():
    from parallax_nb.cluster.handle import Run
    from parallax_nb.widgets.run_view import RunView

    plan = _async_lm_plan(2)
    run = Run(plan=plan, steps=4, engines=2, profile=lm_profile())
    view = RunView(run, redraw_s=0.0)
    assert "asynchronous, max staleness 2" in view.title.value
    assert "asynchronous, max staleness 2; no step measured yet" in view.status_text()
    run.set_status("running")
    run.add_records([{"step": s, "loss": 1.0, "examples_per_s": 10.0, "step_time_s": 0.1, "bytes_sent": 0.0,
                      "bytes_received": 0.0, "steps_ahead": a} for s, a in ((1, 0), (2, 2), (3, 1))])
    assert "asynchronous, max staleness 2; rank 0 steps ahead of the slowest: mean 1.00, max 2" in view.status_text()
    assert list(run.history["steps_ahead"]) == [0, 2, 1]
    run.finish(_async_run_summary(plan, per_rank=((0, 2, 1, 1), (0, 0, 0, 0))))
    view.refresh(force=True)
    assert ("asynchronous, max staleness 2; steps ahead of the slowest: mean 0.50, max 2 "
            "(rank 0: mean 1.00, max 2; rank 1: mean 0.00, max 0)") in view.status_text()
    assert "max staleness 2" in view.status.value
    synchronous = Run(plan=plan.with_sync(True), steps=4, engines=2)
    sync_view = RunView(synchronous, redraw_s=0.0)
    assert "synchronous" not in sync_view.status_text() and "staleness" not in sync_view.title.value
    assert "steps_ahead" not in synchronous.history.columns
    view.close(), sync_view.close()
