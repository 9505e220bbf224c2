"""Asynchronous training through the real trainer, from the plan's flag (issue 16), on real
Horovod over Open MPI: one launch per rank count (1, 2, 3).

* One worker: async equals sync to the bit (the tiny LM under architecture PS: sparse tables
  served through the lookups, dense LSTM and projection pulled whole).
* Exactly once, 2 and 3 ranks, max_staleness 0, 1 and None: a model whose gradient is 1 per
  row occurrence and entry (and 1 for its bias) ends at exactly ``initial - lr * (sum of all
  pushed gradients)``; all values are multiples of 1/8, exact in float32, so any lost or
  doubled push, or an update divided by the number of workers, changes the result. One rank
  sleeps after each step, so the others run ahead as far as the bound lets them.
* Checkpoints of asynchronous training, in the same 2- and 3-rank launches: every checkpoint
  loads into the single-device model and holds exactly ``initial - lr * (the pushes of every
  worker's steps before it)``; a run resumed from one ends exactly where the exactly-once
  expectation of all its steps is; a stop asked by one rank stops every rank together at the
  next checkpoint.
* Horovod is parked through the asynchronous steps and running again after each run (every
  case of a launch runs in the same processes, as on notebook engines).
* A step that raises on one rank (its NaN guard; its ``on_step`` callback), last in those
  launches (the second starts Horovod again after the first left it parked): that rank ends with its own error, every other rank with a DistributedError
  naming it, its host and its error within 10 s, and no rank has a serving thread left.
"""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import async_trainer_cases as cases
from test_reliability import _wait_gone

pytestmark = pytest.mark.mpi

STEPS = 8
BOUNDS = (0, 1, None)
RANKS_PARTITIONS = [(2, 3), (3, 2)]   # a rank owning two partitions; one owning none
CKPT = dict(steps=6, resume_to=8, stop_from=3, every=2, max_staleness=None, slow_rank=1, slow_s=0.03)
FAIL = dict(steps=30, fail_rank=1, fail_step=3)
FAILURES = ("nan", "callback")
NAMED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """ranks -> per case, every rank's result, from one launch per rank count: the exactly-once
    runs for each bound, the checkpoint runs, and the failing step (last: it leaves its
    communicators allocated)."""
    from parallax_nb.launch import run_on_ranks

    done, failed = {}, {}

    def launch(ranks: int, partitions: int) -> list[list[dict]]:
        if ranks in failed:   # not launched again for every test that needs it
            raise failed[ranks]
        if ranks not in done:
            directory = tmp_path_factory.mktemp(f"async-ckpt-{ranks}")
            plan = [("constant_gradient_case", dict(steps=STEPS, partitions=partitions, max_staleness=k, slow_rank=1,
                                                    slow_s=0.03)) for k in BOUNDS]
            plan += [("checkpoint_case", dict(CKPT, partitions=partitions, directory=str(directory)))]
            plan += [("adagrad_checkpoint_case", dict(steps=CKPT["steps"], resume_to=CKPT["resume_to"],
                                                      every=CKPT["every"], partitions=partitions,
                                                      directory=str(directory), slow_rank=1, slow_s=0.03))]
            plan += [("failing_step_case", dict(FAIL, partitions=partitions, how=how)) for how in FAILURES]
            start = time.perf_counter()
            try:
                per_rank = run_on_ranks(cases.run_cases, ranks, args=(plan,), timeout_s=420)
            except Exception as e:
                failed[ranks] = e
                raise
            print(f"\n{ranks}-rank launch: {time.perf_counter() - start:.1f} s")
            done[ranks] = [list(case) for case in zip(*per_rank)]
        return done[ranks]

    return launch


#: optimizers (tests/async_trainer_cases.make_optimizer) whose owner rule gives the synchronous
#: step's values to the bit; the others' synchronous step is rewritten by TensorFlow's graph
#: optimizer (``x / sqrt(y)`` as ``x * rsqrt(y)``, and weight decay's product), which moves
#: values by a float32 rounding or two: their rules equal Keras' own update to the bit
#: (tests/test_async_optimizer.py), and here sync within that rounding.
TO_THE_BIT = ("sgd", "adam_schedule")
WITHIN_ROUNDING = ("sgd_nesterov_clipnorm", "sgd_momentum_decay", "adamw_global_clipnorm", "adagrad_clipvalue",
                   "rmsprop")


@pytest.fixture(scope="module")
def one_worker():
    """optimizer -> the LM tiny trained 5 steps on one rank, synchronously and asynchronously
    (architecture PS), for every optimizer in one launch."""
    from parallax_nb.launch import run_on_ranks

    names = TO_THE_BIT + WITHIN_ROUNDING
    launch = [("sync_against_async", dict(workload="lm", steps=5, partitions=2, optimizer=n)) for n in names]
    return dict(zip(names, run_on_ranks(cases.run_cases, 1, args=(launch,), timeout_s=600)[0]))


def _assert_same_run(compared: dict, exact: bool) -> None:
    sync, asynchronous = compared["sync"], compared["async"]
    assert len(asynchronous["steps_ahead"]) == 5 and sync["steps_ahead"] == []   # it ran through AsyncPS
    trained = list(sync["variables"])
    assert trained and {v["method"] for v in sync["variables"].values()} == {"ps"}
    assert {v["kind"] for v in sync["variables"].values()} == {"sparse", "dense"}
    same = np.array_equal if exact else (lambda a, b: np.allclose(a, b, rtol=2e-6, atol=1e-7))
    assert same(asynchronous["losses"], sync["losses"]), (asynchronous["losses"], sync["losses"])
    for name in trained:
        assert same(asynchronous["weights"][name], sync["weights"][name]), (
            name, np.abs(asynchronous["weights"][name] - sync["weights"][name]).max())
    assert sorted(asynchronous["slots"]) == sorted(sync["slots"])
    for key in sync["slots"]:   # the owners' slots, written back into the optimizer's variables
        assert same(asynchronous["slots"][key], sync["slots"][key]), key


@pytest.mark.parametrize("optimizer", TO_THE_BIT)
def test_one_worker_async_equals_sync_to_the_bit(one_worker, optimizer):
    _assert_same_run(one_worker[optimizer], exact=True)
    if optimizer != "sgd":
        assert one_worker[optimizer]["sync"]["slots"]


@pytest.mark.parametrize("optimizer", WITHIN_ROUNDING)
def test_one_worker_async_equals_sync_within_the_graph_optimizers_rounding(one_worker, optimizer):
    compared = one_worker[optimizer]
    _assert_same_run(compared, exact=False)
    moved = max(np.abs(compared["sync"]["weights"][n] - compared["async"]["weights"][n]).max()
                for n in compared["sync"]["variables"])
    assert moved <= 5e-7, moved   # a rounding or two of values below 2, not a different update


def _expected(ranks: int, steps: int = STEPS) -> tuple[np.ndarray, float]:
    """The table and bias after every push of every rank's first ``steps`` steps applied once:
    the W ranks together read the first W * BATCH * steps examples; each row occurrence's
    gradient is 1 / BATCH in every entry (the batch's mean loss), the bias gets 1 per step and
    rank."""
    ids = cases.example_ids()[:ranks * cases.BATCH * steps]
    occurrences = np.bincount(ids.reshape(-1), minlength=cases.ROWS).astype(np.float32)
    table = cases.initial_table() - np.float32(cases.LEARNING_RATE / cases.BATCH) * occurrences[:, None]
    return table, -cases.LEARNING_RATE * ranks * steps


def _assert_exactly(weights: dict, ranks: int, steps: int, what: str) -> None:
    table, bias = _expected(ranks, steps)
    assert np.array_equal(weights[cases.TABLE], table), (what, np.abs(weights[cases.TABLE] - table).max())
    assert np.asarray(weights[cases.BIAS]).tolist() == [bias], (what, weights[cases.BIAS], bias)


@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_every_push_is_applied_exactly_once(launched, ranks, partitions):
    per_rank = [list(r) for r in zip(*launched(ranks, partitions))]   # rank -> case
    table, bias = _expected(ranks)
    assert not np.array_equal(table, cases.initial_table())
    for i, k in enumerate(BOUNDS):
        weights = per_rank[0][i]["weights"]
        assert np.array_equal(weights[cases.TABLE], table), (k, np.abs(weights[cases.TABLE] - table).max())
        assert weights[cases.BIAS].tolist() == [bias], k
        ahead = [r[i]["steps_ahead"] for r in per_rank]
        assert all(len(a) == STEPS for a in ahead), ahead
        if k is not None:
            assert max(max(a) for a in ahead) <= k, (k, ahead)
        losses = [r[i]["losses"] for r in per_rank]
        assert all(len(l) == STEPS and all(np.isfinite(l)) for l in losses)
        # every rank pulls and pushes rows it does not own: each counted some bytes both ways
        for r in per_rank:
            table_bytes = np.sum([step[cases.TABLE] for step in r[i]["bytes"]], axis=0)
            assert table_bytes[0] > 0 and table_bytes[1] > 0, (k, r[i]["rank"], table_bytes)
        # Horovod parked through the steps (its negotiation would spin), running again after
        # the run, and started again by the next run in the same process (the next case)
        assert all(r[i]["horovod_in_steps"] == [False] * STEPS for r in per_rank), k
        assert all(r[i]["horovod_after"] for r in per_rank), k


def test_cli_run_async_records_sync_and_the_measured_staleness(tmp_path):
    """``python -m parallax_nb run --async --max-staleness 1`` on 2 ranks (planned PS by default):
    run.json says asynchronous with its bound and every rank's measured staleness, which agrees
    with the per-step figures history.csv gathered from the ranks by another path."""
    import csv
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    steps = 6
    result = subprocess.run([sys.executable, "-m", "parallax_nb", "run", "async_trainer_cases:constant_gradient_job",
                             "--np", "2", "--steps", str(steps), "--output", str(out), "--async", "--max-staleness", "1",
                             "--timeout", "240"], cwd=REPO / "tests", env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert (run["sync"], run["max_staleness"]) == (False, 1)
    assert (run["executed_plan"]["sync"], run["executed_plan"]["max_staleness"]) == (False, 1)
    assert {v["method"] for v in run["variables"].values()} == {"ps"}
    staleness = run["staleness"]
    assert [r["rank"] for r in staleness["per_rank"]] == [0, 1] and staleness["max_staleness"] == 1
    assert all(r["steps"] == steps for r in staleness["per_rank"])
    assert 0 <= staleness["max_steps_ahead"] <= 1
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert len(rows) == 2 * steps and all(r["steps_ahead"] in ("0", "1") for r in rows)
    for r in staleness["per_rank"]:
        mine = [int(row["steps_ahead"]) for row in rows if int(row["rank"]) == r["rank"]]
        assert r["mean_steps_ahead"] == pytest.approx(sum(mine) / len(mine)) and r["max_steps_ahead"] == max(mine)
    assert "parallax_nb run: asynchronous, max staleness 1; steps ahead of the slowest: mean" in result.stderr
    # the run's end is checkpointed as the owners' final partitions: every push of the 2 x 6 steps
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"ckpt-{steps:08d}"]
    step, weights = _single_device(str(out / "checkpoints" / f"ckpt-{steps:08d}"))
    assert step == steps
    _assert_exactly(weights, 2, steps, "the CLI run's checkpoint")


def _single_device(path: str) -> tuple[int, dict]:
    """The checkpoint at ``path`` loaded into the user's single-device model (checksums verified)."""
    from parallax_nb.runtime.checkpoint import load_into_model

    model = cases.build_model()
    step = load_into_model(model, path)
    return step, {v.path: np.array(v.numpy()) for v in model.variables}


@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_checkpoints_of_async_training_hold_exactly_the_steps_before_them(launched, ranks, partitions):
    import json

    from parallax_nb.runtime.checkpoint import load

    records = launched(ranks, partitions)[len(BOUNDS)]
    every, steps = CKPT["every"], CKPT["steps"]
    paths = records[0]["checkpoints"]
    assert [r["checkpoints"] for r in records] == [paths] * ranks
    assert [p.rsplit("-", 1)[1] for p in paths] == [f"{c:08d}" for c in range(every, steps + 1, every)], paths
    for path in paths:
        step, weights = _single_device(path)
        _assert_exactly(weights, ranks, step, path)
        meta = json.load(open(f"{path}/meta.json"))
        assert (meta["sync"], meta["ranks"], meta["step"]) == (False, ranks, step)
        # the optimizer's counter says how far training went, as after synchronous steps
        assert int(load(path).optimizer(":iteration")) == step, path
    _assert_exactly(records[0]["weights"], ranks, steps, "the first run's end")


@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_async_resume_goes_on_from_the_checkpoint_exactly(launched, ranks, partitions):
    records = launched(ranks, partitions)[len(BOUNDS)]
    steps, resume_to = CKPT["steps"], CKPT["resume_to"]
    assert all(r["resumed_steps"] == list(range(steps + 1, resume_to + 1)) for r in records), records
    _assert_exactly(records[0]["resumed_weights"], ranks, resume_to, "the resumed run's end")
    newest = records[0]["resumed_checkpoints"][-1]
    assert newest.endswith(f"ckpt-{resume_to:08d}")
    step, weights = _single_device(newest)
    assert step == resume_to
    _assert_exactly(weights, ranks, resume_to, newest)


@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_optimizer_slots_hold_every_push_once_through_checkpoints_and_resume(launched, ranks, partitions):
    """Adagrad on the owners: each checkpoint's accumulators (its slot, single-device layout)
    are exactly the squares of the pushes of every worker's steps before it, and the resumed
    run's end exactly those of all its steps: the slots are served, snapshotted, written,
    restored and served again with the partitions, each push applied to them once."""
    from parallax_nb.runtime.checkpoint import load

    record = launched(ranks, partitions)[len(BOUNDS) + 1][0]
    paths = record["checkpoints"] + record["resumed_checkpoints"]
    steps = [int(p.rsplit("-", 1)[1]) for p in paths]
    assert steps == list(range(CKPT["every"], CKPT["resume_to"] + 1, CKPT["every"])), paths
    for path, step in zip(paths, steps):
        ckpt = load(path)
        table, bias = cases.expected_accumulators(ranks, step)
        assert not np.array_equal(table, cases.expected_accumulators(ranks, step - 1)[0])
        got = ckpt.optimizer(f"{cases.TABLE}:accumulator")
        assert np.array_equal(got, table), (path, np.abs(got - table).max())
        assert ckpt.optimizer(f"{cases.BIAS}:accumulator").tolist() == [bias], path
        assert int(ckpt.optimizer(":iteration")) == step, path
        assert np.all(np.isfinite(ckpt.weight(cases.TABLE))) and not np.array_equal(
            ckpt.weight(cases.TABLE), cases.initial_table()), path


@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_a_stop_asked_by_one_rank_stops_every_rank_at_the_next_checkpoint(launched, ranks, partitions):
    records = launched(ranks, partitions)[len(BOUNDS)]
    every, stop_from = CKPT["every"], CKPT["stop_from"]
    at = -(-stop_from // every) * every
    assert [(r["stopped_early"], r["stopped_steps_done"]) for r in records] == [(True, at)] * ranks
    paths = records[0]["stopped_checkpoints"]
    assert [r["stopped_checkpoints"] for r in records] == [paths] * ranks
    assert paths[-1].endswith(f"ckpt-{at:08d}"), paths
    _assert_exactly(records[0]["stopped_weights"], ranks, at, "the stopped run's end")
    _assert_exactly(_single_device(paths[-1])[1], ranks, at, paths[-1])


@pytest.mark.parametrize("how", FAILURES)
@pytest.mark.parametrize("ranks, partitions", RANKS_PARTITIONS)
def test_a_step_that_raises_on_one_rank_ends_every_rank_naming_it(launched, ranks, partitions, how):
    records = launched(ranks, partitions)[len(BOUNDS) + 2 + FAILURES.index(how)]
    fail_rank, fail_step = FAIL["fail_rank"], FAIL["fail_step"]
    failed = records[fail_rank]
    if how == "nan":
        assert failed["error"] == "NumericError", failed
        assert f"step {fail_step}: the loss is not finite (NaN or inf) on rank(s) [{fail_rank}]" in failed["message"]
        assert failed["steps_done"] == fail_step - 1
        cause = f"NumericError: step {fail_step}: the loss is not finite"
    else:
        assert (failed["error"], failed["message"]) == ("RuntimeError", f"the user's callback failed at step {fail_step}")
        assert failed["steps_done"] == fail_step
        cause = f"RuntimeError: the user's callback failed at step {fail_step}"
    host = socket.gethostname()
    for r in records:
        assert r["servers_alive"] == [] and r["server_released"], r
        if r is failed:
            continue
        assert r["error"] == "DistributedError", r
        assert (f"rank {r['rank']} stopped: rank {fail_rank} on host {host} failed during asynchronous training: "
                f"{cause}") in r["message"], r["message"]
        assert abs(r["raised_at"] - failed["raised_at"]) < NAMED_WITHIN_S, (r["raised_at"] - failed["raised_at"])


def test_a_sigkilled_rank_is_named_within_10_s_and_nothing_is_left(tmp_path):
    """``python -m parallax_nb run --async`` on 3 ranks; rank 1 SIGKILLs itself in step 4 while
    the others train (``max_staleness`` 2 holds them within reach). The launcher names rank 1,
    its host and the signal within 10 s of the kill, and no rank's process is left."""
    import os
    import re
    import subprocess
    import sys

    from conftest import REPO
    from parallax_nb.plan import plan_for_kinds

    plan, out, markers = tmp_path / "plan.json", tmp_path / "out", tmp_path / "markers"
    markers.mkdir()
    plan_for_kinds({cases.TABLE: "sparse", cases.BIAS: "dense"}, "ps", partitions=2,
                   model_name="constant_gradient").to_json(str(plan))
    env = dict(os.environ, PX_TEST_MARKERS=str(markers),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "parallax_nb", "run", "async_trainer_cases:killed_rank_job",
                             "--plan", str(plan), "--np", "3", "--steps", "40", "--output", str(out), "--async",
                             "--max-staleness", "2", "--timeout", "240"], cwd=REPO / "tests", env=env,
                            capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert (markers / "killed_at").exists(), result.stderr[-3000:]
    took = ended - float((markers / "killed_at").read_text())
    assert result.returncode == 2, result.stderr[-3000:]
    message = result.stderr[result.stderr.rindex("parallax_nb run: error:"):]
    assert re.search(rf"rank {cases.KILL_RANK} of 3 on host {re.escape(socket.gethostname())}\S* died: killed by "
                     rf"signal 9 \(SIGKILL\)", message), message
    assert took < NAMED_WITHIN_S, f"{took:.1f} s from the SIGKILL to the launcher's error"
    pids = [int((markers / f"pid-{r}").read_text()) for r in range(3)]
    assert not _wait_gone(pids, 0), f"ranks left running after the launcher returned: {_wait_gone(pids, 0)}"
    assert not (out / "model.keras").exists()
    print(f"\nasync, rank 1 SIGKILLed in step 4: named {took:.1f} s later: {message.splitlines()[0]}")


def test_a_sigkilled_rank_under_run_on_ranks_is_named_within_10_s(tmp_path):
    """The same through ``launch.run_on_ranks`` on 2 ranks: rank 1 SIGKILLs itself after step 4."""
    import re

    from parallax_nb.errors import DistributedError
    from parallax_nb.launch import run_on_ranks

    with pytest.raises(DistributedError) as info:
        run_on_ranks(cases.sigkilled_case, 2, args=(str(tmp_path), 40, 1, 4), timeout_s=240)
    took = time.time() - float((tmp_path / "killed_at").read_text())
    message = str(info.value)
    assert re.search(rf"rank 1 of 2 on host {re.escape(socket.gethostname())}\S* died: killed by signal 9 \(SIGKILL\)",
                     message), message[-3000:]
    assert took < NAMED_WITHIN_S, f"{took:.1f} s from the SIGKILL to the error"
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in range(2)]
    assert not _wait_gone(pids, 0), f"ranks left running: {_wait_gone(pids, 0)}"
    print(f"\nrun_on_ranks, async, rank 1 SIGKILLed after step 4: named {took:.1f} s later: {message.splitlines()[0]}")


def test_cli_async_nan_on_one_rank_names_that_rank(tmp_path):
    """``python -m parallax_nb run --async`` on 2 ranks, rank 1's loss NaN in step 3: the
    launcher's error is rank 1's NumericError (rank 0, stopped by rank 1's abort, may have
    written its own error too: it names rank 1 and comes after it)."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    from parallax_nb.plan import plan_for_kinds

    plan, out = tmp_path / "plan.json", tmp_path / "out"
    plan_for_kinds({cases.TABLE: "sparse", cases.BIAS: "dense"}, "ps", partitions=2,
                   model_name="constant_gradient").to_json(str(plan))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "parallax_nb", "run", "async_trainer_cases:nan_on_rank_1_job",
                             "--plan", str(plan), "--np", "2", "--steps", "30", "--output", str(out), "--async",
                             "--timeout", "240"], cwd=REPO / "tests", env=env, capture_output=True, text=True,
                            timeout=300)
    took = time.monotonic() - start
    assert result.returncode == 2, result.stderr[-3000:]
    message = result.stderr[result.stderr.rindex("parallax_nb run: error:"):]
    assert ("rank 1 of 2 failed:\nNumericError: step 3: the loss is not finite (NaN or inf) on rank(s) [1]"
            in message), message
    assert not (out / "model.keras").exists()
    print(f"\nCLI async NaN on rank 1: the run ended in {took:.1f} s: {message.splitlines()[0]}")


def test_failures_caused_by_another_rank_come_after_it(tmp_path):
    """The launchers' order of the ranks' error files: a rank that stopped because another
    failed (its message says so) comes after that rank even when it wrote first."""
    from parallax_nb.failures import failed_peer, peer_failure_message, read_failures

    caused = peer_failure_message(0, 1, "vm", "NumericError: step 3: the loss is not finite")
    (tmp_path / "error-0.txt").write_text(f"100.0\nDistributedError: {caused}\n")
    (tmp_path / "error-1.txt").write_text("100.5\nNumericError: step 3: the loss is not finite\n")
    (tmp_path / "error-2.txt").write_text("100.2\nDistributedError: rank 2 waited 60 s for rank 3\n")
    assert [rank for rank, _, _ in read_failures(str(tmp_path))] == [2, 1, 0]
    assert failed_peer(caused) == 1 and failed_peer("rank 2 waited 60 s for rank 3") is None
