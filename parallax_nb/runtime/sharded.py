"""Row-sharded parameter-server variables and the alltoall lookup router (DESIGN.md §5).

A :class:`ShardedVariable` holds, on each rank, only the partitions that rank owns (see
:mod:`.partitioning`). The model's own variable is emptied once the shard exists, so no rank
keeps the full table.

A lookup of rows ``ids`` (:class:`ShardedLookupRouter`, installed with
``parallax_nb.ops.route_lookups`` during the train step):

1. ``unique(ids)`` on the requesting rank; order the unique ids by owner rank;
2. ``alltoall`` the ids to their owners (int64, 8 bytes per remote id);
3. each owner gathers the requested rows from its partitions;
4. ``alltoall`` the rows back; rebuild ``ids``' shape from the unique rows.

Gradients flow back through both gathers and the row ``alltoall`` (Horovod registers its
gradient as the reverse ``alltoall``), so the backward pass hands each owner, for every row a
rank touched, that rank's summed gradient as an ``IndexedSlices`` on the owner's partition:
duplicates inside a rank are summed by the unique/gather, duplicates across ranks by the
optimizer's scatter. The trainer divides by N so the update is the global-batch mean.

With local aggregation (a :class:`~.hierarchical.Hierarchy`, G ranks per machine) a machine
asks for each row once: its ranks first gather their unique ids into the machine's union U
(shared memory); the ids of U owned by a rank of local index j are requested by this
machine's rank of local index j (one requester per owner and machine; an owner on the own
machine is the requester itself); the rows come back to that requester and are shared with
the machine's other ranks. Backward, the reverse of that sharing sums the machine's
gradients of each row on its requester, which pushes one gradient per row and machine to
the owner: pull and push move alpha_G of the rows per machine, the cost model's PS figure
with local aggregation.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from ..ops import variable_path
from .accounting import ByteLedger
from .tensor_ops import op_tag, tile_rows
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


def exchange_rows(served: tf.Tensor, send_splits: tf.Tensor, receive_splits: tf.Tensor, tag: str,
                  what: str = "rows", registrations: list[str] | None = None, hierarchy=None) -> tf.Tensor:
    """alltoall of the rows owners serve back to their requesters, with an explicitly named
    reverse alltoall as its gradient (row gradients to the owners).

    Every Horovod op of the step carries a name built from the variable and the call
    number: Horovod matches collectives across ranks by name, and automatic names would
    differ between ranks whose graphs differ (a rank owning two partitions gathers from
    both, a rank owning one does not).

    Traced, ``tf.custom_gradient`` registers the gradient in TensorFlow's process-wide
    registry under a new name, and that entry keeps the whole traced graph alive
    (tensorflow#27492, #97697): the name is appended to ``registrations`` so that the
    trace's owner can drop it (:func:`forget_gradient_registrations`).
    """
    import horovod.tensorflow as hvd

    def alltoall(x, splits, name):   # within the hierarchy's process set of the splits' peers, if given
        if hierarchy is not None:
            return hierarchy.alltoall(x, splits, name)
        return hvd.alltoall(x, splits=splits, name=name, ignore_name_scope=True)

    @tf.custom_gradient
    def exchange(x):
        y, _ = alltoall(x, send_splits, f"px_{what}_{tag}")

        def grad(dy):
            dx, _ = alltoall(tf.convert_to_tensor(dy), receive_splits, f"px_{what}grads_{tag}")
            return dx

        return y, grad

    rows = exchange(served)
    if registrations is not None and not tf.executing_eagerly():
        registrations.append(rows.op.get_attr("_gradient_op_type").decode())
    return rows


def forget_gradient_registrations(names: list[str]) -> None:
    """Drop the gradient registrations ``names`` (made by :func:`exchange_rows` while tracing)
    once their trace has been differentiated: nothing looks them up again, and each kept
    the traced step, ~6.6 MiB per run of the tiny LM, for the life of an engine."""
    from tensorflow.python.framework import ops as tf_ops

    registry = tf_ops._gradient_registry._registry
    for name in names:
        registry.pop(name, None)
    names.clear()


class ShardedLookupRouter:
    """Serves ``embedding_lookup`` of PS variables from their shards through ``alltoall``.

    Bytes of every exchange with ranks on other machines (``remote``: per rank 1.0 when on
    another machine) are written to ``ledger`` under the variable's name: forward ids and
    rows, and the row gradients the backward pass will send (the reverse of the rows).
    ``hierarchy``: aggregate each machine's lookups first (module docstring), or None.
    """

    def __init__(self, variables: dict[str, ShardedVariable], ranks: int, rank: int, ledger: ByteLedger,
                 remote: list[float] | None = None, hierarchy=None):
        import horovod.tensorflow as hvd

        self._hvd = hvd
        self.variables = variables
        self.ranks = ranks
        self.rank = rank
        self.ledger = ledger
        self.remote = remote if remote is not None else [0.0 if r == rank else 1.0 for r in range(ranks)]
        self.hierarchy = hierarchy
        self.gradient_registrations: list[str] = []

    def reset(self) -> None:
        """Start a new trace: lookups are numbered per variable from 0 again."""
        self._calls: dict[str, int] = {}

    def forget_gradients(self) -> None:
        """Call once the trace's backward pass is built (see :func:`exchange_rows`)."""
        forget_gradient_registrations(self.gradient_registrations)

    def lookup(self, params, ids):
        sharded = self.variables.get(variable_path(params))
        if sharded is None:
            return None
        calls = getattr(self, "_calls", None)
        if calls is None:
            self.reset()
            calls = self._calls
        tag = f"{op_tag(sharded.name)}_{calls.get(sharded.name, 0)}"
        calls[sharded.name] = calls.get(sharded.name, 0) + 1
        ids = tf.convert_to_tensor(ids)
        flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        unique_ids, position = tf.unique(flat)
        if self.hierarchy is not None and self.hierarchy.G > 1:
            unique_rows = self._machine_lookup(sharded, unique_ids, tag)
        else:
            unique_rows = self._request(sharded, unique_ids, self._owners(sharded, unique_ids), tag)
        out = tf.gather(unique_rows, position)
        return tf.reshape(out, tf.concat([tf.shape(ids), tf.constant(sharded.row_shape, tf.int32)], 0))

    def _owners(self, sharded: ShardedVariable, ids: tf.Tensor) -> tf.Tensor:
        return tf.cast((ids % sharded.partitioning.partitions) % self.ranks, tf.int32)

    def _request(self, sharded: ShardedVariable, ids: tf.Tensor, owners: tf.Tensor, tag: str) -> tf.Tensor:
        """Rows ``ids`` (unique) from their ``owners``: ids out by owner (alltoall), the owners'
        rows back through :func:`exchange_rows`, in the order of ``ids``; bytes counted."""
        N = self.ranks
        order = tf.argsort(owners, stable=True)
        splits = tf.math.bincount(owners, minlength=N, maxlength=N, dtype=tf.int32)
        recv_ids, recv_splits = self._hvd.alltoall(tf.gather(ids, order), splits=splits, name=f"px_ids_{tag}",
                                                   ignore_name_scope=True)
        rows = exchange_rows(sharded.local_rows(recv_ids), send_splits=recv_splits, receive_splits=splits, tag=tag,
                             registrations=self.gradient_registrations)
        self._count(sharded, splits, recv_splits)
        return tf.gather(rows, tf.argsort(order))

    def _machine_lookup(self, sharded: ShardedVariable, unique_ids: tf.Tensor, tag: str) -> tf.Tensor:
        """Rows of this rank's ``unique_ids``, requested once per machine (module docstring)."""
        h = self.hierarchy
        together, together_splits = h.local_gather(unique_ids, f"px_la_ids_local_{tag}")
        union, union_position = tf.unique(together)
        start = tf.reduce_sum(together_splits[:self.rank])
        mine = tf.slice(union_position, [start], tf.shape(unique_ids))  # my unique ids' places in the union
        owner = self._owners(sharded, union)
        requester = owner % h.G  # local index of the owner = the local index that asks for the row
        asked = tf.equal(requester, h.local)
        my_rows = self._request(sharded, tf.boolean_mask(union, asked), tf.boolean_mask(owner, asked), tag)
        # share with the machine: every rank receives each requester's rows (requesters in rank order)
        counts = [tf.reduce_sum(tf.cast(tf.equal(requester, i), tf.int32)) for i in range(h.G)]
        shared = exchange_rows(tile_rows(my_rows, h.G), send_splits=h.local_splits(tf.shape(my_rows)[0]),
                               receive_splits=h.splits(h.local_peers, counts), tag=tag, what="la_share",
                               registrations=self.gradient_registrations, hierarchy=h)
        places = tf.concat([tf.cast(tf.where(tf.equal(requester, i))[:, 0], tf.int32) for i in range(h.G)], 0)
        union_rows = tf.gather(shared, tf.math.invert_permutation(places))
        return tf.gather(union_rows, mine)

    def _count(self, sharded: ShardedVariable, splits, recv_splits) -> None:
        """ids out + rows back + row gradients out again, parts exchanged with other machines only."""
        mine = tf.constant(self.remote, tf.float64)
        remote_requested = tf.reduce_sum(tf.cast(splits, tf.float64) * mine)      # my ids others own
        remote_served = tf.reduce_sum(tf.cast(recv_splits, tf.float64) * mine)    # others' ids I own
        id_bytes, row_bytes = 8.0, float(sharded.row_bytes)
        sent = remote_requested * id_bytes + remote_served * row_bytes + remote_requested * row_bytes
        received = remote_served * id_bytes + remote_requested * row_bytes + remote_served * row_bytes
        self.ledger.add(sharded.name, sent, received)


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
