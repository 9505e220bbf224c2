"""Asynchronous PS (a plan with ``sync=False``): each worker pulls the rows it reads from their
owners and pushes its own gradient of them, through the rank's :class:`~..async_ps.AsyncPS`
(``wire.server``), with no Horovod collective and no barrier (issue 16).

A step of one worker:

1. before the traced step (:meth:`AsyncDensePS.before_step`): every PS dense variable is pulled
   whole into the model's copy of it, which the forward pass reads, in one request to each
   owner for all of them;
2. inside the step, each ``embedding_lookup`` of a PS sparse variable (:class:`PulledRowsRouter`)
   pulls the lookup's unique ids through a ``tf.numpy_function`` and serves the lookup from
   the pulled rows, which the step's tape watches. The pull is made where the ids exist,
   inside the step, because some are computed there (the LM's sampled softmax draws its
   candidate rows in the step), so no list of ids could be pulled before it;
3. the step returns, per lookup, the unique ids and the gradient of the loss with respect to
   their rows (duplicates of a row inside the batch summed), and per PS dense variable its
   whole gradient (:meth:`Exchange.gradients` hands nothing to the optimizer);
4. after the step the trainer pushes them (:meth:`..sync.GradientExchange.push`), all of them
   in one message to each owner, which applies SGD to its partitions as the push arrives,
   exactly once; ``end_step`` follows.

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
        shard = self.variables.get(variable_path(params))
        if shard is None:
            return None
        ids = tf.convert_to_tensor(ids)
        unique_ids, position = tf.unique(tf.cast(tf.reshape(ids, [-1]), tf.int64))
        rows = tf.numpy_function(functools.partial(self._pull, shard.name), [unique_ids], shard.dtype,
                                 stateful=True, name=f"px_async_pull_{self.lookups}")
        rows = tf.ensure_shape(rows, (None,) + shard.row_shape)
        if self.tape is not None:
            self.tape.watch(rows)
        self.pulled.setdefault(shard.name, []).append((unique_ids, rows))
        self.lookups += 1
        out = tf.gather(rows, position)
        return tf.reshape(out, tf.concat([tf.shape(ids), tf.constant(shard.row_shape, tf.int32)], 0))

    def _pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.server.pull(name, ids)


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
        self.outgoing = []
        for sync, grads in items:
            for (ids, _), grad in zip(self.router.pulled.get(sync.name, []), grads):
                if grad is not None:   # an IndexedSlices over the pulled rows: its duplicates summed
                    self.outgoing.append((sync.name, ids, tf.convert_to_tensor(grad)))
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
        pulled = self.wire.server.pull_many({sync.name: np.arange(sync.shard.shape[0], dtype=np.int64)
                                             for sync in self.syncs})
        for sync in self.syncs:
            sync.variable.assign(np.reshape(pulled[sync.name], tuple(sync.variable.shape)))

    def gradients(self, items, carried=None):
        self.outgoing = []
        for sync, grads in items:
            if grads[0] is not None:
                shape = sync.shard.shape
                grad = tf.reshape(tf.convert_to_tensor(grads[0]), shape)
                self.outgoing.append((sync.name, tf.range(shape[0], dtype=tf.int64), grad))
        return [], None

    def collectives(self) -> list[Collective]:
        """None: pulls and pushes are point-to-point messages of the serving threads."""
        return []
