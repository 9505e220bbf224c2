"""The one lookup through which sparse (row-gathered) variables are read.

On one device :func:`embedding_lookup` is ``tf.gather``, whose gradient is a
``tf.IndexedSlices``: that is what the profiler calls *sparse*. On MPI engines the runtime
installs a router (:func:`route_lookups`) that serves the lookups of parameter-server
variables from their row shards through ``alltoall`` instead. Keras ``Embedding`` layers are
pointed at this function when the runtime rebuilds a model, and layers that gather rows
themselves (the LM's sampled softmax) call it directly, so "sparse" in the profile and
"PS-capable" in the runtime mean the same set of variables.

:func:`embedding_lookups` gathers the rows of several variables at once (the sampled
softmax's weights and biases at the same ids): a router that can serve them together (the
asynchronous PS pulls them in one request per owner) does; any other serves them one by one.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Protocol

import tensorflow as tf


class LookupRouter(Protocol):
    def lookup(self, params, ids: tf.Tensor) -> "tf.Tensor | None":
        """Rows ``ids`` of ``params``, or None to fall back to a local ``tf.gather``."""

    # optional: lookup_many(pairs) -> [rows or None per (params, ids)], several lookups served together


_state = threading.local()


def variable_path(params) -> str:
    """The stable name of a Keras or TensorFlow variable (Keras 3 ``path``, else ``name``)."""
    path = getattr(params, "path", None)
    if path:
        return path
    return getattr(params, "name", "").split(":")[0]


def embedding_lookup(params, ids) -> tf.Tensor:
    """Gather rows ``ids`` (any shape, integer) of ``params`` (rows x ...)."""
    return embedding_lookups([(params, ids)])[0]


def embedding_lookups(pairs) -> list[tf.Tensor]:
    """:func:`embedding_lookup` of several ``(params, ids)`` pairs, served together where the
    router can (its ``lookup_many``)."""
    pairs = list(pairs)
    router = getattr(_state, "router", None)
    served = routed(router, pairs) if router is not None else [None] * len(pairs)
    return [local_gather(params, ids) if rows is None else rows for rows, (params, ids) in zip(served, pairs)]


def routed(router: LookupRouter, pairs: list) -> list:
    """``router``'s rows for each ``(params, ids)``, None where it serves none: through its
    ``lookup_many`` if it has one, else one ``lookup`` each."""
    many = getattr(router, "lookup_many", None)
    if many is not None:
        return many(pairs)
    return [router.lookup(params, ids) for params, ids in pairs]


def local_gather(params, ids) -> tf.Tensor:
    """Rows ``ids`` of this process's copy of ``params`` (a Keras or TensorFlow variable)."""
    return tf.gather(getattr(params, "value", params), ids)


@contextlib.contextmanager
def route_lookups(router: LookupRouter) -> Iterator[None]:
    """Serve :func:`embedding_lookup` calls in this thread from ``router`` while active."""
    previous = getattr(_state, "router", None)
    _state.router = router
    try:
        yield
    finally:
        _state.router = previous
