"""What runs on every MPI rank: Horovod set-up, sharded parameter-server variables, the
distributed train step per plan (AR / PS / HYBRID / AUTO), byte accounting, checkpoints and
partition search. Call :func:`train` on every rank with the same arguments.

Submodules: ``trainer`` (set-up and loop), ``sharded`` (row shards), ``exchanges`` (one
exchange per (method, kind), the alltoall lookup router among them), ``sync`` (routes each
variable to its exchange), ``accounting`` (bytes on the wire),
``checkpoint``, ``partition_search``, ``reference`` (single-device yardstick).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "train": ("trainer", "train"),
    "Trainer": ("trainer", "Trainer"),
    "StepRecord": ("result", "StepRecord"),
    "TrainResult": ("result", "TrainResult"),
    "train_single_device": ("reference", "train_single_device"),
    "search_partitions": ("partition_search", "search_partitions"),
    "PartitionSearch": ("partition_search", "PartitionSearch"),
    "load_checkpoint": ("checkpoint", "load"),
    "latest_checkpoint": ("checkpoint", "latest_checkpoint"),
    "load_into_model": ("checkpoint", "load_into_model"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'parallax_nb.runtime' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(f"parallax_nb.runtime.{module}"), attribute)
    globals()[name] = value
    return value
