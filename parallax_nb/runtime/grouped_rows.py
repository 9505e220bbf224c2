"""Several sparse gradients as the rows of one table, for one collective call.

Every sparse AR variable of one values dtype and row shape travels in one call a step: flat,
one allgather over all ranks (:class:`.exchanges.sparse_allgather.SparseAllgather`); with local
aggregation on one machine, one gather inside the machine
(:meth:`.hierarchical.Hierarchy.gather_sparse_group`). Variable k's row i is the table's row
``offset_k + i`` (:func:`one_table`), and each row carries that int64 id in its own last
elements (:func:`with_ids`), so the call hands one tensor and what arrives needs no parsing:
:func:`without_ids` and :func:`by_variable` take it apart again.
"""
from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from .tensor_ops import deduplicate


class OneTable(NamedTuple):
    """``grads`` as one table: their rows one after another, each row's id in the table
    (``offset_k + i``), the variables' first row ids (``offsets``, one more than variables:
    the last is the table's row count) and the table's dense shape."""

    values: tf.Tensor
    ids: tf.Tensor
    offsets: tf.Tensor
    dense_shape: tf.Tensor


def one_table(grads: list[tf.IndexedSlices]) -> OneTable:
    """``grads`` (one values dtype and row shape, int64 indices) as one table (:class:`OneTable`)."""
    sizes = [tf.cast(g.dense_shape[0], tf.int64) for g in grads]
    offsets = tf.concat([[tf.constant(0, tf.int64)], tf.cumsum(tf.stack(sizes))], 0)
    values = tf.concat([g.values for g in grads], 0)
    ids = tf.concat([g.indices + offsets[k] for k, g in enumerate(grads)], 0)
    shape = tf.concat([offsets[-1:], tf.shape(grads[0].values, out_type=tf.int64)[1:]], 0)
    return OneTable(values, ids, offsets, shape)


def with_ids(values: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows of ``values`` (flattened to ``[rows, elements]``) with each row's int64 id appended
    as the elements of ``values``' dtype that hold its 8 bytes: one tensor for one call."""
    flat = tf.reshape(values, [tf.shape(values)[0], -1])
    bits = tf.reshape(tf.bitcast(ids, values.dtype), [tf.shape(ids)[0], -1])
    return tf.concat([flat, bits], 1)


def without_ids(packed: tf.Tensor, like: tf.Tensor) -> tuple:
    """:func:`with_ids` reversed: (values shaped as ``like``'s rows, int64 ids)."""
    id_elements = tf.int64.size // like.dtype.size
    values = tf.reshape(packed[:, :-id_elements], tf.concat([[-1], tf.shape(like)[1:]], 0))
    bits = packed[:, -id_elements:]
    ids = tf.bitcast(bits if id_elements > 1 else bits[:, 0], tf.int64)
    return values, ids


def owners(ids: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """The variable (int32, its place in the table) each of the table's row ``ids`` belongs to."""
    return tf.cast(tf.searchsorted(offsets[1:], ids, side="right"), tf.int32)


def by_variable(values: tf.Tensor, ids: tf.Tensor, offsets: tf.Tensor, grads: list) -> list[tf.IndexedSlices]:
    """The one table's rows back as each variable's ``IndexedSlices`` (ids less its offset,
    the variable's own dense shape)."""
    owner = owners(ids, offsets)
    parts = tf.dynamic_partition(values, owner, len(grads))
    id_parts = tf.dynamic_partition(ids, owner, len(grads))
    return [tf.IndexedSlices(parts[j], id_parts[j] - offsets[j], g.dense_shape) for j, g in enumerate(grads)]


def gather_summed(grads: list[tf.IndexedSlices], ranks: int, gather) -> tuple[list[tf.IndexedSlices], tf.Tensor, OneTable]:
    """``grads`` (one values dtype and row shape, int64 ids) as one table's rows with their ids,
    handed to ``gather`` (this rank's packed rows -> every rank's, concatenated), summed per row
    and divided by ``ranks``, back as each variable's ``IndexedSlices``; with the ids gathered
    (duplicates across ranks kept) and the table, for the caller's byte count."""
    table = one_table(grads)
    values, ids = without_ids(gather(with_ids(table.values, table.ids)), table.values)
    union = deduplicate(tf.IndexedSlices(values / ranks, ids, table.dense_shape))
    return by_variable(union.values, union.indices, table.offsets, grads), ids, table
