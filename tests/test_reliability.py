"""Reliability and security under faults and bad input (issue 9), on real MPI engines.

One ipyparallel cluster of 2 MPI engines for the module (the notebook's shared default
cluster, so ``%parallax run`` uses it too); faults are injected from inside real training
(``tests/reliability_cases.py``), never by replacing TensorFlow, Horovod or MPI:

* a rank SIGKILLed mid-run: the run fails fast naming the rank and host, no process of the
  dead rank set is left, the cluster recovers; a second run is SIGKILLed *inside* a
  checkpoint write (the previous checkpoint stays loadable); ``%parallax run --resume``
  then reaches the same parameters as an uninterrupted run;
* a rank that hangs: ``step_timeout_s`` turns it into a DistributedError (on engines and
  under mpirun);
* stop of a real ``runtime.train`` run within 30 s, the next run works (KeyboardInterrupt in
  a waiting cell and an engine ignoring the stop are proved in tests/test_cluster.py);
* bad input through ``px.run``, the CLI, ``%parallax`` and the checkpoint loader;
* security: HMAC-signed messages (a message signed with another key is not executed),
  private launcher folders, checkpoints never unpickled, nothing listening beyond loopback.

Elsewhere already: connection files 0600 and the controller's loopback listeners
(tests/test_cluster.py::test_controller_on_loopback_and_private_connection_files), escaping
of user text in reports and the run view (tests/test_report.py::test_user_text_is_escaped,
tests/test_run_view.py::test_finished_and_failed_runs), profile-time bad input (float / out
of range ids, batch size: tests/test_profile.py; plans: tests/test_plan.py; CLI plan:
tests/test_cli_plan.py).

Fault runs use the AR plan of the tiny LM (FAULT_ARCH): fault handling lives in the
dispatcher and the trainer loop and does not depend on the architecture; HYBRID resume is
proved equal to an uninterrupted run in tests/test_runtime.py.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("horovod.tensorflow")

import reliability_cases as rc  # noqa: E402
from parallax_nb.errors import ConfigError, DistributedError, ParallaxError, PlanError  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.mpi]

FAULT_ARCH = "ar"
STEPS = 10
EVERY = 2
FAIL_WITHIN_S = 60.0
STOP_WITHIN_S = 30.0
HANG_LIMIT_S = 45.0     # step_timeout_s (5 s) + failure grace (3 s) + slack for a busy machine
OUR_ERRORS = {"ParallaxError", "ConfigError", "JobError", "ProfileError", "PlanError", "CheckpointError",
              "DistributedError", "NumericError"}


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cluster():
    from parallax_nb.cluster import default_cluster, stop_default_cluster

    c = default_cluster(2)
    yield c
    pids = _cluster_pids(c)
    stop_default_cluster()
    assert not _wait_gone(pids, 20), f"left running after the cluster stopped: {_wait_gone(pids, 0)}"


@pytest.fixture(scope="module")
def job():
    from parallax_nb.workloads import lm_job

    return lm_job("tiny")


@pytest.fixture(scope="module")
def plan(job):
    from parallax_nb.runtime.reference import default_plan

    return default_plan(job, FAULT_ARCH)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="module")
def reference(cluster, job, plan, work):
    """An uninterrupted run: STEPS steps, checkpoints every EVERY steps."""
    from parallax_nb.cluster import run

    the_run = run(job, plan, engines=2, steps=STEPS, cluster=cluster, checkpoint_dir=str(work / "uninterrupted"),
                  checkpoint_every=EVERY, display=False, wait=False)
    _wait_or_abort(the_run, 300, "uninterrupted reference run")
    assert the_run.status == "done", the_run.message
    the_run.test_checkpoint_dir = str(work / "uninterrupted")
    return the_run


@pytest.fixture(scope="module")
def killed(cluster, job, plan, work, reference):
    """A run whose rank 1 engine is SIGKILLed by the test after step 3 (steps slowed to 0.5 s)."""
    from parallax_nb.cluster import run

    ckpt = work / "interrupted"
    the_run = run(job, plan, engines=2, steps=STEPS, cluster=cluster, checkpoint_dir=str(ckpt),
                  checkpoint_every=EVERY, train_fn=functools.partial(rc.faulty_train, step_delay_s=0.5),
                  display=False, wait=False, failure_grace_s=5.0)
    _wait_for_steps(the_run, 3)
    victim = cluster.engines[1]
    before = _cluster_pids(cluster, include_controller=False)
    mpiexec = cluster.mpiexec_pids()
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    the_run.wait(timeout=FAIL_WITHIN_S + 60, raise_on_error=False)
    failed_after_s = time.monotonic() - killed_at
    left = _wait_gone(before, 20)
    gone_after_s = time.monotonic() - killed_at
    print(f"\nSIGKILL of rank 1 after step {the_run.steps_done}: run failed {failed_after_s:.1f} s later, "
          f"old engines/nannies/mpiexec gone {gone_after_s:.1f} s after the kill; error: {the_run.error}")
    return dict(run=the_run, victim=victim, failed_after_s=failed_after_s, left=left, before=before,
                mpiexec=mpiexec, checkpoint_dir=ckpt)


@pytest.fixture(scope="module")
def crashed_in_write(cluster, job, plan, work, killed):
    """Resume of the killed run, whose rank 0 SIGKILLs itself inside the next checkpoint write."""
    from parallax_nb.cluster import run
    from parallax_nb.runtime.checkpoint import latest_checkpoint, load

    ckpt = killed["checkpoint_dir"]
    previous = latest_checkpoint(str(ckpt))
    assert previous is not None, "the killed run left no checkpoint"
    step = load(previous).step
    target = step + EVERY
    assert target <= STEPS
    markers = work / "crash-markers"
    markers.mkdir()
    the_run = run(job, plan, engines=2, steps=STEPS, cluster=cluster, checkpoint_dir=str(ckpt), checkpoint_every=EVERY,
                  resume=True, train_fn=functools.partial(rc.faulty_train, kill_in_checkpoint_at=target,
                                                          marker_dir=str(markers)),
                  display=False, wait=False, failure_grace_s=5.0)
    _wait_or_abort(the_run, 240, "run killed inside a checkpoint write")
    return dict(run=the_run, previous=previous, previous_step=step, target=target, markers=markers,
                checkpoint_dir=ckpt)


# ----------------------------------------------------------------------------- a rank dies
def test_sigkilled_rank_fails_fast_naming_rank_and_host(killed, cluster):
    from parallax_nb.widgets.run_view import RunView

    the_run, victim = killed["run"], killed["victim"]
    assert the_run.status == "failed", the_run
    assert killed["failed_after_s"] < FAIL_WITHIN_S, f"failure surfaced {killed['failed_after_s']:.1f} s after SIGKILL"
    err = the_run.error
    assert isinstance(err, DistributedError)
    message = str(err)
    assert "rank 1" in message and victim.host in message, message
    assert re.search(r"SIGKILL|signal 9|died|killed", message), message
    view = RunView(the_run)                       # the notebook's run view shows the failure
    assert "rank 1" in view.error.value and view.progress.bar_style == "danger"


def test_no_process_of_the_dead_rank_set_is_left(killed, cluster):
    assert not killed["left"], f"still running after the rank died: {killed['left']}"
    cluster.start()                                 # restarts the engines (the controller lived on)
    assert cluster.alive()
    expected = sorted(e.pid for e in cluster.engines)
    deadline = time.monotonic() + 15
    while sorted(p.pid for p in _engine_processes()) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    mine = _engine_processes()
    assert sorted(p.pid for p in mine) == expected, \
        [(p.pid, p.ppid(), round(time.time() - p.create_time(), 1), p.cmdline()[-2:]) for p in mine]
    mpiexecs = [p for p in psutil.Process().children(recursive=True) if _is_mpiexec(p)]
    assert sorted(p.pid for p in mpiexecs) == sorted(cluster.mpiexec_pids())


def test_crash_inside_checkpoint_write_keeps_previous_checkpoint(crashed_in_write, job):
    from parallax_nb.runtime.checkpoint import latest_checkpoint, load_into_model

    c = crashed_in_write
    assert (c["markers"] / "killed_in_write_at").exists(), "rank 0 never reached the checkpoint write"
    assert c["run"].status == "failed" and "rank 0" in str(c["run"].error), c["run"]
    ckpt = c["checkpoint_dir"]
    partial = [p for p in os.listdir(ckpt) if p.startswith(f".tmp-ckpt-{c['target']:08d}")]
    assert partial, f"no half-written checkpoint: {os.listdir(ckpt)}"
    assert latest_checkpoint(str(ckpt)) == c["previous"], os.listdir(ckpt)
    assert load_into_model(job.build_model(), c["previous"]) == c["previous_step"]


def test_resume_with_magic_equals_uninterrupted(crashed_in_write, reference, cluster):
    from IPython.core.interactiveshell import InteractiveShell

    c = crashed_in_write
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "parallax_nb")
    shell.user_ns.update(rel_job=reference.job, rel_plan=reference.plan)
    start = time.monotonic()
    shell.run_line_magic("parallax", f"run rel_job --plan rel_plan --engines 2 --steps {STEPS} "
                                     f"--checkpoint-dir {c['checkpoint_dir']} --checkpoint-every {EVERY} "
                                     f"--resume -o rel_resumed")
    resumed = shell.user_ns["rel_resumed"]
    assert resumed.status == "done", resumed
    assert resumed.records[0]["step"] == c["previous_step"] + 1 and resumed.steps_done == STEPS
    assert set(resumed.weights) == set(reference.weights)
    worst = 0.0
    for name, expected in reference.weights.items():
        if "seed_generator" in name:
            continue  # Keras' unseeded RNG state, different in every run and unused by the LM (no dropout)
        got = np.asarray(resumed.weights[name])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
        worst = max(worst, float(np.max(np.abs(got - expected))) if got.size else 0.0)
    print(f"\nresumed from step {c['previous_step']} in {time.monotonic() - start:.1f} s: max |diff| "
          f"to the uninterrupted run {worst:.2e}")


# ----------------------------------------------------------------------------- a rank hangs
def test_hung_rank_on_engines_becomes_a_distributed_error(cluster, job, plan, work):
    """Rank 1 sleeps for ever after step 2; rank 0 blocks in the next collective; step_timeout_s=5."""
    from parallax_nb.cluster import run

    markers = work / "hang-markers"
    markers.mkdir()
    old = _cluster_pids(cluster, include_controller=False)
    the_run = run(job, plan, engines=2, steps=1000, cluster=cluster, step_timeout_s=5.0,
                  train_fn=functools.partial(rc.faulty_train, hang_rank=1, hang_after_step=2, marker_dir=str(markers)),
                  display=False, wait=False, failure_grace_s=3.0)
    ended = _wait_or_abort(the_run, 240, None, abort_after_s=HANG_LIMIT_S, start_file=markers / "hang_at")
    hang_at = float((markers / "hang_at").read_text())
    assert ended, ("a hung rank was not turned into an error within "
                   f"{HANG_LIMIT_S:g} s with step_timeout_s=5 (the run waited until the test aborted it)")
    took = time.time() - hang_at
    assert the_run.status == "failed" and isinstance(the_run.error, DistributedError), the_run
    message = str(the_run.error)
    assert re.search(r"rank \d", message) and "host" in message, message
    print(f"\nhung rank -> failed {took:.1f} s after the hang: {message}")
    assert took < FAIL_WITHIN_S
    assert re.search(r"did not finish within|time(d)? ?out", message), \
        f"the error does not say that a step timed out: {message}"
    assert not _wait_gone(old, 20)


def test_hung_rank_under_mpirun_becomes_a_distributed_error(job, plan, tmp_path):
    """The same hang through ``launch.run_on_ranks`` (the CLI's route): the trainer's watchdog."""
    from parallax_nb.launch import run_on_ranks

    start = time.time()
    with pytest.raises(DistributedError) as info:
        run_on_ranks(rc.hang_on_ranks, 2, args=(job.to_bytes(), plan.to_json(), 1, 2, 5.0, str(tmp_path)),
                     timeout_s=240)
    ended = time.time()
    message = str(info.value)
    assert "did not finish within 5 s" in message and re.search(r"rank \d of 2 failed", message), message[-2000:]
    hang_at = float((tmp_path / "hang_at").read_text())
    assert ended - hang_at < FAIL_WITHIN_S, f"{ended - hang_at:.1f} s from the hang to the error"
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2 and not _wait_gone(pids, 10)
    # the launcher's folder of pickled payloads and results is private to this user
    assert (tmp_path / "workdir_mode").read_text() == "0o700"
    print(f"\nmpirun: hang -> DistributedError {ended - hang_at:.1f} s later (launch {ended - start:.1f} s)")


# ----------------------------------------------------------------------------- interrupt
def test_stop_of_a_real_training_run_within_30_s_then_next_run(cluster, job, plan):
    from parallax_nb.cluster import run

    pids = [e.pid for e in cluster.start().engines]
    the_run = run(job, plan, engines=2, steps=100000, cluster=cluster, display=False, wait=False,
                  train_fn=functools.partial(rc.faulty_train, step_delay_s=0.2))
    _wait_for_steps(the_run, 2)
    start = time.monotonic()
    the_run.stop(timeout=STOP_WITHIN_S + 30)
    latency = time.monotonic() - start
    assert the_run.status == "stopped" and latency < STOP_WITHIN_S, (the_run, latency)
    assert [e.pid for e in cluster.engines] == pids, "the engines were restarted instead of stopping cleanly"
    after = run(job, plan, engines=2, steps=2, cluster=cluster, display=False)
    assert after.status == "done" and after.steps_done == 2
    print(f"\nstop of runtime.train after {the_run.steps_done} steps: {latency:.2f} s; next run fine")


# ----------------------------------------------------------------------------- bad input on engines
def _bad_data_job(kind: str):
    data = {"shapes": rc.shapes_differ_between_ranks, "float_ids": rc.float_ids, "out_of_range": rc.ids_out_of_range,
            "negative": rc.negative_ids, "few": rc.too_few_examples}[kind]
    return rc.lm_job_with_data(data, name=f"bad-{kind}")


BAD_DATA = [
    # case, what the message must contain (regex, case-insensitive, across lines)
    ("shapes", r"shape.*(, 6[\])]|\(6\)|6 tokens)"),
    ("float_ids", r"(integer.*float32|float32.*integer)"),
    ("out_of_range", r"5000.*(1003|0\.\.1002)"),
    ("negative", r"-3\b.*(range|>= ?0|negative)"),
    ("few", r"(no|0|too few|fewer|empty|only 1)\b.{0,80}example|example.{0,80}(no|0|too few|fewer|empty)"),
]


@pytest.mark.parametrize("case,pattern", BAD_DATA, ids=[c for c, _ in BAD_DATA])
def test_bad_data_on_engines_is_named(case, pattern, cluster, plan):
    err, the_run = _run_bad(cluster, _bad_data_job(case), plan)
    _assert_clean_error(err, pattern, case)


def test_plan_from_another_model_is_named(cluster, job):
    from parallax_nb.runtime.reference import default_plan
    from parallax_nb.workloads import recommender_job

    other = default_plan(recommender_job("tiny"), "hybrid")
    with pytest.raises(PlanError, match="does not match"):
        other.validate_for([v.path for v in job.build_model().trainable_variables])
    err, _ = _run_bad(cluster, job, other)
    _assert_clean_error(err, r"does not match this model.*embedding/embeddings", "plan of another model")


@pytest.mark.parametrize("damage", ["meta", "array"])
def test_corrupted_checkpoint_on_resume_is_named(damage, cluster, job, plan, reference, work):
    source = _last_checkpoint(reference)
    folder = work / f"corrupt-{damage}"
    shutil.copytree(source, folder / os.path.basename(source))
    _damage(folder / os.path.basename(source), damage)
    err, _ = _run_bad(cluster, job, plan, steps=STEPS + 2, checkpoint_dir=str(folder), resume=True)
    _assert_clean_error(err, r"checkpoint.*(corrupted|unreadable|not valid)", f"corrupted checkpoint ({damage})")


def test_nan_on_engines_stops_the_run_naming_the_step(cluster):
    """px.run is guarded like the command line: SGD at learning rate 1e30 under HYBRID."""
    from parallax_nb.runtime.reference import default_plan

    job = rc.recommender_with(learning_rate=1e30, name="recommender-lr-1e30")
    err, the_run = _run_bad(cluster, job, default_plan(job, "hybrid"), steps=6)
    _assert_clean_error(err, r"step \d: the loss is not finite \(NaN or inf\) on rank\(s\) \[0, 1\]", "NaN on engines")
    assert the_run.steps_done < 6


def test_async_step_that_raises_on_one_engine_fails_the_run_naming_that_rank(cluster):
    """Asynchronous training on 2 engines, rank 1's loss NaN in step 3: rank 1 raises its
    NumericError and aborts its server, rank 0 stops naming it; the run's error is rank 1's
    (the one that failed first), not rank 0's, nothing hangs, and the engines stay up."""
    import cloudpickle

    import async_trainer_cases as atc
    from parallax_nb.cluster import run

    pids = [e.pid for e in cluster.start().engines]
    cloudpickle.register_pickle_by_value(atc)   # tests/ is not importable on the engines
    try:
        the_run = run(atc.nan_labels_job(1, 3), atc._constant_plan(2, None), engines=2, steps=30, cluster=cluster,
                      display=False, wait=False, failure_grace_s=2.0, step_timeout_s=60.0)
    finally:
        try:
            cloudpickle.unregister_pickle_by_value(atc)
        except ValueError:
            pass
    start = time.monotonic()
    assert _wait_or_abort(the_run, 90, None, abort_after_s=90), "the asynchronous run hung after rank 1 failed"
    took = time.monotonic() - start
    _assert_clean_error(the_run.error, r"^rank 1 \(engine \d+ on host \S+\) failed: NumericError: step 3: the loss is "
                                       r"not finite \(NaN or inf\) on rank\(s\) \[1\]", "async NaN on one engine")
    assert [e.pid for e in cluster.engines] == pids and cluster.alive()
    print(f"\nasync NaN on engine rank 1: run failed {took:.1f} s after it started")


def test_async_sigkilled_engine_is_named_within_10_s_and_nothing_is_left(cluster):
    """Asynchronous training (max_staleness 2) on 2 engines, steps slowed by the data to 0.2 s;
    the test SIGKILLs rank 1's engine after step 3: the run fails within 10 s naming rank 1
    and its host, the old engines, nannies and mpiexec are gone, and the cluster restarts."""
    import cloudpickle

    import async_trainer_cases as atc
    from parallax_nb.cluster import run

    cluster.start()
    cloudpickle.register_pickle_by_value(atc)   # tests/ is not importable on the engines
    try:
        the_run = run(atc.slow_constant_gradient_job(), atc._constant_plan(2, 2), engines=2, steps=300,
                      cluster=cluster, display=False, wait=False, failure_grace_s=5.0)
    finally:
        try:
            cloudpickle.unregister_pickle_by_value(atc)
        except ValueError:
            pass
    _wait_for_steps(the_run, 3)
    victim = cluster.engines[1]
    before = _cluster_pids(cluster, include_controller=False)
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    the_run.wait(timeout=60, raise_on_error=False)
    failed_after_s = time.monotonic() - killed_at
    left = _wait_gone(before, 20)
    assert the_run.status == "failed" and isinstance(the_run.error, DistributedError), the_run
    message = str(the_run.error)
    assert "rank 1" in message and victim.host in message and re.search(r"SIGKILL|signal 9", message), message
    assert failed_after_s < 10.0, f"the async run failed {failed_after_s:.1f} s after the SIGKILL"
    assert not left, f"still running after the rank died: {left}"
    cluster.start()
    assert cluster.alive()
    print(f"\nasync, SIGKILL of engine rank 1 after step {the_run.steps_done}: failed {failed_after_s:.1f} s later: "
          f"{message.splitlines()[0]}")


def test_cluster_is_usable_after_bad_input(cluster, job, plan):
    from parallax_nb.cluster import run

    after = run(job, plan, engines=2, steps=1, cluster=cluster, display=False)
    assert after.status == "done" and cluster.alive()


# ----------------------------------------------------------------------------- bad input, local
def test_bad_values_are_named_at_the_entry_points(job, plan):
    import parallax_nb as px

    for bad in (0, -4):
        with pytest.raises(ConfigError, match=f"batch_size must be positive, got {bad}"):
            px.Job(model=job.model, loss=job.loss, optimizer=job.optimizer, data=job.data, batch_size=bad)
    with pytest.raises(ConfigError, match=r"whole number, got 2\.5"):
        job.replace(batch_size=2.5)
    with pytest.raises(ConfigError, match=r"machines must be a whole number >= 1, got 0"):
        px.ClusterSpec(machines=0)
    with pytest.raises(ConfigError, match=r"machines must be a whole number >= 1, got 0"):
        px.ClusterSpec.create(machines=0, bandwidth="10Gbit/s")
    with pytest.raises(ConfigError, match=r"unparsable bandwidth 'ten gigabit'"):
        px.ClusterSpec.create(machines=2, bandwidth="ten gigabit")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"steps must be a whole number >= 1, got 0"):
        px.run(job, plan, engines=2, steps=0, display=False)
    with pytest.raises(ConfigError, match=r"engines must be a whole number >= 1, got -1"):
        px.run(job, plan, engines=-1, steps=2, display=False)
    assert time.monotonic() - started < 5, "bad arguments must be refused before any engine starts"


def test_corrupted_plan_json_is_named_by_cli_and_magic(plan, job, tmp_path):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from parallax_nb.launch import rank_environment
    from parallax_nb.plan import Plan

    corrupted = tmp_path / "plan.json"
    corrupted.write_text(plan.to_json()[:150])
    with pytest.raises(PlanError, match=r"plan.json is not valid JSON"):
        Plan.from_json(str(corrupted))
    proc = subprocess.run([sys.executable, "-m", "parallax_nb", "run", "parallax_nb.workloads:lm_tiny", "--plan",
                           str(corrupted), "--np", "2", "--steps", "2", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=rank_environment())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "plan.json is not valid JSON" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "ranks:" not in proc.stderr, "mpirun was started with a corrupted plan"
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "parallax_nb")
    shell.user_ns["rel_job"] = job
    with pytest.raises(UsageError, match=r"plan.json is not valid JSON"):
        shell.run_line_magic("parallax", f"run rel_job --plan {corrupted} --engines 2 --steps 2")


def test_corrupted_checkpoints_are_refused_and_never_unpickled(reference, job, tmp_path):
    from parallax_nb.errors import CheckpointError
    from parallax_nb.runtime.checkpoint import load, load_into_model

    source = _last_checkpoint(reference)
    for damage, pattern in (("meta", "is corrupted"), ("array", "unreadable"), ("pickle", "unreadable")):
        path = tmp_path / damage / "ckpt-00000010"
        shutil.copytree(source, path)
        marker = tmp_path / f"unpickled-{damage}"
        _damage(path, damage, marker=marker)
        with pytest.raises(CheckpointError, match=pattern) as info:
            load_into_model(job.build_model(), str(path))
        assert str(path) in str(info.value)
        assert not marker.exists(), "a pickle inside a checkpoint was loaded"
    with pytest.raises(CheckpointError, match="meta.json missing"):
        load(str(tmp_path))


# ----------------------------------------------------------------------------- security
def test_messages_signed_with_another_key_are_not_executed(cluster, tmp_path):
    """ipyparallel signs every message with the session key of the connection file (HMAC-SHA256);
    engines drop messages whose signature does not verify, so only this session's client can
    have code (or pickles) run on the engines, and progress data is verified the same way."""
    client = cluster.start().client
    files = {os.path.basename(f): f for f in cluster.connection_files()}
    client_file = next(f for name, f in files.items() if name.endswith("-client.json"))
    with open(client_file) as f:
        info = json.load(f)
    assert stat.S_IMODE(os.stat(client_file).st_mode) == 0o600
    assert info["signature_scheme"] == "hmac-sha256" and len(info["key"]) >= 16
    assert client.session.key == info["key"].encode() and client.session.auth is not None

    forged, genuine = tmp_path / "forged", tmp_path / "genuine"
    key = client.session.key
    try:
        client.session.key = b"another-key-" + os.urandom(8).hex().encode()
        pending = client[cluster.engine_ids[0]].apply_async(os.mkdir, str(forged))
        with pytest.raises(Exception):
            pending.get(timeout=8)
    finally:
        client.session.key = key
    assert not forged.exists(), "an engine ran a message signed with another key"
    client[cluster.engine_ids[0]].apply_async(os.mkdir, str(genuine)).get(timeout=60)
    assert genuine.is_dir()


def test_nothing_of_the_cluster_listens_beyond_loopback(cluster):
    """The controller (tested in test_cluster.py), its schedulers, the engines (MPI ranks) and
    their nannies accept connections on loopback only."""
    cluster.start()
    controller = psutil.Process(cluster.controller_pid())
    processes = [controller, *controller.children(recursive=True)]
    for engine in cluster.engines:
        p = psutil.Process(engine.pid)
        processes += [p, *p.children(recursive=True)]
    exposed = {}
    for p in processes:
        wide = [f"{c.laddr.ip}:{c.laddr.port}" for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and not _loopback(c.laddr.ip)]
        if wide:
            exposed[f"{p.pid} {' '.join(p.cmdline()[1:4])}"] = wide
    mpiexec = {pid: [f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process(pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN] for pid in cluster.mpiexec_pids()}
    print(f"\nmpiexec's own listeners (Open MPI's runtime, not configurable to loopback here): {mpiexec}")
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_reaper_kills_the_cluster_of_a_killed_notebook(tmp_path):
    """A notebook kernel SIGKILLed with a running cluster leaves no controller, mpiexec or engine."""
    script = (
        "import json, sys, time\n"
        "from parallax_nb.cluster import Cluster\n"
        "c = Cluster(n=1).start()\n"
        "pids = [c.controller_pid(), *c.mpiexec_pids(), *(e.pid for e in c.engines)]\n"
        f"open({str(tmp_path / 'pids.json')!r}, 'w').write(json.dumps(pids))\n"
        "time.sleep(600)\n")
    from parallax_nb.launch import rank_environment

    proc = subprocess.Popen([sys.executable, "-c", script], env=rank_environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "pids.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "pids.json").exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ""
        pids = json.loads((tmp_path / "pids.json").read_text())
        descendants = _cluster_pids_of(pids)
        assert len(pids) == 3 and len(descendants) >= 3
        killed_at = time.monotonic()
        proc.kill()
        proc.wait()
        left = _wait_gone(descendants, 30)
        assert not left, f"orphans {time.monotonic() - killed_at:.1f} s after the kernel died: {left}"
        print(f"\nkernel SIGKILLed: its cluster's {len(descendants)} processes gone in "
              f"{time.monotonic() - killed_at:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------------------- helpers
def _run_bad(cluster, job, plan, steps: int = 3, **kwargs):
    """Run ``job`` with bad input; (error or None, Run or None). A run that neither ends nor
    fails within 90 s is aborted (engines restarted) and reported as a hang."""
    import cloudpickle

    from parallax_nb.cluster import run

    # the bad data functions live in tests/, which engines cannot import: send them by value
    # (dispatch unregisters the module after pickling a train_fn, so register before each run)
    cloudpickle.register_pickle_by_value(rc)
    try:
        the_run = run(job, plan, engines=2, steps=steps, cluster=cluster, display=False, wait=False,
                      failure_grace_s=2.0, step_timeout_s=60.0, **kwargs)
    except ParallaxError as e:          # refused in the notebook, before any engine ran: the best case
        return e, None
    finally:
        try:
            cloudpickle.unregister_pickle_by_value(rc)
        except ValueError:
            pass
    if not _wait_or_abort(the_run, 90, None, abort_after_s=90):
        pytest.fail(f"{job.name}: the run hung on bad input and had to be aborted")
    if the_run.error is None:
        pytest.fail(f"{job.name}: bad input was accepted: the run ended '{the_run.status}' without an error "
                    f"({the_run.steps_done} steps)")
    return the_run.error, the_run


def _assert_clean_error(err, pattern: str, what: str) -> None:
    """A ParallaxError whose message names the problem and the value, raised as one of ours on
    the ranks (not a TensorFlow / MPI error or a bare Python exception), with no deep traceback."""
    assert isinstance(err, ParallaxError), f"{what}: {type(err).__name__}: {err}"
    message = str(err)
    ename = getattr(err, "ename", type(err).__name__)
    assert ename in OUR_ERRORS, f"{what}: a rank raised {ename}, not a parallax_nb error: {message[:1500]}"
    assert re.search(pattern, message, re.IGNORECASE | re.DOTALL), f"{what}: message lacks {pattern!r}: {message}"
    assert "Traceback" not in message and "site-packages/tensorflow" not in message, f"{what}: {message[:1500]}"
    print(f"\n{what}: {message.splitlines()[0][:300]}")


def _last_checkpoint(the_run) -> str:
    from parallax_nb.runtime.checkpoint import latest_checkpoint

    path = latest_checkpoint(the_run.test_checkpoint_dir)
    assert path is not None and path.endswith(f"ckpt-{STEPS:08d}"), path
    return path


def _damage(path, how: str, marker=None) -> None:
    """Corrupt a checkpoint folder: truncate meta.json, truncate an array, or replace an array
    by a pickled object array that would create ``marker`` if it were unpickled."""
    path = str(path)
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    array = os.path.join(path, sorted(meta["weights"].values())[0])
    if how == "meta":
        with open(meta_path, "r+") as f:
            f.truncate(len(f.read()) // 2)
    elif how == "array":
        with open(array, "r+b") as f:
            f.truncate(os.path.getsize(array) // 2)
    elif how == "pickle":
        np.save(array, np.array([rc.Unpickler(str(marker or os.devnull))], dtype=object), allow_pickle=True)
    else:
        raise ValueError(how)


def _loopback(ip: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def _is_mpiexec(p) -> bool:
    try:
        return os.path.basename(p.cmdline()[0]) in ("mpiexec", "mpirun", "orterun")
    except (psutil.Error, IndexError):
        return False


def _engine_processes() -> list:
    """ipyparallel engines (not nannies) started by this process (through mpiexec)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if ("ipyparallel.engine" in cmd and "nanny" not in cmd and not _is_mpiexec(p)
                    and p.status() != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _cluster_pids_of(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out += [p.pid] + [c.pid for c in p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return sorted(set(out))


def _cluster_pids(cluster, include_controller: bool = True) -> list[int]:
    """Engines, their nannies and mpiexec (and the controller with its schedulers)."""
    roots = [*cluster.mpiexec_pids(), *(e.pid for e in cluster.engines)]
    if include_controller and cluster.controller_pid():
        roots.append(cluster.controller_pid())
    return _cluster_pids_of(roots)


def _wait_gone(pids, timeout_s: float) -> list[int]:
    """Pids still alive (not zombies) after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _wait_for_steps(the_run, steps: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while the_run.steps_done < steps and not the_run.done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert the_run.steps_done >= steps, the_run


def _wait_or_abort(the_run, timeout_s: float, what: str | None, abort_after_s: float | None = None,
                   start_file=None) -> bool:
    """Wait for the run; past the limit abort it (engines restarted) so nothing is left hanging.
    ``abort_after_s`` counts from when ``start_file`` appears (e.g. the injected hang).
    Returns True when the run ended by itself; raises if ``what`` names a run that must end."""
    deadline = time.monotonic() + timeout_s
    while not the_run.done and time.monotonic() < deadline:
        if start_file is not None and start_file.exists():
            deadline = min(deadline, time.monotonic() + abort_after_s)
            start_file = None
        the_run.wait(timeout=0.5, raise_on_error=False)
    if the_run.done:
        return True
    the_run._controller.abort("test limit reached")
    the_run.wait(timeout=60, raise_on_error=False)
    if what is not None:
        pytest.fail(f"{what} did not end within {timeout_s:g} s: {the_run}")
    return False
