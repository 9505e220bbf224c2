"""Asynchronous training through the real trainer, from the plan's flag (issue 16), on real
Horovod over Open MPI: one launch per rank count (1, 2, 3).

* One worker: async equals sync to the bit (the tiny LM under architecture PS: sparse tables
  served through the lookups, dense LSTM and projection pulled whole).
* Exactly once, 2 and 3 ranks, max_staleness 0, 1 and None: a model whose gradient is 1 per
  row occurrence and entry (and 1 for its bias) ends at exactly ``initial - lr * (sum of all
  pushed gradients)``; all values are multiples of 1/8, exact in float32, so any lost or
  doubled push, or an update divided by the number of workers, changes the result. One rank
  sleeps after each step, so the others run ahead as far as the bound lets them.
"""
from __future__ import annotations

import numpy as np
import pytest

import async_trainer_cases as cases

pytestmark = pytest.mark.mpi

STEPS = 8
BOUNDS = (0, 1, None)


def test_one_worker_async_equals_sync_to_the_bit(tmp_path):
    from parallax_nb.launch import run_on_ranks

    launch = [("sync_against_async", dict(workload="lm", steps=5, partitions=2)),
              ("checkpoint_refused", dict(directory=str(tmp_path / "ckpt")))]
    compared, refused = run_on_ranks(cases.run_cases, 1, args=(launch,), timeout_s=300)[0]
    sync, asynchronous = compared["sync"], compared["async"]
    assert len(asynchronous["steps_ahead"]) == 5 and sync["steps_ahead"] == []   # it ran through AsyncPS
    assert asynchronous["losses"] == sync["losses"]
    trained = list(sync["variables"])
    assert trained and {v["method"] for v in sync["variables"].values()} == {"ps"}
    assert {v["kind"] for v in sync["variables"].values()} == {"sparse", "dense"}
    for name in trained:
        assert np.array_equal(asynchronous["weights"][name], sync["weights"][name]), name
    assert "checkpoints of asynchronous training are not written yet" in refused
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def _expected(ranks: int) -> tuple[np.ndarray, float]:
    """The table and bias after every push of every rank applied once: the W ranks together
    read the first W * BATCH * STEPS examples; each row occurrence's gradient is 1 / BATCH in
    every entry (the batch's mean loss), the bias gets 1 per step and rank."""
    ids = cases.example_ids()[:ranks * cases.BATCH * STEPS]
    occurrences = np.bincount(ids.reshape(-1), minlength=cases.ROWS).astype(np.float32)
    table = cases.initial_table() - np.float32(cases.LEARNING_RATE / cases.BATCH) * occurrences[:, None]
    return table, -cases.LEARNING_RATE * ranks * STEPS


@pytest.mark.parametrize("ranks, partitions", [(2, 3), (3, 2)])   # a rank owning two partitions; one owning none
def test_every_push_is_applied_exactly_once(ranks, partitions):
    from parallax_nb.launch import run_on_ranks

    launch = [("constant_gradient_case", dict(steps=STEPS, partitions=partitions, max_staleness=k, slow_rank=1,
                                              slow_s=0.03)) for k in BOUNDS]
    per_rank = run_on_ranks(cases.run_cases, ranks, args=(launch,), timeout_s=300)
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
            assert table_bytes[0] > 0 and table_bytes[1] > 0, (k, r["rank"], table_bytes)


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
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
