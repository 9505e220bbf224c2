"""The emulated cluster: machines as network namespaces on shaped links, for mpirun.

    from parallax_nb.netem import EmulatedCluster
    with EmulatedCluster(machines=2, workers_per_machine=2, bandwidth="1Gbit/s") as cluster:
        cmd = ["mpirun", "-np", str(cluster.ranks), *cluster.mpirun_args(), "python", "train.py"]

``python -m parallax_nb.netem cleanup`` removes what a killed process left behind;
``python -m parallax_nb.netem status`` lists the clusters that exist. Needs root.
"""
from .network import EmulatedCluster, Machine, parse_spec
from .links import PREFIX, cleanup_stale, interface_counters

__all__ = ["EmulatedCluster", "Machine", "parse_spec", "PREFIX", "cleanup_stale", "interface_counters"]
