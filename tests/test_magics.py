"""``%parallax`` magics in a real IPython InteractiveShell: the journey, help, and bad input.

One shell for the module; the journey (profile -> plan -> cluster -> run -> report -> stop)
runs real TensorFlow and two real MPI engines once.
"""
import os
import re
import signal
import threading

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from parallax_nb.workloads import lm_job


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "parallax_nb")
    ip.user_ns["job"] = lm_job("tiny")
    yield ip
    from parallax_nb.cluster import stop_default_cluster

    stop_default_cluster()


def _usage_error(shell, line: str) -> str:
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("parallax", line)
    message = str(info.value)
    assert "\n" not in message.strip(), f"not one line: {message!r}"
    return message


def test_help_lists_every_subcommand(shell, capsys):
    doc = shell.find_line_magic("parallax").__doc__
    for usage in ("%parallax profile", "%parallax plan", "%parallax run", "%parallax report", "%parallax cluster",
                  "%parallax calibrate"):
        assert usage in doc
    assert "--workers-per-machine" in doc and "--checkpoint-dir" in doc and "-o NAME" in doc
    shell.run_cell("%parallax?")   # IPython's help shows the same docstring (pager prints here)
    shell.run_line_magic("parallax", "")
    assert "%parallax run" in capsys.readouterr().out
    shell.run_line_magic("parallax", "run --help")
    assert "--engines" in capsys.readouterr().out


def test_help_is_short_and_plain(shell, capsys):
    from parallax_nb.magics import USAGE

    doc = shell.find_line_magic("parallax").__doc__
    assert doc == USAGE and len(doc.splitlines()) <= 20
    assert "::" not in doc and "``" not in doc and "%%parallax" not in doc   # no raw rST, no cell magic
    assert "parallax" not in shell.magics_manager.magics["cell"]
    shell.run_line_magic("parallax", "plan --help")
    out = capsys.readouterr().out
    for option in ("--machines", "--bandwidth", "--latency", "--workers-per-machine", "--arch"):
        assert option in out
    assert "default: 10Gbit/s" in out and "default: 25" in out and "microseconds" in out
    assert "default: 2; 1 machine has no network traffic" in " ".join(out.split())
    assert "--latency must be a finite number of microseconds >= 0, got -5" in _usage_error(shell, "plan --latency -5")
    assert "--latency must be a finite number of microseconds >= 0, got inf" in _usage_error(shell, "plan --latency inf")


def test_parallax_errors_from_python_are_message_and_hint(shell, capsys):
    """px.plan(prof, bandwidth="fast") in a cell: the message and the hint, no traceback."""
    from parallax_nb.types import Profile, VariableProfile

    dense = VariableProfile(name="dense/kernel", shape=(16, 16), dtype="float32", size_bytes=1024, kind="dense",
                            rows_touched_mean=16, alpha_mean=1.0, alpha_p50=1.0, alpha_p95=1.0, alpha_max=1.0,
                            grad_bytes_per_step=1024, union_rows_by_workers=(16,) * 8)
    shell.user_ns["toy_profile"] = Profile(model_name="toy", batch_size=8, steps=5, step_time_s=0.01,
                                           peak_memory_bytes=0, variables=(dense,))
    capsys.readouterr()
    result = shell.run_cell("import parallax_nb as px\npx.plan(toy_profile, bandwidth='fast')")
    assert not result.success and type(result.error_in_exec).__name__ == "ConfigError"
    captured = capsys.readouterr()
    text = re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err).strip()
    assert "Traceback" not in text and "File " not in text, text
    lines = text.splitlines()
    assert lines[0].startswith("ConfigError: ") and "'fast'" in lines[0], text
    assert len(lines) <= 3 and lines[1].startswith("  -> "), text


def test_bad_arguments_are_one_line_errors(shell, capsys):
    assert "unknown %parallax subcommand 'frobnicate'" in _usage_error(shell, "frobnicate job")
    assert "invalid int value: 'many'" in _usage_error(shell, "profile job --steps many")
    assert "--steps must be >= 1, got 0" in _usage_error(shell, "profile job --steps 0")
    assert "--engines must be >= 1, got 0" in _usage_error(shell, "run job --engines 0")
    assert "invalid choice: 'restart'" in _usage_error(shell, "cluster restart")
    assert "the following arguments are required: JOB" in _usage_error(shell, "profile")
    assert "-o needs a variable name, got '1x'" in _usage_error(shell, "run job -o 1x")
    assert "no cluster is running: start one with %parallax cluster start" in _usage_error(shell, "calibrate")
    # through run_cell, as a notebook cell runs it: one line, no traceback
    capsys.readouterr()
    result = shell.run_cell("%parallax plan --bandwidth 10furlongs")
    assert not result.success
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "UsageError" in text and "Traceback" not in text


def test_missing_and_wrong_names(shell):
    assert "job 'no_such_job' is not defined in the notebook namespace" in _usage_error(shell, "profile no_such_job")
    assert "profile 'nope' is not defined" in _usage_error(shell, "plan nope")
    assert "plan 'missing_plan' is not defined" in _usage_error(shell, "run job --plan missing_plan")
    shell.user_ns["not_a_job"] = 42
    assert "job 'not_a_job' is a int, not a parallax_nb.Job" in _usage_error(shell, "profile not_a_job")
    assert "'job.nothing'" in _usage_error(shell, "profile job.nothing")
    assert "cannot import module" in _usage_error(shell, "profile no_module_here:job")


def test_journey_profile_plan_run_report_cluster(shell, tmp_path, capsys):
    shell.run_line_magic("parallax", "profile job --steps 2")
    from parallax_nb.types import Profile

    prof = shell.user_ns["profile"]
    assert isinstance(prof, Profile) and prof.model_name == shell.user_ns["job"].name

    assert "unparsable bandwidth 'fast'" in _usage_error(shell, "plan --bandwidth fast")
    shell.run_line_magic("parallax", "plan profile --machines 8 --workers-per-machine 6 --bandwidth 100Gbit/s "
                                     "--arch hybrid -o my_planner")
    planner, plan = shell.user_ns["my_planner"], shell.user_ns["plan"]
    assert planner.plan is plan and plan.cluster.machines == 8 and plan.cluster.workers_per_machine == 6
    assert plan.architecture.value == "hybrid" and plan.ps_variables

    # the remembered profile and plan: a report needs only a path
    shell.run_line_magic("parallax", f"report {tmp_path / 'plan_only.html'}")
    assert (tmp_path / "plan_only.html").exists() and (tmp_path / "plan_only.json").exists()

    capsys.readouterr()
    shell.run_line_magic("parallax", "cluster status")
    shell.run_line_magic("parallax", "cluster start --engines 2")
    shell.run_line_magic("parallax", "cluster start --engines 2")
    out = capsys.readouterr().out
    assert "2/2 engines alive" in out and "controller on 127.0.0.1" in out and "(reused)" in out

    assert "--plan my_planner is a hybrid plan but --arch is ps" in _usage_error(
        shell, "run job --plan my_planner --arch ps --steps 2")
    # the started cluster calibrated on its own engines; the next run takes it for its predictions
    assert "--timeout must be > 0 seconds, got 0" in _usage_error(shell, "calibrate --timeout 0")
    shell.run_line_magic("parallax", "calibrate -o cal")
    from parallax_nb.calibration import Calibration

    cal = shell.user_ns["cal"]
    out = capsys.readouterr().out
    assert isinstance(cal, Calibration) and cal.measured and cal.workers == 2, cal
    assert "-> `cal`" in out and "alltoall" in out and cal.fit("alltoall").latency_s > 0
    # a run that hangs is interrupted like Ctrl-C in a cell (Run.wait stops the engines)
    guard = threading.Timer(300, os.kill, (os.getpid(), signal.SIGINT))
    guard.start()
    try:
        shell.run_line_magic("parallax", "run job --engines 2 --steps 3 --arch ar -o r")
    finally:
        guard.cancel()
    run = shell.user_ns["r"]
    assert run.status == "done" and run.steps_done == 3 and len(run.history) == 3
    assert run.calibration is cal
    assert run.summary()["architecture"] == "ar" and run.summary()["ranks"] == 2
    assert run.predicted_bytes_by_variable()          # planned for 2 engines from the profile

    shell.run_line_magic("parallax", f"report {tmp_path / 'with_run.html'} --title 'tiny <LM>'")
    page = (tmp_path / "with_run.html").read_text()
    assert "tiny &lt;LM&gt;" in page
    assert "with_run.csv" in os.listdir(tmp_path)

    from parallax_nb.cluster import current_default_cluster

    cluster = current_default_cluster()
    pids = [e.pid for e in cluster.engines] + cluster.mpiexec_pids() + [cluster.controller_pid()]
    capsys.readouterr()
    shell.run_line_magic("parallax", "cluster stop")
    assert "cluster stopped" in capsys.readouterr().out
    left = [p for p in pids if p and psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after %parallax cluster stop: {left}"
    shell.run_line_magic("parallax", "cluster status")
    assert re.search(r"none started|stopped", capsys.readouterr().out)
