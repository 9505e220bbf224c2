"""The byte buffer that carries several sparse variables' rows in one local-aggregation call
(:func:`parallax_nb.runtime.hierarchical.pack_slices`): every variable's values and int64
indices come back bit for bit, whatever their row shapes and counts (empty ones included)."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_packed_slices_come_back_bit_for_bit(dtype):
    import tensorflow as tf

    from parallax_nb.runtime.hierarchical import pack_slices, unpack_slices

    rng = np.random.default_rng(0)
    parts = [(tf.constant(rng.normal(size=(3, 4)), dtype), tf.constant([5, 1, 9], tf.int64)),
             (tf.zeros([0, 2, 3], dtype), tf.zeros([0], tf.int64)),
             (tf.constant([[np.nan], [-0.0]], dtype), tf.constant([2 ** 40, 7], tf.int64))]
    packed = pack_slices(parts)
    itemsize = tf.as_dtype(dtype).size
    assert packed.dtype == tf.uint8 and int(tf.size(packed)) == 4 * 3 + (3 * 4 + 0 + 2) * itemsize + 5 * 8
    back = unpack_slices(packed, tf.as_dtype(dtype), [v.shape[1:] for v, _ in parts])
    for (values, indices), (v, i) in zip(parts, back):
        assert v.shape == values.shape and v.dtype == values.dtype
        assert np.array_equal(tf.bitcast(v, tf.uint8).numpy(), tf.bitcast(values, tf.uint8).numpy())
        assert i.numpy().tolist() == indices.numpy().tolist()
