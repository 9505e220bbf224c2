"""Guards against silently wrong training: non-finite numbers, ids outside a table, labels that
broadcast against the model's output.

* **Numbers.** Every rank folds two flags into a collective its step already issues (the
  dense allreduce, or the loss allreduce): ``health`` is a vector of 2 N floats, entry r = 1
  when rank r's loss is not finite, entry N + r = 1 when one of rank r's gradients is not.
  Averaged over the ranks, entry r is 1/N (> 0) exactly when rank r saw it, so every rank
  learns in the same step which ranks went wrong and all raise the same
  :class:`NumericError` together (no rank is left waiting in a collective). A rank checks
  the gradients its own batch made: for PS sparse variables, the row gradients it sends to
  their owners. The cost is one ``reduce_all(is_finite)`` per gradient and 2 N floats more in
  a collective.
* **Ids.** :func:`checked_ids` asserts ``0 <= id < rows`` inside the lookup, on the global
  ids before any partitioning: one ``reduce_min`` and one ``reduce_max`` per lookup (once for
  tables of one row count looked up at one ids tensor, as the sampled softmax's). The
  failed assertion carries the variable, the offending id and the rows; :func:`id_error`
  turns TensorFlow's error into a :class:`JobError` in the user's terms.
* **Labels.** :func:`label_problem` applies the loss's broadcasting rules once, on the first
  batch: Keras squeezes a trailing 1 when the ranks differ by one; after that, an axis where
  one side is 1 and the other is not broadcasts (integer class ids of shape (b, 1) against
  logits (b, C) are the one legitimate case). A loss value with more elements than both the
  labels and the output is a broadcast too (a plain function of (8,) labels and (8, 1)
  outputs gives (8, 8)).
"""
from __future__ import annotations

import math
import re

import numpy as np
import tensorflow as tf

from .. import ops
from ..errors import JobError, NumericError

_BAD_ID_TAG = "parallax_nb-id-out-of-range"
_BAD_ID = re.compile(re.escape(_BAD_ID_TAG) + r"\]\s*\[([^\]]*)\]\s*\[(-?\d+)\]\s*\[(\d+)\]")


# ----------------------------------------------------------------------------- numbers
def local_health(loss, grads, rank: int, ranks: int, finite=()) -> tf.Tensor:
    """This rank's 2 N health flags (module docstring): float32, one-hot at r and N + r.
    ``finite``: boolean scalars of gradients checked already (the PS row gradients this rank
    sent), which count as ``grads`` do."""
    loss_bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(tf.cast(loss, tf.float32))))
    finite = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
              for g in grads if g is not None] + list(finite)
    grad_bad = tf.logical_not(tf.reduce_all(tf.stack(finite))) if finite else tf.constant(False)
    flags = tf.stack([tf.cast(loss_bad, tf.float32), tf.cast(grad_bad, tf.float32)])
    one_hot = tf.one_hot(rank, ranks, dtype=tf.float32)
    return tf.concat([flags[0] * one_hot, flags[1] * one_hot], 0)


def check_health(health: np.ndarray, step: int, ranks: int) -> None:
    """Raise :class:`NumericError` naming the step and the ranks if any flag is set."""
    health = np.asarray(health)
    if not health.any():   # every step of a healthy run: the one test
        return
    health = health.reshape(2, ranks)
    bad_loss = [int(r) for r in np.nonzero(health[0] > 0)[0]]
    bad_grad = [int(r) for r in np.nonzero(health[1] > 0)[0]]
    if not bad_loss and not bad_grad:
        return
    what = []
    if bad_loss:
        what.append(f"the loss is not finite (NaN or inf) on rank(s) {bad_loss}")
    if bad_grad:
        what.append(f"a gradient is not finite on rank(s) {bad_grad}")
    raise NumericError(f"step {step}: {' and '.join(what)}; training stopped, nothing of this step was saved",
                       hint="lower the learning rate, clip gradients, or check the data of that step; "
                            "the last checkpoint written before it is intact")


def check_finite_arrays(arrays: dict, step: int, what: str) -> None:
    """Refuse to write ``arrays`` (name -> array) when one holds NaN or inf."""
    for name, array in arrays.items():
        a = np.asarray(array)
        if a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise NumericError(f"{what} of step {step} not written: {name!r} has {bad} non-finite value(s) "
                               f"of {a.size}", hint="the weights diverged (learning rate too high?); the previous "
                                                    "checkpoint is kept")


# ----------------------------------------------------------------------------- ids
def _rows(params):
    """The rows of a table (None when its shape does not say)."""
    shape = getattr(params, "shape", None)
    return None if shape is None or not len(shape) else shape[0]


def checked_ids(params, ids):
    """``ids`` with an assertion that every id is a row of ``params`` (module docstring)."""
    rows = _rows(params)
    if rows is None:
        return ids
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        return ids
    rows = int(rows)
    flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
    low = tf.reduce_min(tf.concat([flat, tf.zeros([1], tf.int64)], 0))
    high = tf.reduce_max(tf.concat([flat, tf.zeros([1], tf.int64)], 0))
    ok = tf.logical_and(low >= 0, high < rows)
    worst = tf.where(high >= rows, high, low)
    from ..ops import variable_path

    check = tf.debugging.Assert(ok, [tf.constant(_BAD_ID_TAG), tf.constant(variable_path(params) or "a table"),
                                     worst, tf.constant(rows, tf.int64)], summarize=1)
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def id_error(error: Exception, step: int, rank: int) -> JobError | None:
    """The :class:`JobError` for a failed :func:`checked_ids` assertion (None for other errors)."""
    m = _BAD_ID.search(str(error))
    if not m:
        return None
    name, value, rows = m.group(1).strip("'\""), int(m.group(2)), int(m.group(3))
    return JobError(f"embedding id {value} is out of range for {name!r}: valid ids are 0..{rows - 1} ({rows} rows); "
                    f"seen in the batch of step {step} on rank {rank}",
                    hint="ids must be integers in [0, vocabulary size); check the data function or enlarge the table")


# ----------------------------------------------------------------------------- labels
def _shape(t) -> tuple:
    return tuple(int(d) for d in t.shape)


def label_problem(y, y_pred, loss_value) -> str | None:
    """What is wrong with labels ``y`` against outputs ``y_pred`` (module docstring), or None."""
    if isinstance(y, dict) or isinstance(y_pred, dict) or isinstance(y, (list, tuple)) \
            or isinstance(y_pred, (list, tuple)):
        return None
    ys, ps = _shape(y), _shape(y_pred)
    integer = tf.as_dtype(y.dtype).is_integer
    a, b = ys, ps
    if len(a) == len(b) + 1 and a and a[-1] == 1:
        a = a[:-1]
    elif len(b) == len(a) + 1 and b and b[-1] == 1:
        b = b[:-1]
    broadcast = None
    if len(a) == len(b) and a != b:
        for axis, (da, db) in enumerate(zip(a, b)):
            if da != db and 1 in (da, db):
                if integer and axis == len(a) - 1 and da == 1:
                    continue  # integer class ids (b, 1) against logits (b, C)
                broadcast = tuple(max(p, q) for p, q in zip(a, b))
                break
    loss_shape = _shape(loss_value) if loss_value is not None and hasattr(loss_value, "shape") else ()
    if broadcast is None and math.prod(loss_shape) > max(math.prod(ys), math.prod(ps)):
        broadcast = loss_shape
    if broadcast is None:
        return None
    return (f"labels of shape {ys} and model outputs of shape {ps} broadcast to {broadcast} in the loss: "
            f"every label would be compared with every output instead of its own")


class CheckedLookups:
    """A lookup router that checks every lookup's ids (:func:`checked_ids`) before ``router``
    serves it; lookups ``router`` does not serve are a local ``tf.gather`` of the checked ids."""

    def __init__(self, router):
        self.router = router

    def reset(self) -> None:
        self.router.reset()

    def lookup(self, params, ids):
        return self.lookup_many([(params, ids)])[0]

    def lookup_many(self, pairs):
        # pairs at one ids object keep sharing one (checked against each of their tables), so
        # that the router still sees them looked up together
        checked: dict[int, object] = {}
        rows_checked: set[tuple] = set()   # tables of one row count at one ids tensor: checked once
        for params, ids in pairs:
            key = (id(ids), _rows(params))
            if key not in rows_checked:
                rows_checked.add(key)
                checked[id(ids)] = checked_ids(params, checked.get(id(ids), ids))
        pairs = [(params, checked[id(ids)]) for params, ids in pairs]
        return [ops.local_gather(params, ids) if rows is None else rows
                for rows, (params, ids) in zip(ops.routed(self.router, pairs), pairs)]
