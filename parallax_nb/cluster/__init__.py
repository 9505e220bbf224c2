"""Run training on an ipyparallel cluster whose engines are MPI ranks.

``Cluster`` starts, reuses and stops the controller and engines; ``run`` ships a Job and a
Plan to the engines and returns a live ``Run``; ``default_cluster`` is the notebook's shared
cluster that repeated runs reuse.
"""
from .cluster import Cluster, ClusterStatus, EngineInfo, current_default_cluster, default_cluster, stop_default_cluster
from .dispatch import last_run, run
from .handle import Run

__all__ = ["Cluster", "ClusterStatus", "EngineInfo", "Run", "run", "default_cluster", "current_default_cluster",
           "stop_default_cluster", "last_run"]
