"""Row-sharded parameter-server variables (DESIGN.md §5).

A :class:`ShardedVariable` holds, on each rank, only the partitions that rank owns (see
:mod:`.partitioning`). The model's own variable is emptied once the shard exists, so no rank
keeps the full table. Lookups are served from the shards by the PS sparse exchange
(:mod:`.exchanges.sparse_ps`).
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from ..ops import variable_path
from .partitioning import RowPartitioning


def shard_variable_name(name: str, partition: int) -> str:
    """Keras variable names may not contain '/': ``embedding/embeddings`` part 3 ->
    ``px_shard__embedding__embeddings__p3``."""
    return f"px_shard__{name.replace('/', '__')}__p{partition}"


class ShardedVariable:
    """The partitions of one PS variable that this rank owns.

    ``parts[k]`` is partition ``owned[k]`` (a trainable ``keras.Variable`` of
    ``rows_in(p)`` rows). ``row_shape`` and ``dtype`` describe one row.
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype, partitioning: RowPartitioning, rank: int,
                 initial_parts: dict[int, np.ndarray]):
        import keras

        self.name = name
        self.shape = tuple(shape)
        self.row_shape = tuple(shape[1:])
        self.dtype = tf.as_dtype(dtype)
        self.partitioning = partitioning
        self.rank = rank
        self.owned = partitioning.owned_by(rank)
        self.parts = [keras.Variable(initial_parts[p], name=shard_variable_name(name, p), trainable=True,
                                     dtype=self.dtype.name) for p in self.owned]
        # A rank that owns no partition (P < N) still serves its (empty) share of every lookup
        # from a 0-row variable, so that its backward pass runs the row-gradient alltoall too.
        self.anchor = None if self.parts else keras.Variable(
            np.zeros((0,) + self.row_shape, self.dtype.as_numpy_dtype), name=f"px_anchor__{name.replace('/', '__')}",
            trainable=True, dtype=self.dtype.name)

    @property
    def tape_variables(self) -> list:
        """What the backward pass differentiates on this rank (the anchor when nothing is owned)."""
        return list(self.parts) if self.parts else [self.anchor]

    @property
    def row_bytes(self) -> int:
        return int(math.prod(self.row_shape)) * self.dtype.size

    @property
    def local_bytes(self) -> int:
        return sum(int(math.prod(v.shape)) * self.dtype.size for v in self.parts)

    def local_rows(self, ids: tf.Tensor) -> tf.Tensor:
        """Rows ``ids`` (global ids, all owned by this rank) from this rank's partitions."""
        P, N = self.partitioning.partitions, self.partitioning.ranks
        local = ids // P
        if not self.parts:
            return tf.gather(self.anchor.value, local)  # ids is empty: nobody asks a rank that owns nothing
        if len(self.parts) == 1:
            return tf.gather(self.parts[0].value, local)
        which = tf.cast((ids % P - self.rank) // N, tf.int32)
        positions = tf.dynamic_partition(tf.range(tf.shape(ids)[0]), which, len(self.parts))
        locals_ = tf.dynamic_partition(local, which, len(self.parts))
        rows = [tf.gather(part.value, idx) for part, idx in zip(self.parts, locals_)]
        return tf.dynamic_stitch(positions, rows)

    def values(self) -> dict[int, np.ndarray]:
        return {p: v.numpy() for p, v in zip(self.owned, self.parts)}


def route_embedding_layers(model) -> list[str]:
    """Point every Keras ``Embedding`` layer of ``model`` at ``parallax_nb.ops.embedding_lookup``.

    On one device the lookup is still ``tf.gather`` (identical results); on engines the
    active router may serve it from shards. Returns the paths of the embedding variables.
    """
    import keras

    from ..ops import embedding_lookup

    routed = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, keras.layers.Embedding) or getattr(layer, "quantization_mode", None):
            continue
        if getattr(layer, "lora_enabled", False):
            continue

        def call(inputs, _layer=layer):
            if inputs.dtype not in ("int32", "int64", tf.int32, tf.int64):
                inputs = keras.ops.cast(inputs, "int32")
            return keras.ops.cast(embedding_lookup(_layer.embeddings, inputs), _layer.compute_dtype)

        layer.call = call
        routed.append(layer.embeddings.path)
    return routed


class RecordingRouter:
    """Records which variables go through ``embedding_lookup`` (and serves them locally)."""

    def __init__(self):
        self.paths: set[str] = set()

    def lookup(self, params, ids):
        self.paths.add(variable_path(params))
        return None


def release_storage(variable) -> None:
    """Drop the storage of a Keras variable whose rows now live in shards: its tf.Variable is
    replaced by an empty one of 0 rows, so the full table is freed on this rank. The Keras
    variable keeps its declared shape (the model still builds and reports it) and its tensor
    name (the optimizer's weight-decay choice is made on it: :mod:`.optimizer`)."""
    shape = tuple(variable.shape)
    empty = tf.Variable(tf.zeros((0,) + shape[1:], dtype=variable.dtype), trainable=False, name=variable.name)
    variable._value = empty


def storage_bytes(variable) -> int:
    """Bytes a Keras variable actually holds on this rank (0 rows after :func:`release_storage`)."""
    value = getattr(variable, "_value", variable)
    return int(math.prod(value.shape)) * tf.as_dtype(value.dtype).size
