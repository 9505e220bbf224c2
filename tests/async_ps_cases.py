"""What the ranks run for tests/test_async_ps.py: asynchronous PS training cases, each returning
plain numpy values (every push and pull made, timestamps, snapshots, final partitions) that the
test checks in its own process against numpy."""
from __future__ import annotations

import threading
import time

import numpy as np

ROWS, DIM, BATCH = 40, 3, 12
LEARNING_RATE = 0.125   # a power of 2: every value below stays an exact float32 (multiples of 1/8)


def initial_table() -> np.ndarray:
    return np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)


def per_example_gradient(rank: int) -> float:
    """The loss of rank r is (r + 1) * (sum of the looked-up rows' entries): every example's
    gradient of its row is r + 1 in every entry, whatever the row holds."""
    return float(rank + 1)


def constant_gradient_training(steps: int, max_staleness, partitions: int, snapshot_at: int, slow_rank: int,
                               slow_s: float) -> dict:
    """Async SGD on one table whose per-example gradient is a known constant; ``slow_rank``
    sleeps ``slow_s`` per step. Records every pull and push, when each step began (its pull
    returned, after any SSP wait) and when it ended (before ``end_step`` announces it), a snapshot after
    ``snapshot_at`` steps, the final partitions, and the threads before and after."""
    from parallax_nb.runtime.async_ps import AsyncPS
    from parallax_nb.runtime.owner_optimizers import SGD

    threads_before = sorted(t.name for t in threading.enumerate())
    ps = AsyncPS.from_arrays({"table": initial_table()}, partitions, SGD(LEARNING_RATE), max_staleness=max_staleness,
                             timeout_s=60)
    rank = ps.rank
    rng = np.random.default_rng(1000 + rank)
    record = dict(rank=rank, pulls=[], pushes=[], began=[], ended=[], snapshot=None)
    for step in range(steps):
        ids = rng.integers(0, ROWS, BATCH)          # duplicates within a batch and across ranks
        rows = ps.pull("table", ids)                # after its SSP wait, if any
        record["began"].append(time.monotonic())
        grads = np.full((BATCH, DIM), per_example_gradient(rank), np.float32)
        ps.push("table", ids, grads)
        record["pulls"].append((ids, rows))
        record["pushes"].append((ids, grads))
        if rank == slow_rank:
            time.sleep(slow_s)
        record["ended"].append(time.monotonic())
        ps.end_step()
        if step + 1 == snapshot_at:
            record["snapshot"] = ps.snapshot()["table"]
    start = time.monotonic()
    record["final"] = ps.close()["table"]
    record["close_s"] = time.monotonic() - start
    record["steps_ahead"] = list(ps.steps_ahead)
    record["server_alive"] = ps._thread.is_alive()
    record["threads_before"] = threads_before
    record["threads_after"] = sorted(t.name for t in threading.enumerate())
    return record


def one_worker_against_sync(steps: int, partitions: int) -> dict:
    """One worker (this rank alone, on MPI_COMM_SELF) trains a small embedding regression with
    async PS, and the same steps run synchronously on one ``tf.Variable`` with Keras' SGD, the
    row gradients deduplicated as the synchronous PS does. Returns both final tables."""
    import keras
    import tensorflow as tf

    from parallax_nb.runtime.async_ps import AsyncPS, mpi
    from parallax_nb.runtime.owner_optimizers import SGD
    from parallax_nb.runtime.tensor_ops import deduplicate

    rng = np.random.default_rng(7)
    rows, dim, lr = 30, 4, 0.05
    initial = rng.normal(size=(rows, dim)).astype(np.float32)
    readout = tf.constant(rng.normal(size=(dim, 1)).astype(np.float32))
    batches = [(rng.integers(0, rows, 16), rng.normal(size=(16, 1)).astype(np.float32)) for _ in range(steps)]

    def loss_of(looked_up, y):
        return tf.reduce_mean(tf.square(tf.matmul(looked_up, readout) - y))

    table = tf.Variable(initial)
    optimizer = keras.optimizers.SGD(lr)
    for ids, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_of(tf.gather(table, ids), y)
        optimizer.apply([deduplicate(tape.gradient(loss, table))], [table])

    ps = AsyncPS.from_arrays({"table": initial}, partitions, SGD(lr), max_staleness=0, comm=mpi().COMM_SELF, timeout_s=30)
    for ids, y in batches:
        unique, position = np.unique(ids, return_inverse=True)
        pulled = tf.constant(ps.pull("table", unique))
        with tf.GradientTape() as tape:
            tape.watch(pulled)
            loss = loss_of(tf.gather(pulled, position), y)
        grad = deduplicate(tape.gradient(loss, pulled))
        ps.push("table", unique[grad.indices.numpy()], grad.values.numpy())
        ps.end_step()
    parts = ps.close()["table"]
    return dict(initial=initial, sync=table.numpy(), async_parts=parts, partitions=partitions)


def many_at_once(partitions: int) -> dict:
    """Two tables pulled and pushed together (``pull_many``, ``push_many``: one message per
    owner for both), lock-step (``max_staleness`` 0, so the pull after the step sees every
    worker's push). First a push whose second part is refused (a row id past the table): it
    must change nothing, its valid first part included. Then "a" whole (ids None): pulled, a
    push of the wrong shape refused, a whole push applied once per worker."""
    from parallax_nb.errors import ConfigError
    from parallax_nb.runtime.async_ps import AsyncPS
    from parallax_nb.runtime.owner_optimizers import SGD

    ids = np.arange(ROWS)
    ps = AsyncPS.from_arrays({"a": initial_table(), "b": second_table()}, partitions, SGD(LEARNING_RATE),
                             max_staleness=0, timeout_s=60)
    out = {"rank": ps.rank}
    both = ps.pull_many({"a": ids, "b": ids[::-1][:7].reshape(7, 1)})
    out["pulled_a"], out["pulled_b"] = both["a"], both["b"]
    try:
        ps.push_many([("a", [0, 1], np.ones((2, DIM), np.float32)), ("b", [ROWS + 3], np.ones((1, 2), np.float32))])
    except ConfigError as e:
        out["refused"] = str(e)
    ps.push_many([("a", ids, np.ones((ROWS, DIM), np.float32)), ("b", [0, 0, 5], np.ones((3, 2), np.float32))])
    ps.end_step()
    after = ps.pull_many({"a": ids, "b": ids})
    out["after_a"], out["after_b"] = after["a"], after["b"]
    # whole variables: pulled and pushed as their partitions, without row ids
    out["whole_before"] = ps.pull_many({"a": None, "b": ids})["a"]
    try:
        ps.push_many([("b", ids, np.ones((ROWS, 2), np.float32)), ("a", None, np.ones((ROWS + 1, DIM), np.float32))])
    except ConfigError as e:
        out["whole_refused"] = str(e)
    ps.push_many([("a", None, np.full((ROWS, DIM), 2.0, np.float32))])
    ps.end_step()
    out["whole_after"] = ps.pull_many({"a": None})["a"]
    ps.close()
    return out


def second_table() -> np.ndarray:
    return 100 + np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2)


def dead_peer_waits(timeout_s: float) -> dict:
    """Two ranks. (1) SSP: rank 1 does no step for a while, rank 0 (max_staleness 0) cannot start
    its second step: its wait must end in an error naming rank 1. (2) Rank 1's serving thread
    stops (a dead server): rank 0's pull of a row rank 1 owns must end in an error naming rank 1."""
    from parallax_nb.errors import DistributedError
    from parallax_nb.runtime.async_ps import AsyncPS, mpi
    from parallax_nb.runtime.owner_optimizers import SGD

    world = mpi().COMM_WORLD
    rank = world.Get_rank()
    out = {}
    ps = AsyncPS.from_arrays({"table": initial_table()}, 2, SGD(LEARNING_RATE), max_staleness=0, timeout_s=timeout_s)
    if rank == 0:
        ps.pull("table", [0, 1])
        ps.push("table", [0, 1], np.ones((2, DIM), np.float32))
        ps.end_step()
        start = time.monotonic()
        try:
            ps.pull("table", [0, 1])
        except DistributedError as e:
            out["ssp_error"], out["ssp_waited_s"] = str(e), time.monotonic() - start
    else:
        time.sleep(2 * timeout_s + 1.0)
    ps.timeout_s = 30.0   # the end waits for the other rank's (slow on purpose) end
    ps.close()

    ps = AsyncPS.from_arrays({"table": initial_table()}, 2, SGD(LEARNING_RATE), max_staleness=None, timeout_s=timeout_s)
    if rank == 1:
        ps._stop.set()          # this rank's server dies; its worker is still there
        ps._thread.join()
    world.Barrier()
    if rank == 0:
        start = time.monotonic()
        try:
            ps.pull("table", [1])   # partition 1, owned by rank 1
        except DistributedError as e:
            out["pull_error"], out["pull_waited_s"] = str(e), time.monotonic() - start
        start = time.monotonic()
        try:
            ps.pull("table", [0])   # its own row: still refused, the instance gave up
        except DistributedError as e:
            out["after_error"], out["after_error_s"] = str(e), time.monotonic() - start
    ps.timeout_s = 30.0
    ps.close()
    return out


def peer_abort(steps_before: int) -> dict:
    """Two ranks, unbounded staleness. Rank 1 does ``steps_before`` steps, then aborts as a
    worker whose step raised does; rank 0 keeps stepping (pulling rows both ranks own) until
    an error ends it. Each records the wall time of its abort or error, the error's text,
    the steps it did and whether its serving thread is still alive."""
    from parallax_nb.errors import DistributedError
    from parallax_nb.runtime.async_ps import AsyncPS
    from parallax_nb.runtime.owner_optimizers import SGD

    ps = AsyncPS.from_arrays({"table": initial_table()}, 2, SGD(LEARNING_RATE), max_staleness=None, timeout_s=30)
    out = dict(rank=ps.rank, error=None, at=None, steps=0)
    ids = np.arange(ROWS)
    try:
        while ps.rank == 0 or out["steps"] < steps_before:
            ps.pull("table", ids)
            ps.push("table", ids, np.ones((ROWS, DIM), np.float32))
            ps.end_step()
            out["steps"] += 1
        out["at"] = time.time()
        ps.abort(ValueError("the step raised"))
    except DistributedError as e:
        out.update(error=e.message, at=time.time())
        ps.abort(e)
    out["server_alive"] = ps._thread.is_alive()
    return out


def run_cases(cases: list[dict]) -> list:
    """Run each ``{"name": ..., **kwargs}`` case on this rank, in order."""
    functions = dict(constant=constant_gradient_training, one_worker=one_worker_against_sync,
                     dead_peer=dead_peer_waits, peer_abort=peer_abort, many_at_once=many_at_once)
    from parallax_nb.runtime.async_ps import mpi

    results = []
    for case in cases:
        case = dict(case)
        results.append(functions[case.pop("name")](**case))
    mpi().COMM_WORLD.Barrier()   # no rank shuts Horovod (and MPI) down under another's feet
    return results
