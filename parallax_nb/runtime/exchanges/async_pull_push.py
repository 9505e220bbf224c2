"""Asynchronous PS (a plan with ``sync=False``): each worker pulls the rows it reads from their
owners and pushes its own gradient of them, through the rank's :class:`~..async_ps.AsyncPS`
(``wire.server``), with no Horovod collective and no barrier (issue 16).

A step of one worker:

1. before the traced step (:meth:`AsyncDensePS.before_step`): every PS dense variable is pulled
   whole (its owners' partitions, no row ids) into the model's copy of it, which the forward
   pass reads, in one request to each owner for all of them;
2. inside the step, each ``embedding_lookup`` of a PS sparse variable (:class:`PulledRowsRouter`)
   pulls the lookup's unique ids through a ``tf.numpy_function`` and serves the lookup from
   the pulled rows, which the step's tape watches (an ``embedding_lookups`` of several
   variables, the sampled softmax's weights and biases, is one pull of all of them). The
   pull is made where the ids exist, inside the step, because some are computed there (the
   LM's sampled softmax draws its candidate rows in the step), so no list of ids could be
   pulled before it;
3. the step returns, per lookup, the unique ids and the gradient of the loss with respect to
   their rows (duplicates of a row inside the batch summed), and per PS dense variable its
   whole gradient, pushed as partitions without row ids (:meth:`Exchange.gradients` hands
   nothing to the optimizer);
4. after the step the trainer pushes them (:meth:`..sync.GradientExchange.push`; clipped first
   when the optimizer clips), all of them in one message to each owner, which applies the
   user's optimizer to its partitions as the push arrives, exactly once
   (:mod:`..owner_optimizers`); ``end_step`` follows.

No division by W: an asynchronous worker's update is its own batch's gradient times the
learning rate (Parallax's asynchronous PS, Hogwild-style), so W workers make W updates where
synchronous training makes one of their mean; with one worker the two are the same, bit for
bit.

Bytes: the payload each rank hands to MPI for its pulls and pushes and serves as owner, counted
by :class:`~..async_ps.AsyncPS` (``traffic``), read by the trainer after each step.
"""
from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from ...ops import variable_path
from ...types import ASYNC_PS, Collective, Kind
from .base import Exchange


class PulledRowsRouter:
    """Serves ``embedding_lookup`` of asynchronous PS variables from rows pulled in the step.

    ``pulled[name]``: per lookup of the last trace, (unique ids, pulled rows), the rows watched
    by ``tape`` (:meth:`watch`) so the step can differentiate the loss with respect to them.
    """

    def __init__(self, variables: dict, server):
        self.variables = variables
        self.server = server
        self.tape = None
        self.pulled: dict[str, list[tuple]] = {}
        self.lookups = 0

    def reset(self) -> None:
        self.pulled = {}
        self.lookups = 0

    def watch(self, tape) -> None:
        self.tape = tape

    def lookup(self, params, ids):
        return self.lookup_many([(params, ids)])[0]

    def lookup_many(self, pairs):
        """The lookups of ``pairs`` ((params, ids) each) this router serves, pulled together in
        one :meth:`~..async_ps.AsyncPS.pull_many` (one request per owner); None for the others."""
        served = []   # (index in pairs, shard, ids, unique ids, positions)
        for i, (params, ids) in enumerate(pairs):
            shard = self.variables.get(variable_path(params))
            if shard is not None:
                ids = tf.convert_to_tensor(ids)
                unique_ids, position = tf.unique(tf.cast(tf.reshape(ids, [-1]), tf.int64))
                served.append((i, shard, ids, unique_ids, position))
        out = [None] * len(pairs)
        if not served:
            return out
        names = [shard.name for _, shard, *_ in served]
        pulled = tf.numpy_function(functools.partial(self._pull, names), [u for *_, u, _ in served],
                                   [shard.dtype for _, shard, *_ in served], stateful=True,
                                   name=f"px_async_pull_{self.lookups}")
        for (i, shard, ids, unique_ids, position), rows in zip(served, pulled):
            rows = tf.ensure_shape(rows, (None,) + shard.row_shape)
            if self.tape is not None:
                self.tape.watch(rows)
            self.pulled.setdefault(shard.name, []).append((unique_ids, rows))
            self.lookups += 1
            out[i] = tf.reshape(tf.gather(rows, position),
                                tf.concat([tf.shape(ids), tf.constant(shard.row_shape, tf.int32)], 0))
        return out

    def _pull(self, names: list[str], *ids: np.ndarray) -> list[np.ndarray]:
        if len(set(names)) == len(names):
            pulled = self.server.pull_many(dict(zip(names, ids)))
            return [pulled[name] for name in names]
        return [self.server.pull(name, i) for name, i in zip(names, ids)]   # one variable twice: one by one


class AsyncSparsePS(Exchange):
    """Asynchronous PS, sparse: rows pulled by the lookups, their gradients pushed after the step."""

    method, kind = ASYNC_PS, Kind.SPARSE

    def __init__(self, wire, syncs):
        super().__init__(wire, syncs)
        self.router = PulledRowsRouter({s.name: s.shard for s in syncs}, getattr(wire, "server", None))
        self.outgoing: list[tuple] = []

    def tape_sources(self, sync) -> list:
        """The rows pulled for ``sync``'s lookups in this trace (what the loss is differentiated by)."""
        return [rows for _, rows in self.router.pulled.get(sync.name, [])]

    def gradients(self, items, carried=None):
        """One push per variable: the gradient of its pulled rows (several lookups of one
        variable summed per row, so the rows are unique, as the worker's clipping wants)."""
        self.outgoing = []
        for sync, grads in items:
            pieces = [(ids, tf.convert_to_tensor(grad)) for (ids, _), grad
                      in zip(self.router.pulled.get(sync.name, []), grads) if grad is not None]
            if len(pieces) > 1:
                ids, where = tf.unique(tf.concat([ids for ids, _ in pieces], 0))
                grad = tf.math.unsorted_segment_sum(tf.concat([g for _, g in pieces], 0), where, tf.shape(ids)[0])
                pieces = [(ids, grad)]
            self.outgoing += [(sync.name, ids, grad) for ids, grad in pieces]
        return [], None

    def collectives(self) -> list[Collective]:
        """None: pulls and pushes are point-to-point messages of the serving threads."""
        return []


class AsyncDensePS(Exchange):
    """Asynchronous PS, dense: the whole variable pulled before the step, its gradient pushed after."""

    method, kind = ASYNC_PS, Kind.DENSE

    def __init__(self, wire, syncs):
        super().__init__(wire, syncs)
        self.outgoing: list[tuple] = []

    def before_step(self) -> None:
        """Pull every PS dense variable whole, in one request to each owner."""
        if not self.syncs:
            return
        pulled = self.wire.server.pull_many({sync.name: None for sync in self.syncs})
        self._assign([np.reshape(pulled[sync.name], tuple(sync.variable.shape)) for sync in self.syncs])

    @functools.cached_property
    def _assign(self):
        """Assign every PS dense variable its pulled value in one call (a traced function: one
        Keras ``assign`` per variable costs more Python than the pull itself)."""
        variables = [sync.variable for sync in self.syncs]

        @tf.function(autograph=False)
        def assign(values):
            for variable, value in zip(variables, values):
                variable.assign(value)

        return assign

    def gradients(self, items, carried=None):
        self.outgoing = []
        for sync, grads in items:
            if grads[0] is not None:
                grad = tf.reshape(tf.convert_to_tensor(grads[0]), sync.shard.shape)
                self.outgoing.append((sync.name, None, grad))   # the whole variable's gradient
        return [], None

    def collectives(self) -> list[Collective]:
        """None: pulls and pushes are point-to-point messages of the serving threads."""
        return []
