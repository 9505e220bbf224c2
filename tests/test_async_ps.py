"""Asynchronous PS (``parallax_nb.runtime.async_ps``, issue 16) on real MPI ranks, 2 and 3 of them.

Two mpirun launches (module-scoped fixtures) run every case (``async_ps_cases``) and bring back
what each worker pulled and pushed, when its steps began and ended, its snapshot and its final
partitions. The checks recompute, in this process with numpy, what those pushes must have done:

* exactly once: the final table is ``initial - lr * (sum of every push of every worker)``;
* snapshot after step c: ``initial - lr * (sum of the pushes of every worker's steps < c)``;
* SSP's read guarantee: a pull at step t sees at least every push of the others' steps
  < t - k and its own steps < t, and at most the others' steps <= t + k and its own < t;
* SSP's bound, from timestamps alone: when a worker began step t, every other worker had
  ended at least t - k steps.

Gradients are constants per example and the learning rate a power of two: every value stays
an exact float32, so the comparisons are exact (a push applied twice or lost moves a row by
at least lr = 0.125). One rank sleeps every step, so workers really drift apart.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import async_ps_cases as cases
from parallax_nb.errors import ConfigError
from parallax_nb.runtime.async_ps import AsyncPS
from parallax_nb.runtime.served_tables import ServedTable, sum_duplicates
from parallax_nb.runtime.owner_optimizers import SGD
from parallax_nb.runtime.partitioning import RowPartitioning

pytestmark = pytest.mark.mpi

STEPS = 12
SNAPSHOT_AT = 6
SLOW_RANK, SLOW_S = 1, 0.04
STALENESS = (0, 1, None)
RUNS = [(ranks, k) for ranks in (2, 3) for k in STALENESS]
ONE_WORKER_STEPS = 10


def _constant_cases(ranks: int) -> list[dict]:
    # P = N + 1 partitions: one rank owns two
    return [dict(name="constant", steps=STEPS, max_staleness=k, partitions=ranks + 1, snapshot_at=SNAPSHOT_AT,
                 slow_rank=SLOW_RANK, slow_s=SLOW_S) for k in STALENESS]


@pytest.fixture(scope="module")
def launches() -> dict:
    """ranks -> per case, the records of every rank (in rank order)."""
    from parallax_nb.launch import run_on_ranks

    out = {}
    # peer_abort before dead_peer: dead_peer frees communicators with messages left unreceived
    extra = [dict(name="one_worker", steps=ONE_WORKER_STEPS, partitions=2), dict(name="many_at_once", partitions=3),
             dict(name="peer_abort", steps_before=3), dict(name="dead_peer", timeout_s=1.0)]
    for ranks, more in ((2, extra), (3, [])):
        start = time.perf_counter()
        per_rank = run_on_ranks(cases.run_cases, ranks, args=(_constant_cases(ranks) + more,), timeout_s=300)
        print(f"\n{ranks}-rank launch: {time.perf_counter() - start:.1f} s")
        out[ranks] = [list(case) for case in zip(*per_rank)]
    return out


def _records(launches, ranks: int, k) -> list[dict]:
    return launches[ranks][STALENESS.index(k)]


def _pushed(records: list[dict], steps_of) -> np.ndarray:
    """Sum, per row, of the gradients of the pushes of ``steps_of(rank)`` of every rank (float64)."""
    total = np.zeros((cases.ROWS, cases.DIM))
    for record in records:
        for step in steps_of(record["rank"]):
            ids, grads = record["pushes"][step]
            np.add.at(total, ids, grads.astype(np.float64))
    return total


def _assembled(records: list[dict], key: str, ranks: int) -> np.ndarray:
    parts = {p: part for record in records for p, part in record[key].items()}
    return RowPartitioning(cases.ROWS, ranks + 1, ranks).assemble(parts)


@pytest.mark.parametrize("ranks,k", RUNS)
def test_every_push_is_applied_exactly_once(launches, ranks, k):
    records = _records(launches, ranks, k)
    assert [len(r["pushes"]) for r in records] == [STEPS] * ranks
    expected = cases.initial_table() - cases.LEARNING_RATE * _pushed(records, lambda rank: range(STEPS))
    final = _assembled(records, "final", ranks)
    assert final.dtype == np.float32
    assert not np.array_equal(final, cases.initial_table())
    np.testing.assert_array_equal(final, expected.astype(np.float32))


@pytest.mark.parametrize("ranks,k", RUNS)
def test_snapshot_holds_exactly_the_steps_before_it(launches, ranks, k):
    records = _records(launches, ranks, k)
    expected = cases.initial_table() - cases.LEARNING_RATE * _pushed(records, lambda rank: range(SNAPSHOT_AT))
    np.testing.assert_array_equal(_assembled(records, "snapshot", ranks), expected.astype(np.float32))


@pytest.mark.parametrize("ranks,k", RUNS)
def test_pulls_see_what_ssp_promises(launches, ranks, k):
    records = _records(launches, ranks, k)
    initial, lr = cases.initial_table().astype(np.float64), cases.LEARNING_RATE
    for record in records:
        w = record["rank"]
        for t, (ids, rows) in enumerate(record["pulls"]):
            at_least = _pushed(records, lambda r: range(t) if r == w else range(0 if k is None else max(0, t - k)))
            at_most = _pushed(records, lambda r: range(t) if r == w else range(STEPS if k is None else min(STEPS, t + k + 1)))
            pulled = rows.astype(np.float64)
            assert np.all(pulled <= (initial - lr * at_least)[ids]), (w, t)
            assert np.all(pulled >= (initial - lr * at_most)[ids]), (w, t)


def _largest_lead(records: list[dict]) -> int:
    """Over every worker w and step t: t minus the fewest steps another worker had ended
    (by the timestamps it took before announcing them) when w began step t."""
    lead = 0
    for record in records:
        for t, began in enumerate(record["began"]):
            ended = [sum(1 for e in other["ended"] if e <= began) for other in records if other is not record]
            lead = max(lead, t - min(ended))
    return lead


@pytest.mark.parametrize("ranks,k", [(r, k) for r, k in RUNS if k is not None])
def test_no_worker_is_more_than_k_steps_ahead_of_the_slowest(launches, ranks, k):
    records = _records(launches, ranks, k)
    assert _largest_lead(records) <= k
    assert max(max(r["steps_ahead"]) for r in records) <= k


@pytest.mark.parametrize("ranks", (2, 3))
def test_without_a_bound_the_fast_workers_run_ahead(launches, ranks):
    """The slow rank is slow enough that the bound above is tested: unbounded, others lead by > 1."""
    records = _records(launches, ranks, None)
    assert _largest_lead(records) > 1
    assert max(max(r["steps_ahead"]) for r in records) > 1


@pytest.mark.parametrize("ranks,k", RUNS)
def test_close_leaves_no_thread_running(launches, ranks, k):
    for record in _records(launches, ranks, k):
        assert not record["server_alive"]
        assert record["threads_after"] == record["threads_before"]
        assert record["close_s"] < 10.0


def test_one_worker_async_equals_sync_to_the_bit(launches):
    for record in launches[2][len(STALENESS)]:
        async_table = RowPartitioning(len(record["initial"]), record["partitions"], 1).assemble(record["async_parts"])
        assert not np.array_equal(record["sync"], record["initial"])
        np.testing.assert_array_equal(async_table.view(np.uint32), record["sync"].view(np.uint32))


def test_a_dead_peer_is_named_instead_of_waited_for_forever(launches):
    rank0, rank1 = launches[2][len(STALENESS) + 3]
    assert "for rank(s) [1]" in rank0["ssp_error"] and "start step 1" in rank0["ssp_error"]
    assert "from rank 1" in rank0["pull_error"]
    assert "gave up earlier" in rank0["after_error"] and rank0["after_error_s"] < 0.5
    assert 0.9 < rank0["ssp_waited_s"] < 5.0 and 0.9 < rank0["pull_waited_s"] < 5.0
    assert rank1 == {}


def test_a_worker_that_aborts_ends_the_others_naming_it_at_once(launches):
    """Rank 1 aborts (its step raised): rank 0, which never waits for rank 1 by SSP, raises at
    its next pull or acknowledgement from rank 1, well before its 30 s deadline; neither rank
    has a serving thread left."""
    import socket

    other, aborted = launches[2][len(STALENESS) + 2]
    assert aborted["error"] is None and aborted["steps"] == 3
    assert other["error"] == (f"rank 0 stopped: rank 1 on host {socket.gethostname()} failed during asynchronous "
                              "training: ValueError: the step raised"), other
    # how many steps rank 0 made before the abort reached it depends on how the ranks' starts
    # interleaved (3 and more here, 2 in a fresh-clone CI run): not checked
    assert abs(other["at"] - aborted["at"]) < 2.0, other["at"] - aborted["at"]
    assert not aborted["server_alive"] and not other["server_alive"]


def test_several_variables_pulled_and_pushed_together_as_one_request_per_owner(launches):
    """pull_many / push_many on 2 ranks, 3 partitions per table: the rows as they are, a push
    refused in its second part changes nothing, and every push applied once; the same for a
    whole variable (ids None)."""
    a, b = cases.initial_table(), cases.second_table()
    for record in launches[2][len(STALENESS) + 1]:
        # the other worker may have pushed its step 0 already (no barrier at the start): each
        # row of "a" as it was, or less its one push; the rows of "b" read are never pushed
        pulled = record["pulled_a"]
        assert all(np.array_equal(row, a[i]) or np.array_equal(row, a[i] - cases.LEARNING_RATE)
                   for i, row in enumerate(pulled)), pulled - a
        np.testing.assert_array_equal(record["pulled_b"], b[::-1][:7].reshape(7, 1, 2))
        assert f"row ids of 'b' must be in [0, {cases.ROWS})" in record["refused"]
        np.testing.assert_array_equal(record["after_a"], a - cases.LEARNING_RATE * 2)   # both ranks' ones
        pushed_b = np.zeros_like(b)
        pushed_b[0], pushed_b[5] = 2 * 2, 2 * 1
        np.testing.assert_array_equal(record["after_b"], b - cases.LEARNING_RATE * pushed_b)
        # the other worker may have made its whole push of twos already (same step): each row of
        # "a" as after the step, or less that one push
        before = record["whole_before"]
        assert all(np.array_equal(row, record["after_a"][i]) or
                   np.array_equal(row, record["after_a"][i] - cases.LEARNING_RATE * 2)
                   for i, row in enumerate(before)), before - record["after_a"]
        assert f"the gradient of 'a' has shape ({cases.ROWS + 1}, {cases.DIM}), the variable ({cases.ROWS}, " \
               f"{cases.DIM})" in record["whole_refused"]
        # 'a' after_a, less both ranks' whole push of twos
        np.testing.assert_array_equal(record["whole_after"], a - cases.LEARNING_RATE * (2 + 2 * 2))


@pytest.mark.parametrize("bad", (-1, 1.5, True, "2"))
def test_a_bad_max_staleness_is_refused_before_mpi_starts(bad):
    with pytest.raises(ConfigError, match="max_staleness"):
        AsyncPS([], SGD(0.1), max_staleness=bad)


def test_duplicate_ids_of_a_push_are_summed_once():
    ids, grads = sum_duplicates(np.array([5, 2, 5, 7, 2, 5]), np.arange(6, dtype=np.float32)[:, None] * [1, 10])
    np.testing.assert_array_equal(ids, [2, 5, 7])
    np.testing.assert_array_equal(grads, [[1 + 4, 10 + 40], [0 + 2 + 5, 0 + 20 + 50], [3, 30]])


def test_a_sharded_variable_is_served_as_it_is_partitioned():
    """The trainer's PS shards (rank 1 of 2, P = 3: partition 1) become a served table as they are."""
    from parallax_nb.runtime.sharded import ShardedVariable

    full = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
    part = RowPartitioning(7, 3, 2)
    shard = ShardedVariable("emb/embeddings", full.shape, "float32", part, 1, {1: part.split(full, 1)})
    table = ServedTable.from_shard(shard)
    assert (table.name, table.partitioning, table.row_shape, table.dtype) == ("emb/embeddings", part, (2,), np.float32)
    assert list(table.parts) == [1]
    np.testing.assert_array_equal(table.parts[1], full[[1, 4]])
