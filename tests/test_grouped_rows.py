"""Several sparse AR variables in one call (:mod:`parallax_nb.runtime.grouped_rows`: AR's
allgather without local aggregation, and local aggregation's gather on one machine): they
travel as one table whose rows carry their int64 ids, and come back as each variable's rows,
bit for bit."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_rows_carry_their_ids_bit_for_bit(dtype):
    import tensorflow as tf

    from parallax_nb.runtime.grouped_rows import with_ids, without_ids

    values = tf.constant([[1.5, np.nan], [-0.0, np.inf], [3.0, -2.0]], dtype)
    ids = tf.constant([5, 2 ** 40, -1], tf.int64)
    packed = with_ids(values, ids)
    assert packed.dtype == values.dtype and packed.shape == (3, 2 + 8 // values.dtype.size)
    back, back_ids = without_ids(packed, values)
    assert np.array_equal(tf.bitcast(back, tf.uint8).numpy(), tf.bitcast(values, tf.uint8).numpy())
    assert back_ids.numpy().tolist() == [5, 2 ** 40, -1]
    empty, empty_ids = without_ids(with_ids(values[:0], ids[:0]), values)
    assert empty.shape == (0, 2) and empty_ids.shape == (0,)


def test_one_table_splits_back_into_each_variables_rows():
    """Variable k's row i is the table's row offset_k + i; each variable gets its rows back with
    its own ids and its own dense shape."""
    import tensorflow as tf

    from parallax_nb.runtime.grouped_rows import by_variable

    offsets = tf.constant([0, 10, 15, 25], tf.int64)
    ids = tf.constant([3, 12, 20, 11, 0], tf.int64)
    grads = [tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0], tf.int64), tf.constant([n, 2], tf.int64))
             for n in (10, 5, 10)]
    out = by_variable(tf.reshape(tf.range(10.0), [5, 2]), ids, offsets, grads)
    assert [o.indices.numpy().tolist() for o in out] == [[3, 0], [2, 1], [5]]
    assert [o.values.numpy().tolist() for o in out] == [[[0.0, 1.0], [8.0, 9.0]], [[2.0, 3.0], [6.0, 7.0]],
                                                        [[4.0, 5.0]]]
    assert [int(o.dense_shape[0]) for o in out] == [10, 5, 10]
