"""Tensor helpers shared by the runtime's exchanges; a leaf module (imports only TensorFlow),
so :mod:`.sync`, :mod:`.sharded` and :mod:`.hierarchical` depend on it and not on each other."""
from __future__ import annotations

import tensorflow as tf


def op_tag(name: str) -> str:
    """A variable path as a fragment of a Horovod op name (letters, digits, underscores)."""
    return "".join(c if c.isalnum() else "_" for c in name)


def tile_rows(x: tf.Tensor, copies: int) -> tf.Tensor:
    """``copies`` copies of ``x`` stacked along its first dimension."""
    return tf.tile(x, tf.concat([[copies], tf.ones([tf.rank(x) - 1], tf.int32)], 0))


def deduplicate(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sum the values of repeated indices: one entry per touched row.

    Besides moving fewer bytes, this makes the optimizer see the true gradient: Keras 3
    optimizers on TensorFlow square the *entries* of an ``IndexedSlices`` (Adam's second
    moment gets the sum of squares of a row's per-occurrence gradients, not the square of
    their sum), so without it the update would depend on how the duplicates of a row were
    split across entries and ranks. Deduplicated, every method applies exactly the
    dense-equivalent update (see ``reference.train_single_device``)."""
    unique, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, grad.dense_shape)


_LIVE_ZERO: list = []


def live(x: tf.Tensor) -> tf.Tensor:
    """``x`` plus a variable's 0, for a collective's input that can be a constant on some rank
    (a rank that owns no partition has nothing of its own to send).

    Horovod registers its TensorFlow ops as stateless, so grappler's constant folding runs a
    collective whose inputs are all constants while it optimises the traced step: on that rank
    alone, before the step starts, where it waits forever for ranks that call it later in the
    step (control dependencies do not prevent folding). A variable read cannot be folded, and
    adding its 0 changes no value."""
    if not _LIVE_ZERO:
        with tf.init_scope():
            _LIVE_ZERO.append(tf.Variable(0.0, trainable=False, name="px_live_zero"))
    return x + tf.cast(_LIVE_ZERO[0], x.dtype)


def custom_gradient_names() -> set[str]:
    """The gradient functions ``tf.custom_gradient`` has registered in this process so far."""
    from tensorflow.python.framework import ops as tf_ops

    return {name for name in tf_ops._gradient_registry._registry if name.startswith("CustomGradient-")}


def forget_custom_gradients_since(before: set[str]) -> None:
    """Drop the ``tf.custom_gradient`` registrations made since ``before`` was taken
    (:func:`custom_gradient_names`). Call it once a trace that nothing will differentiate is
    built: each registration keeps its whole traced graph alive for the life of the process
    (tensorflow#27492). Besides the lookups' row exchanges, Keras' optimizer registers one in
    every trace whose gradients are all dense (``ReplicaContext.all_reduce``)."""
    from tensorflow.python.framework import ops as tf_ops

    registry = tf_ops._gradient_registry._registry
    for name in custom_gradient_names() - before:
        registry.pop(name, None)
