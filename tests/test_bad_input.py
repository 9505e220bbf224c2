"""Bad input and faults that used to end in a silently wrong result, a hang or a deep traceback
(issue 19), each now a clear error.

Every case asserts that the message names the problem and the value, that it carries no
traceback from inside TensorFlow or MPI, that nothing is left running, and that no file is
half-written. Three groups:

* **local** (no MPI): the command line's refusals before ``mpirun`` starts, the API's
  value checks, checkpoint verification, the guards' rules. Run in-process through
  ``parallax_nb.__main__.main`` (the same code the console script runs).
* **one grouped launch** (``launch.run_on_ranks``, 2 ranks): every case of
  ``reliability_cases.GUARD_CASES`` trains in turn in the same ranks: NaN under AR, PS and
  HYBRID, inf data on one rank, labels that broadcast, data without labels, a corrupted
  newest checkpoint, every checkpoint corrupted, a stale temporary folder, a layer name
  tf.function refuses.
* **command line runs** (``python -m parallax_nb run``, 2 ranks each): NaN at learning rate
  1e30, ids out of range at step 9 under PS, a rank hanging in its first batch and in step 1,
  a SIGKILLed rank, two runs on one output folder; and nothing left in /tmp.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import reliability_cases as rc
from parallax_nb.errors import ParallaxError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
STEP_TIMEOUT_S = 10.0
HANG_GRACE_S = 10.0     # the bound: a hang is reported within step timeout + 10 s


# ----------------------------------------------------------------------------- helpers
def _cli(argv, capsys) -> tuple[int, str]:
    """``python -m parallax_nb ...`` in this process: (exit status, stderr)."""
    from parallax_nb.__main__ import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def _assert_clear(text: str, pattern: str) -> None:
    assert re.search(pattern, text, re.IGNORECASE | re.DOTALL), f"message lacks {pattern!r}:\n{text[-3000:]}"
    assert "Traceback" not in text and "site-packages/tensorflow" not in text, text[-3000:]


def _no_half_written(folder) -> None:
    """No temporary or half-written file anywhere under ``folder``."""
    if not os.path.isdir(folder):
        return
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            assert not name.startswith((".tmp", ".parallax-write-probe")), os.path.join(root, name)


def _mpi_children() -> list:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def lm_plan_file(tmp_path_factory):
    """An AR plan of the tiny LM (no profile needed: the CLI then starts no quick profile)."""
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.reference import variable_kinds

    job = rc.good_lm_job()
    path = tmp_path_factory.mktemp("plans") / "lm-ar.json"
    plan_for_kinds(variable_kinds(job), "ar", model_name=job.name).to_json(str(path))
    ps = tmp_path_factory.mktemp("plans") / "lm-ps.json"
    plan_for_kinds(variable_kinds(job), "ps", model_name=job.name).to_json(str(ps))
    return {"ar": str(path), "ps": str(ps)}


# ----------------------------------------------------------------------------- local: the command line
def _run_argv(out, *extra):
    return ["run", "reliability_cases:good_lm_job", "--np", "2", "--steps", "2", "--output", str(out), *extra]


CLI_CASES = [
    # id, argv (OUT = the output folder), what the message must say
    ("job-spec-no-colon", ["run", "reliability_cases", "--steps", "1", "--output", "OUT"], r"not of the form module:name"),
    ("job-module-missing", ["run", "no_such_module:job", "--steps", "1", "--output", "OUT"],
     r"cannot import module 'no_such_module'"),
    ("job-attr-missing", ["run", "reliability_cases:no_such_job", "--steps", "1", "--output", "OUT"],
     r"has no attribute 'no_such_job'"),
    ("job-not-a-job", ["run", "reliability_cases:HANG_S", "--steps", "1", "--output", "OUT"], r"not a parallax_nb\.Job"),
    ("np-zero", _run_argv("OUT", "--np", "0"), r"--np must be >= 1, got 0"),
    ("np-negative", _run_argv("OUT", "--np", "-3"), r"--np must be >= 1, got -3"),
    ("steps-negative", ["run", "reliability_cases:good_lm_job", "--steps", "-1", "--output", "OUT"],
     r"--steps must be >= 0, got -1"),
    ("checkpoint-every-negative", _run_argv("OUT", "--checkpoint-every", "-2"), r"--checkpoint-every must be >= 0, got -2"),
    ("plan-and-arch", _run_argv("OUT", "--plan", "PLAN", "--arch", "ar"), r"either --plan or --arch"),
    ("plan-missing", _run_argv("OUT", "--plan", "/nonexistent/plan.json"), r"plan file '/nonexistent/plan.json' does not exist"),
    ("plan-truncated", _run_argv("OUT", "--plan", "TRUNCATED"), r"plan.json is not valid JSON"),
    ("plan-not-a-plan", _run_argv("OUT", "--plan", "NOTAPLAN"), r"plan|schema"),
    ("workers-per-machine", _run_argv("OUT", "--workers-per-machine", "3"), r"--workers-per-machine .*divide --np=2, got 3"),
    ("partitions-zero", _run_argv("OUT", "--partitions", "0"), r"--partitions must be .*got '0'"),
    ("partitions-text", _run_argv("OUT", "--partitions", "many"), r"--partitions must be .*got 'many'"),
    ("step-timeout-zero", _run_argv("OUT", "--step-timeout", "0"), r"--step-timeout must be a positive .*got 0"),
    ("timeout-negative", _run_argv("OUT", "--timeout", "-5"), r"--timeout must be a positive .*got -5"),
    ("output-is-a-file", _run_argv("FILE"), r"--output '.*not-a-folder' is an existing file"),
    ("output-read-only-fs", _run_argv("/proc/parallax-out"), r"output folder '/proc/parallax-out' is not writable"),
    ("resume-nothing", _run_argv("OUT", "--resume"), r"--resume: there is no checkpoint to resume from in .*checkpoints"),
    ("resume-both", _run_argv("OUT", "--resume", "--resume-if-present"), r"either --resume or --resume-if-present"),
    ("np-beyond-host", _run_argv("OUT", "--np", "64"), r"--np 64 does not fit this host: .*64 ranks"),
    ("hostfile-missing", _run_argv("OUT", "--hostfile", "/nonexistent/hosts"), r"hostfile '/nonexistent/hosts' does not exist"),
    ("profile-without-memory", _run_argv("OUT", "--profile", "NOTAPLAN"), r"--profile .* has no peak_memory_bytes"),
    ("output-in-use", _run_argv("LOCKED"), r"in use by another run: pid \d+ on host other-host"),
]


@pytest.mark.parametrize("case,argv,pattern", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_command_line_refuses_before_mpirun(case, argv, pattern, tmp_path, capsys, monkeypatch, lm_plan_file):
    monkeypatch.syspath_prepend(TESTS)
    out = tmp_path / "out"
    truncated = tmp_path / "plan.json"
    truncated.write_text(open(lm_plan_file["ar"]).read()[:150])
    not_a_plan = tmp_path / "notaplan.json"
    not_a_plan.write_text(json.dumps({"hello": 1}))
    file_out = tmp_path / "not-a-folder"
    file_out.write_text("precious")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / ".parallax-run.lock").write_text(json.dumps({"pid": os.getpid(), "host": "other-host", "started": "x"}))
    names = {"OUT": out, "PLAN": lm_plan_file["ar"], "TRUNCATED": truncated, "NOTAPLAN": not_a_plan,
             "FILE": file_out, "LOCKED": locked}
    argv = [str(names.get(a, a)) for a in argv]
    started = time.monotonic()
    code, err = _cli(argv, capsys)
    assert code == 2, err
    _assert_clear(err, pattern)
    assert "ranks:" not in err, "mpirun was started"
    assert time.monotonic() - started < 30
    assert file_out.read_text() == "precious"
    assert (locked / ".parallax-run.lock").exists(), "another run's lock was removed"
    _no_half_written(tmp_path)
    assert not _mpi_children()


def test_unwritable_output_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """An immutable folder (chattr +i: even root cannot write there) is named before mpirun."""
    monkeypatch.syspath_prepend(TESTS)
    out = tmp_path / "immutable"
    out.mkdir()
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here: no way to make a folder unwritable for root")
    try:
        code, err = _cli(_run_argv(out), capsys)
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    assert code == 2
    _assert_clear(err, r"output folder '.*immutable' is not writable: Operation not permitted")
    assert "ranks:" not in err and os.listdir(out) == []


def test_force_goes_on_past_the_host_check(capsys):
    from parallax_nb.launch import check_host_resources

    check_host_resources(64, force=True)
    assert re.search(r"warning: 64 ranks need about .* GiB .*going on \(--force\)", capsys.readouterr().err)
    check_host_resources(1)  # one rank fits anywhere this suite runs


def test_profile_peak_memory_sizes_the_host_check():
    from parallax_nb.errors import ConfigError
    from parallax_nb.launch import available_memory_bytes, check_host_resources

    free = available_memory_bytes()
    with pytest.raises(ConfigError, match=r"2 ranks need about .*the profile's peak"):
        check_host_resources(2, peak_bytes_per_rank=free)


# ----------------------------------------------------------------------------- local: the API
def _api_cases():
    import parallax_nb as px
    from parallax_nb.workloads import lm_job

    job = lm_job("tiny")

    def not_callable_model():
        px.Job(model=42, loss=job.loss, optimizer=job.optimizer, data=job.data, batch_size=4)

    def data_one_arg():
        px.Job(model=job.model, loss=job.loss, optimizer=job.optimizer, data=lambda shard: None, batch_size=4)

    def optimizer_not_optimizer():
        job.replace(optimizer=lambda: "sgd").make_optimizer()

    def model_not_model():
        job.replace(model=lambda: "a model").build_model()

    def data_not_dataset():
        job.replace(data=lambda: [1, 2, 3]).examples()

    def plan_of_other_model():
        from parallax_nb.plan import plan_for_kinds
        from parallax_nb.runtime.reference import variable_kinds

        other = rc.recommender_with(name="other")
        plan_for_kinds(variable_kinds(other), "hybrid").validate_for(
            [v.path for v in job.build_model().trainable_variables])

    def plan_unknown_method():
        from parallax_nb.plan import Plan, plan_for_kinds
        from parallax_nb.runtime.reference import variable_kinds

        d = json.loads(plan_for_kinds(variable_kinds(job), "hybrid").to_json())
        first = d["variables"][0] if isinstance(d["variables"], list) else next(iter(d["variables"].values()))
        first["method"] = "carrier-pigeon"
        Plan.from_json(json.dumps(d))

    return [
        ("batch-size-zero", lambda: job.replace(batch_size=0), r"batch_size must be positive, got 0"),
        ("batch-size-negative", lambda: job.replace(batch_size=-4), r"batch_size must be positive, got -4"),
        ("batch-size-fraction", lambda: job.replace(batch_size=2.5), r"whole number, got 2\.5"),
        ("batch-size-bool", lambda: job.replace(batch_size=True), r"whole number, got True"),
        ("machines-zero", lambda: px.ClusterSpec(machines=0), r"machines must be a whole number >= 1, got 0"),
        ("bandwidth-text", lambda: px.ClusterSpec.create(machines=2, bandwidth="ten gigabit"),
         r"unparsable bandwidth 'ten gigabit'"),
        ("bandwidth-negative", lambda: px.ClusterSpec.create(machines=2, bandwidth="-1Gbit/s"), r"-1"),
        ("model-not-callable", not_callable_model, r"Job\.model must be callable"),
        ("data-one-argument", data_one_arg, r"takes 1 required arguments"),
        ("optimizer-not-optimizer", optimizer_not_optimizer, r"must return a keras\.optimizers\.Optimizer, got str"),
        ("model-not-model", model_not_model, r"must return a keras\.Model, got str"),
        ("data-not-dataset", data_not_dataset, r"must return a tf\.data\.Dataset, got list"),
        ("plan-of-other-model", plan_of_other_model, r"does not match"),
        ("plan-unknown-method", plan_unknown_method, r"carrier-pigeon"),
        ("run-steps-zero", lambda: px.run(job, None, engines=2, steps=0, display=False),
         r"steps must be a whole number >= 1, got 0"),
        ("run-engines-negative", lambda: px.run(job, None, engines=-1, steps=2, display=False),
         r"engines must be a whole number >= 1, got -1"),
        ("run-step-timeout-negative", lambda: px.run(job, None, engines=2, steps=2, step_timeout_s=-1, display=False),
         r"step_timeout_s must be a positive number of seconds, got -1"),
        ("run-resume-without-folder", lambda: px.run(job, None, engines=2, steps=2, resume=True, display=False),
         r"resume=True needs checkpoint_dir"),
        ("run-calibration-path", lambda: px.run(job, None, engines=2, steps=2, calibration="cal.json", display=False),
         r"calibration must be a parallax_nb Calibration, got str"),
    ]


API_IDS = ["batch-size-zero", "batch-size-negative", "batch-size-fraction", "batch-size-bool", "machines-zero",
           "bandwidth-text", "bandwidth-negative", "model-not-callable", "data-one-argument",
           "optimizer-not-optimizer", "model-not-model", "data-not-dataset", "plan-of-other-model",
           "plan-unknown-method", "run-steps-zero", "run-engines-negative", "run-step-timeout-negative",
           "run-resume-without-folder", "run-calibration-path"]


@pytest.mark.parametrize("case", API_IDS)
def test_api_refuses_bad_values(case):
    cases = {c: (fn, pattern) for c, fn, pattern in _api_cases()}
    fn, pattern = cases[case]
    with pytest.raises(ParallaxError) as info:
        fn()
    _assert_clear(str(info.value), pattern)
    assert not _mpi_children()


# ----------------------------------------------------------------------------- local: the guards' rules
LABEL_CASES = [
    # id, labels shape, output shape, integer labels, plain loss (no Keras squeeze), refused
    ("labels-7-vs-1", (8, 7), (8, 1), False, False, True),
    ("labels-scalar-plain-loss", (8,), (8, 1), False, True, True),
    ("labels-scalar-keras-loss", (8,), (8, 1), False, False, False),
    ("labels-class-ids-column", (8, 1), (8, 10), True, False, False),
    ("labels-class-ids", (8,), (8, 10), True, False, False),
    ("labels-float-column-vs-classes", (8, 1), (8, 10), False, False, True),
    ("labels-equal", (8, 3), (8, 3), False, False, False),
]


@pytest.mark.parametrize("case,ys,ps,integer,plain,refused", LABEL_CASES, ids=[c[0] for c in LABEL_CASES])
def test_labels_are_checked_with_the_loss_broadcasting_rules(case, ys, ps, integer, plain, refused):
    import keras
    import tensorflow as tf

    from parallax_nb.runtime.guards import label_problem

    y = tf.zeros(ys, tf.int32 if integer else tf.float32)
    p = tf.zeros(ps)
    value = tf.square(tf.cast(y, tf.float32) - p) if plain else None
    if value is None and not integer:
        value = keras.losses.mean_squared_error(y, p)
    problem = label_problem(y, p, value)
    assert bool(problem) == refused, problem
    if refused:
        assert str(ys) in problem and str(ps) in problem, problem


# ----------------------------------------------------------------------------- one grouped launch
@pytest.fixture(scope="module")
def guards(tmp_path_factory):
    from parallax_nb.launch import run_on_ranks

    work = tmp_path_factory.mktemp("guards")
    started = time.monotonic()
    results = run_on_ranks(rc.guard_cases, 2, args=(str(work),), timeout_s=600)
    print(f"\n{len(rc.GUARD_CASES)} guard cases on 2 ranks: {time.monotonic() - started:.1f} s")
    assert results[0] == results[1] or all(results[0][c]["message"] == results[1][c]["message"]
                                           for c in rc.GUARD_CASES)
    return dict(results=results[0], work=work)


NAN_PATTERN = r"step \d+: the loss is not finite \(NaN or inf\) on rank\(s\) \[0, 1\]"


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["nan_lr_ar", "nan_lr_hybrid", "nan_lr_ps"])
def test_nan_stops_the_run_in_its_step_and_nothing_non_finite_is_saved(case, guards):
    r = guards["results"][case]
    assert r["error"] == "NumericError", r
    _assert_clear(r["message"], NAN_PATTERN + r"|step \d+: .*not finite|not written: .*non-finite")
    step = int(re.search(r"step (\d+)", r["message"]).group(1))
    assert step <= 3, r["message"]
    assert r["checkpoints"], "the last good checkpoint is gone"
    assert all(v is True for v in r["checkpoints"].values()), r["checkpoints"]   # every array finite
    assert max(int(n[5:]) for n in r["checkpoints"]) < step or "not written" in r["message"]
    assert r["temporaries"] == []


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["nan_row_gradient_rank_1", "nan_row_gradient_rank_1_ar"])
def test_nan_row_gradient_is_named_on_the_rank_whose_batch_made_it(case, guards):
    """The loss is finite; one row's gradient is NaN, made by rank 1's batch of step 3. Rank 1
    is named. HYBRID (the table PS, the row owned by rank 0): ranks check the row gradients
    they send. AR (the table's rows allgathered): ranks check their own gradient before it."""
    r = guards["results"][case]
    assert r["error"] == "NumericError", r
    _assert_clear(r["message"], r"^step 3: a gradient is not finite on rank\(s\) \[1\];")
    assert sorted(r["checkpoints"]) == ["ckpt-00000001", "ckpt-00000002"] and all(r["checkpoints"].values())


@pytest.mark.mpi
def test_inf_on_one_rank_names_that_rank_and_step(guards):
    r = guards["results"]["inf_data_rank_1"]
    assert r["error"] == "NumericError", r
    _assert_clear(r["message"], r"^step 3: the loss is not finite \(NaN or inf\) on rank\(s\) \[1\]")
    assert sorted(r["checkpoints"]) == ["ckpt-00000001", "ckpt-00000002"] and all(r["checkpoints"].values())


@pytest.mark.mpi
@pytest.mark.parametrize("case,pattern", [
    ("labels_width_7", r"labels of shape \(8, 7\) and model outputs of shape \(8, 1\) broadcast"),
    ("labels_plain_loss_broadcast", r"labels of shape \(8,\) and model outputs of shape \(8, 1\) broadcast to \(8, 8\)"),
    ("features_only", r"must yield \(x, y\) pairs"),
    ("layer_name", r"layer name 'my layer!' cannot be used inside tf\.function"),
])
def test_bad_labels_and_names_are_refused_before_step_1(case, pattern, guards):
    r = guards["results"][case]
    assert r["error"] == "JobError", r
    _assert_clear(r["message"], pattern)
    assert r["checkpoints"] == {} and r["temporaries"] == []


@pytest.mark.mpi
def test_corrupted_newest_checkpoint_falls_back_to_the_previous(guards):
    r = guards["results"]["checkpoint_fallback"]
    assert r["error"] is None, r
    assert r["first_step"] == 3 and r["steps_done"] == 6, r   # resumed from ckpt-2, not ckpt-4 nor step 0
    assert str(r["checkpoints"]["ckpt-00000002"]) == "True"


@pytest.mark.mpi
def test_every_checkpoint_corrupted_is_an_error_not_a_fresh_start(guards):
    r = guards["results"]["all_checkpoints_corrupt"]
    assert r["error"] == "CheckpointError", r
    _assert_clear(r["message"], r"no valid checkpoint in .*ckpt-00000004.*SHA-256 does not match.*ckpt-00000002")


@pytest.mark.mpi
def test_stale_temporary_checkpoint_folder_is_removed_at_the_next_start(guards):
    r = guards["results"]["stale_temporary_removed"]
    assert r["error"] is None and r["temporaries"] == [], r


# ----------------------------------------------------------------------------- local: checkpoints
def _copy_checkpoint(guards, tmp_path) -> str:
    source = os.path.join(str(guards["work"]), "checkpoint_fallback", "ckpt-00000006")
    target = tmp_path / "ckpt-00000006"
    shutil.copytree(source, target)
    return str(target)


def _damage(path: str, how: str) -> None:
    meta_path = os.path.join(path, "meta.json")
    meta = json.load(open(meta_path))
    array = os.path.join(path, sorted(meta["weights"].values())[0])
    if how == "bytes-ff":
        with open(array, "r+b") as f:
            f.seek(os.path.getsize(array) - 60)
            f.write(b"\xff" * 60)
    elif how == "truncated":
        with open(array, "r+b") as f:
            f.truncate(os.path.getsize(array) // 2)
    elif how == "missing-file":
        os.unlink(array)
    elif how == "manifest-edited":
        meta["step"] = 999
        json.dump(meta, open(meta_path, "w"))
    elif how == "h5-altered":
        h5 = os.path.join(path, "model.weights.h5")
        with open(h5, "r+b") as f:
            f.seek(os.path.getsize(h5) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        raise ValueError(how)


CHECKPOINT_DAMAGE = [("bytes-ff", r"unreadable: its SHA-256 does not match"),
                     ("truncated", r"unreadable: its SHA-256 does not match"),
                     ("missing-file", r"is incomplete: arrays/.*\.npy is missing"),
                     ("manifest-edited", r"is corrupted: meta\.json does not match its checksum"),
                     ("h5-altered", r"model\.weights\.h5 of .* is unreadable")]


@pytest.mark.mpi
@pytest.mark.parametrize("how,pattern", CHECKPOINT_DAMAGE, ids=[c for c, _ in CHECKPOINT_DAMAGE])
def test_damaged_checkpoint_is_named_by_path(how, pattern, guards, tmp_path):
    from parallax_nb.runtime.checkpoint import load_into_model

    path = _copy_checkpoint(guards, tmp_path)
    _damage(path, how)
    with pytest.raises(ParallaxError) as info:
        load_into_model(rc.recommender_with().build_model(), path)
    _assert_clear(str(info.value), pattern)
    assert path in str(info.value)


@pytest.mark.mpi
def test_checkpoint_of_another_model_size_is_named(guards, tmp_path):
    from parallax_nb.runtime.checkpoint import load_into_model
    from parallax_nb.workloads import recommender_job

    path = _copy_checkpoint(guards, tmp_path)
    bigger = recommender_job("tiny", embedding_dim=7).build_model()
    with pytest.raises(ParallaxError) as info:
        load_into_model(bigger, path)
    _assert_clear(str(info.value), r"has shape .* the model expects")


class _Saved:
    """What ``checkpoint._write`` reads of a trainer: the job, the plan, the step, the ranks
    (a plain record; the arrays written are real model weights)."""

    def __init__(self, job, step):
        from parallax_nb.plan import plan_for_kinds
        from parallax_nb.runtime.reference import variable_kinds

        self.job, self.step, self.ranks = job, step, 1
        self.plan = plan_for_kinds(variable_kinds(job), "hybrid")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk that fills up) needs root")
def test_full_disk_names_path_and_bytes_and_keeps_the_previous_checkpoint(tmp_path):
    from parallax_nb.errors import CheckpointError
    from parallax_nb.runtime import checkpoint

    disk = tmp_path / "small-disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mount is not permitted here")
    try:
        job = rc.recommender_with()
        model = job.build_model()
        weights = {v.path: np.asarray(v.numpy()) for v in model.variables}
        (disk / "ckpt-00000002").mkdir()
        (disk / "ckpt-00000002" / "meta.json").write_text("{}")
        target = str(disk / "ckpt-00000004")
        big = dict(weights, padding=np.zeros(2**19, np.float32))   # 2 MiB: more than the disk holds
        with pytest.raises(CheckpointError) as info:
            checkpoint._write(target, _Saved(job, 4), big, {})
        _assert_clear(str(info.value), r"no room for checkpoint .*ckpt-00000004: it needs about \d+ bytes .* free")
        assert sorted(os.listdir(disk)) == ["ckpt-00000002"]     # nothing half-written, the previous kept
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ----------------------------------------------------------------------------- command line runs
def _launch(argv, markers=None, tmpdir=None):
    """Start ``python -m parallax_nb ...``; ``tmpdir``: its TMPDIR (so a test can see exactly
    what this run, its mpirun and its ranks leave there, whatever else runs on the machine)."""
    from parallax_nb.launch import rank_environment

    env = rank_environment({"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")})
    if markers is not None:
        env["PX_TEST_MARKERS"] = str(markers)
    if tmpdir is not None:
        os.makedirs(tmpdir, exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen([sys.executable, "-m", "parallax_nb", *map(str, argv)], cwd=TESTS, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc, timeout=300) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the command line run did not end within {timeout} s:\n{err[-3000:]}")
    return proc.returncode, err


def _final_error(err: str) -> str:
    """The launcher's own error (after its echo of the ranks' output)."""
    marker = "parallax_nb run: error:"
    assert marker in err, err[-3000:]
    return err[err.rindex(marker):]


@pytest.mark.mpi
def test_cli_nan_at_learning_rate_1e30_stops_with_the_step_and_keeps_checkpoints(lm_plan_file, tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    code, err = _finish(_launch(["run", "reliability_cases:nan_lm_job", "--plan", lm_plan_file["ar"], "--np", 2,
                                 "--steps", 8, "--checkpoint-every", 1, "--output", out], tmpdir=tmp))
    assert code == 2, err[-3000:]
    message = _final_error(err)
    _assert_clear(message, r"NumericError: step \d: the loss is not finite .* on rank\(s\) \[0, 1\]|"
                           r"NumericError: checkpoint of step \d not written")
    assert not (out / "model.keras").exists(), "a model was written from a diverged run"
    from parallax_nb.runtime.checkpoint import checkpoint_folders, load

    kept = checkpoint_folders(str(out / "checkpoints"))
    assert kept, "no checkpoint before the NaN was kept"
    for path in kept:
        ckpt = load(path, verify=True)
        assert all(np.isfinite(np.asarray(ckpt.weight(n))).all() for n in ckpt.weight_names), path
    _no_half_written(out)
    assert not (out / ".parallax-run.lock").exists()
    assert os.listdir(tmp) == [], f"left in TMPDIR: {os.listdir(tmp)}"
    print(f"\nlr 1e30: {message.splitlines()[0]}; kept {[os.path.basename(p) for p in kept]}")


@pytest.mark.mpi
def test_cli_ids_out_of_range_at_step_9_under_ps_name_variable_global_id_and_range(lm_plan_file, tmp_path):
    out = tmp_path / "out"
    code, err = _finish(_launch(["run", "reliability_cases:late_bad_ids_job", "--plan", lm_plan_file["ps"], "--np", 2,
                                 "--steps", 12, "--output", out]))
    assert code == 2, err[-3000:]
    message = _final_error(err)
    _assert_clear(message, rf"rank 1 of 2 failed:\nJobError: embedding id 5000 is out of range for '[\w/]+': valid ids "
                           rf"are 0\.\.1002 \(1003 rows\); seen in the batch of step {rc.LATE_BAD_STEP} on rank 1")
    assert not (out / "model.keras").exists()
    _no_half_written(out)


@pytest.mark.mpi
@pytest.mark.parametrize("job,where", [("hang_in_first_batch_job", r"start-up|step 1"), ("hang_in_step_1_job", r"step 1")])
def test_cli_hang_before_step_2_is_caught_within_timeout_plus_10_s_naming_the_rank(job, where, lm_plan_file, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = _launch(["run", f"reliability_cases:{job}", "--plan", lm_plan_file["ar"], "--np", 2, "--steps", 4,
                    "--step-timeout", STEP_TIMEOUT_S, "--output", tmp_path / "out"], markers=markers)
    code, err = _finish(proc, timeout=240)
    ended = time.time()
    assert code == 2, err[-3000:]
    message = _final_error(err)
    hang_at = float((markers / "hang_at").read_text())
    took = ended - hang_at
    _assert_clear(message, rf"rank \d of 2 failed:\nDistributedError: rank \d on host \S+: ({where}) did not finish "
                           rf"within {STEP_TIMEOUT_S:g} s")
    blamed = re.search(r"rank\(s\) \[(\d)\], which did not arrive|rank (\d) on host \S+: .*this rank is the one behind",
                       message)
    assert blamed and "1" in blamed.groups(), f"rank 1 hung but is not the one named: {message}"
    assert took < STEP_TIMEOUT_S + HANG_GRACE_S, f"{took:.1f} s from the hang to the error"
    assert not _mpi_children()
    print(f"\n{job}: error {took:.1f} s after the hang (step timeout {STEP_TIMEOUT_S:g} s): {message.splitlines()[1]}")


@pytest.mark.mpi
def test_cli_run_stopped_at_its_timeout_names_open_mpis_failed_connection(lm_plan_file, tmp_path):
    """A rank prints Open MPI's failed-connection warning and hangs (no step timeout): the
    run's --timeout stops it, and the error names the connection; no process is left."""
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = _launch(["run", "reliability_cases:connect_warning_then_hang_job", "--plan", lm_plan_file["ar"], "--np", 2,
                    "--steps", 4, "--timeout", 60, "--output", tmp_path / "out"], markers=markers)
    code, err = _finish(proc, timeout=240)
    assert (markers / "hang_at").exists(), err[-3000:]
    assert code == 2, err[-3000:]
    _assert_clear(_final_error(err), r"the run did not finish within 60 s and was stopped \(Open MPI had reported a "
                                     r"failed TCP connection between two of its ranks: on pxnbd9cbm0: connect\(\) to "
                                     r"10\.213\.1\.3:1024 failed: Operation now in progress \(115\)\)")
    assert not _mpi_children()


@pytest.mark.mpi
def test_cli_names_a_sigkilled_rank_and_its_host(lm_plan_file, tmp_path):
    import socket

    markers = tmp_path / "markers"
    markers.mkdir()
    code, err = _finish(_launch(["run", "reliability_cases:killed_at_step_4_job", "--plan", lm_plan_file["ar"], "--np", 2,
                                 "--steps", 8, "--output", tmp_path / "out"], markers=markers))
    assert (markers / "killed_at").exists(), err[-3000:]
    assert code == 2, err[-3000:]
    message = _final_error(err)
    _assert_clear(message, rf"rank 1 of 2 on host {re.escape(socket.gethostname())}\S* died: killed by signal 9 "
                           rf"\(SIGKILL\)")
    assert not _mpi_children()


@pytest.mark.mpi
def test_cli_second_run_on_one_output_is_refused_and_nothing_is_left_in_tmp(lm_plan_file, tmp_path):
    """The first run is still running when the second starts; after it, its TMPDIR (where the
    launcher's folder, Open MPI's session folder and the ranks' temporary files go) is empty."""
    import socket

    out, tmp = tmp_path / "out", tmp_path / "tmp"
    first = _launch(["run", "reliability_cases:good_lm_job", "--plan", lm_plan_file["ar"], "--np", 2, "--steps", 3,
                     "--output", out, "--resume-if-present"], tmpdir=tmp)   # nothing to resume: starts at step 0
    deadline = time.monotonic() + 60
    while not (out / ".parallax-run.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    second = _launch(["run", "reliability_cases:good_lm_job", "--plan", lm_plan_file["ar"], "--np", 2, "--steps", 3,
                      "--output", out])
    code2, err2 = _finish(second, timeout=120)
    code1, err1 = _finish(first)
    assert code1 == 0, err1[-3000:]
    assert code2 == 2, err2[-3000:]
    _assert_clear(_final_error(err2), rf"in use by another run: pid {first.pid} on host {re.escape(socket.gethostname())}")
    assert (out / "model.keras").exists() and not (out / ".parallax-run.lock").exists()
    rows = (out / "history.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 2, rows     # one run's history, not two interleaved
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "1", "2", "2", "3", "3"], rows
    _no_half_written(out)
    assert os.listdir(tmp) == [], f"left in TMPDIR: {os.listdir(tmp)}"
    # a lock left by a dead process is taken over
    (out / ".parallax-run.lock").write_text(json.dumps({"pid": 999999, "host": socket.gethostname(), "started": "x"}))
    from parallax_nb.cli.output_folder import OutputLock

    with OutputLock(str(out)):
        assert json.loads((out / ".parallax-run.lock").read_text())["pid"] == os.getpid()
    assert not (out / ".parallax-run.lock").exists()
