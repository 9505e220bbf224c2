"""The cost side of asynchronous PS (issue 16): the method-table entries and the throughput
of sync against async for a straggler profile. Figures worked by hand in the comments."""
from __future__ import annotations

import re

import pytest

from parallax_nb.cost.asynchronous import examples_per_s
from parallax_nb.cost.methods import METHOD_COSTS
from parallax_nb.errors import ConfigError
from parallax_nb.types import ASYNC_PS, ClusterSpec, Kind
from test_cost import dense_var, sparse_var


def test_async_sparse_is_ps_bytes_per_worker_with_ids_twice_and_no_collective():
    """2 machines x 2 workers, local aggregation asked for (async ignores it: W = 4 workers,
    2 per machine, share of a worker's peers on the other machine r = 2/3, so a machine's link
    carries 2 x 2/3 = 4/3 of one worker's volume). R = 100,000, m = 25,600,000 B, a1 = 0.01:
    values 4 x 0.01 x 25.6e6 x 3/4 = 768,000 B per worker -> 1,024,000 per machine; ids of one
    pull 2 x 8 x 1,000 x 3/4 = 12,000 -> 16,000, sent with the pull and the push: 32,000."""
    cluster = ClusterSpec(machines=2, workers_per_machine=2, local_aggregation=True)
    cost = METHOD_COSTS[(ASYNC_PS, Kind.SPARSE)](sparse_var(), cluster)
    assert cost.bytes_per_step == pytest.approx(1_056_000)
    assert cost.index_bytes_per_step == pytest.approx(32_000)
    assert cost.collectives == ()
    assert cost.messages_per_step == 4


def test_async_dense_pulls_and_pushes_the_whole_variable_without_row_ids():
    """4 machines x 1: W = 4, r = 1. 64 x 64 float32: m = 16,384 B. Values
    4 x 16,384 x 3/4 = 49,152; the partitions go whole, no row ids."""
    cluster = ClusterSpec(machines=4, workers_per_machine=1)
    cost = METHOD_COSTS[(ASYNC_PS, Kind.DENSE)](dense_var(), cluster)
    assert cost.bytes_per_step == pytest.approx(49_152)
    assert cost.index_bytes_per_step == 0
    assert cost.collectives == ()


def test_async_on_one_machine_crosses_no_link():
    cluster = ClusterSpec(machines=1, workers_per_machine=4)
    for kind, var in ((Kind.SPARSE, sparse_var()), (Kind.DENSE, dense_var())):
        cost = METHOD_COSTS[(ASYNC_PS, kind)](var, cluster)
        assert (cost.bytes_per_step, cost.messages_per_step) == (0.0, 0)


STRAGGLER = [0.1, 0.1, 0.1, 0.2]   # rank 3 twice as slow; no communication; 10 examples a step


def test_sync_goes_at_the_stragglers_pace():
    assert examples_per_s(STRAGGLER, 0.0, 10, sync=True) == pytest.approx(4 * 10 / 0.2)      # 200


def test_unbounded_async_lets_every_worker_go_at_its_own_pace():
    assert examples_per_s(STRAGGLER, 0.0, 10, sync=False) == pytest.approx(3 * 10 / 0.1 + 10 / 0.2)   # 350


def test_ssp_lets_the_fast_workers_run_k_steps_ahead_then_holds_them():
    """The slowest does 10 steps in 2.0 s; the others could do 20 but stop at 10 + 2:
    (3 x 12 + 10) x 10 examples / 2.0 s = 230. In the long run, the straggler's pace (200)."""
    assert examples_per_s(STRAGGLER, 0.0, 10, sync=False, max_staleness=2, slowest_steps=10) == pytest.approx(230)
    assert examples_per_s(STRAGGLER, 0.0, 10, sync=False, max_staleness=2) == pytest.approx(200)


def test_exchange_time_adds_to_every_step():
    assert examples_per_s([0.1, 0.3], 0.1, 8, sync=True) == pytest.approx(2 * 8 / 0.4)
    assert examples_per_s([0.1, 0.3], 0.1, 8, sync=False) == pytest.approx(8 / 0.2 + 8 / 0.4)


@pytest.mark.parametrize("compute, exchange", [([], 0.0), ([0.1, -1.0], 0.0), ([0.1], float("nan")), ([0.0], 0.0)])
def test_bad_times_are_refused(compute, exchange):
    with pytest.raises(ConfigError):
        examples_per_s(compute, exchange, 10, sync=False)


def _estimate(compute_s: float, comm_s: float, workers: int = 4, batch: int = 10):
    """An Estimate with only what the outlook reads: cluster, compute, communication, rate."""
    from parallax_nb.types import Estimate

    step = compute_s + comm_s
    base = Estimate(architecture="ps", cluster=ClusterSpec(machines=1, workers_per_machine=workers),
                    bytes_per_machine_per_step=0.0, index_bytes_per_machine_per_step=0.0,
                    method_bytes_per_machine_per_step={}, sparse_bytes_per_machine_per_step=0.0,
                    dense_bytes_per_machine_per_step=0.0, messages_per_step=0, compute_time_s=compute_s,
                    transfer_time_s=comm_s, latency_time_s=0.0, comm_time_s=comm_s, step_time_s=step,
                    examples_per_s=workers * batch / step)
    return base


def test_the_straggler_outlook_slows_one_workers_whole_step():
    """Compute 0.08 s + exchange 0.02 s = 0.1 s a step; worker 0 takes 2 x 0.1 = 0.2 s (as
    bench_async slows its rank 1). Sync: 4 x 10 / 0.2 = 200; async: 3 x 10 / 0.1 + 10 / 0.2
    = 350; bounded, the long run: the straggler's pace, 200."""
    from parallax_nb.cost.asynchronous import straggler_outlook

    outlook = straggler_outlook(_estimate(0.08, 0.02), slowdown=2.0, slow_workers=1, max_staleness=2)
    assert outlook.sync_examples_per_s == pytest.approx(200)
    assert outlook.async_examples_per_s == pytest.approx(350)
    assert outlook.bounded_examples_per_s == pytest.approx(200)
    text = "\n".join(outlook.lines())
    assert "1 worker of 4 2x slower per step" in text and "1.75x sync" in text and "max staleness 2" in text
    assert straggler_outlook(_estimate(0.08, 0.02)).bounded_examples_per_s is None   # unbounded: no line
    # no straggler: async and sync alike (the same exchange priced)
    same = straggler_outlook(_estimate(0.08, 0.02), slowdown=1.0)
    assert same.async_examples_per_s == pytest.approx(same.sync_examples_per_s) == pytest.approx(400)


@pytest.mark.parametrize("kwargs, message", [
    (dict(slowdown=0.5), "slowdown must be a finite number >= 1"),
    (dict(slowdown=float("nan")), "slowdown must be a finite number >= 1"),
    (dict(slow_workers=5), "slow_workers must be a whole number from 0 to the plan's 4 workers, got 5"),
    (dict(max_staleness=-1), "max_staleness must be None (unbounded) or a whole number >= 0, got -1"),
])
def test_a_bad_straggler_profile_is_refused_naming_it(kwargs, message):
    from parallax_nb.cost.asynchronous import straggler_outlook

    with pytest.raises(ConfigError, match=re.escape(message)):
        straggler_outlook(_estimate(0.08, 0.02), **kwargs)
