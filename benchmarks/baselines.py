"""Plain Horovod, as a user writes it: the baselines parallax_nb is measured against.

The training loop is the one from Horovod's TensorFlow 2 examples: the single-device model,
``hvd.DistributedGradientTape`` around the tape, the optimizer applied to the averaged
gradients, variables broadcast from rank 0 before the first step, and each rank reading its
own shard of the data (the same shards as parallax_nb's runtime). Nothing is tuned:

* ``sparse_as_dense=False`` (Horovod's default): a ``tf.IndexedSlices`` gradient (an
  embedding's, a sampled softmax's) is "allreduced" as an allgather of its values and its
  indices. Keras' gather gradients carry **one row per lookup**, duplicates included, so a
  batch of B x T tokens ships B x T rows of the embedding whatever the number of distinct ids.
* ``sparse_as_dense=True``: every sparse gradient is densified to the full table and
  allreduced like a dense tensor.

Byte accounting (per rank per step, the same conventions as
:mod:`parallax_nb.runtime.accounting`): a ring allreduce of ``s`` bytes sends and receives
``2 (N-1)/N s`` each; an allgather of ``t`` bytes in total, own block ``o = t/N`` (every
rank contributes the same number of rows here: the batch shapes are fixed), sends
``(N-1) o`` and receives ``t - o``. Values and indices are counted with their own dtypes.
"""
from __future__ import annotations

import time
from typing import Callable

from parallax_nb.runtime.result import StepRecord


def _gradient_bytes(grad, ranks: int):
    """(sent, received) bytes of one variable's averaged gradient, as this rank exchanged it."""
    import tensorflow as tf

    if isinstance(grad, tf.IndexedSlices):
        total = (tf.cast(tf.size(grad.values), tf.float64) * grad.values.dtype.size
                 + tf.cast(tf.size(grad.indices), tf.float64) * grad.indices.dtype.size)
        own = total / ranks
        return own * (ranks - 1), total - own
    size = tf.cast(tf.size(grad), tf.float64) * grad.dtype.size
    moved = 2.0 * (ranks - 1) / ranks * size
    return moved, moved


def horovod_train(job, steps: int, sparse_as_dense: bool = False,
                  on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
    """Train ``job`` for ``steps`` steps with plain Horovod on this MPI rank; one record per step
    (parallax_nb's own :class:`StepRecord`, so both feed the same probes)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from parallax_nb.ops import variable_path

    hvd.init()
    rank, ranks = hvd.rank(), hvd.size()
    model = job.build_model()
    optimizer = job.make_optimizer()
    variables = model.trainable_variables
    optimizer.build(variables)
    # Keras 3 variables wrap a tf.Variable (``.value``); Horovod's tape and broadcast need those.
    sources = [v.value for v in variables]
    names = [variable_path(v) for v in variables]
    hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables], root_rank=0)
    batches = iter(job.dataset(rank, ranks))

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = job.loss_value(model, x, y)
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        grads = tape.gradient(loss, sources)
        optimizer.apply_gradients(zip(grads, variables))
        moved = tf.stack([tf.stack(_gradient_bytes(g, ranks)) for g in grads])
        return loss, moved

    history = []
    for step in range(steps):
        x, y = next(batches)
        start = time.perf_counter()
        loss, moved = train_step(x, y)
        loss = float(loss)  # waits for the step
        elapsed = time.perf_counter() - start
        moved = moved.numpy()
        record = StepRecord(step=step, loss=loss, examples_per_s=ranks * job.batch_size / elapsed,
                              step_time_s=elapsed, bytes_sent=float(moved[:, 0].sum()),
                              bytes_received=float(moved[:, 1].sum()),
                              bytes_by_variable={n: (float(s), float(r)) for n, (s, r) in zip(names, moved)})
        history.append(record)
        if on_step is not None:
            on_step(record)
    return history
