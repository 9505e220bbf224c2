"""Reaper: kills a cluster's processes if the notebook process dies without stopping it.

ipyparallel stops its controller and engines at a normal interpreter exit, but not when the
kernel is killed (SIGKILL, a crash, SIGTERM without atexit). Then the controller, ``mpiexec``,
engines and nannies would run on as orphans. :class:`~parallax_nb.cluster.Cluster` starts one
reaper per cluster: ``python -m parallax_nb.cluster.reaper OWNER_PID PIDFILE [DIR]``. It
polls every ``POLL_S`` seconds; when ``OWNER_PID`` is gone it reads the pids in ``PIDFILE``
(rewritten by the Cluster whenever engines restart), terminates each with its descendants
(SIGTERM, then SIGKILL after 3 s), removes the emulated networks the owner built (their
namespaces, links and whatever runs inside), removes ``DIR`` (the private profile) and exits. When the
Cluster stops normally it removes ``PIDFILE``, and the reaper exits quietly.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

POLL_S = 1.0


def _kill_trees(pids: list[int]) -> None:
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.extend(p.children(recursive=True))
            procs.append(p)
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _remove_networks_of(owner: int) -> None:
    """Remove the emulated networks (namespaces, links) the dead owner had built."""
    from ..netem import links

    for record in links.records():
        if record.owner_pid == owner:
            links.remove(record)


def main(argv: list[str]) -> int:
    import psutil

    owner, pidfile = int(argv[0]), argv[1]
    directory = argv[2] if len(argv) > 2 else None
    while True:
        if not os.path.exists(pidfile):
            return 0                      # the cluster was stopped normally
        if not psutil.pid_exists(owner) or psutil.Process(owner).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(POLL_S)
    try:
        with open(pidfile) as f:
            pids = [int(p) for p in json.load(f)]
    except (OSError, ValueError):
        pids = []
    _kill_trees(pids)
    _remove_networks_of(owner)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
