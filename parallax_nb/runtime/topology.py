"""Which machine every rank is on, and what that means for bytes on the wire.

A run's topology decides two things: which collectives local aggregation may keep inside a
machine (:mod:`.hierarchical`), and which of a rank's bytes count as network traffic (only
bytes exchanged with ranks on *other* machines do; traffic inside a machine goes through
shared memory, as in the cost model of :mod:`parallax_nb.cost.model`).

Where it comes from (:func:`resolve_topology`), first match wins:

1. ``workers_per_machine`` given to ``train``/``Trainer``: rank r is on machine r // G.
2. The ranks span several hosts (Horovod's ``cross_size() > 1``; a network namespace of the
   emulated cluster counts as a host): the real hosts, numbered in order of their first rank.
3. All ranks on one host: the plan's cluster when it has exactly as many workers as there are
   ranks (the host emulates the machines the plan was priced for), else every rank its own
   machine (what a one-host test or notebook run compares with the cost model).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Topology:
    """``machine_of[r]``: the machine (0-based) of rank r. ``source`` says how it was found."""

    machine_of: tuple[int, ...]
    source: str = "argument"

    def __post_init__(self):
        machines = sorted(set(self.machine_of))
        if machines != list(range(len(machines))):
            raise ConfigError(f"machine numbers must be 0..M-1, got {sorted(set(self.machine_of))}")

    @classmethod
    def blocks(cls, ranks: int, workers_per_machine: int, source: str = "argument") -> "Topology":
        """Rank r on machine r // G (how ``mpirun --map-by slot`` fills hosts)."""
        if isinstance(workers_per_machine, bool) or not isinstance(workers_per_machine, int) \
                or workers_per_machine < 1:
            raise ConfigError(f"workers_per_machine must be a whole number >= 1, got {workers_per_machine!r}")
        if ranks % workers_per_machine:
            raise ConfigError(f"{ranks} ranks do not fill machines of workers_per_machine={workers_per_machine}",
                              hint="use a workers_per_machine that divides the number of ranks")
        return cls(tuple(r // workers_per_machine for r in range(ranks)), source)

    @property
    def ranks(self) -> int:
        return len(self.machine_of)

    @property
    def machines(self) -> int:
        return max(self.machine_of) + 1

    def ranks_on(self, machine: int) -> list[int]:
        return [r for r, m in enumerate(self.machine_of) if m == machine]

    @property
    def uniform(self) -> bool:
        """Every machine has the same number of ranks, in one contiguous block of ranks."""
        if self.ranks % self.machines:
            return False
        g = self.ranks // self.machines
        return all(m == r // g for r, m in enumerate(self.machine_of))

    @property
    def workers_per_machine(self) -> int:
        """Ranks per machine (the largest machine's when they differ)."""
        return max(len(self.ranks_on(m)) for m in range(self.machines))

    def remote(self, rank: int) -> list[float]:
        """Per rank: 1.0 when it is on another machine than ``rank``, else 0.0 (a byte mask)."""
        mine = self.machine_of[rank]
        return [0.0 if m == mine else 1.0 for m in self.machine_of]

    def remote_share(self, rank: int) -> float:
        """Share of a rank's peers that are on other machines: ``(W - g) / (W - 1)`` (the cost
        model's ``r``; 0 on one machine). Scales collectives whose traffic is spread evenly
        over the peers (ring allreduce, allgather) when they span all ranks."""
        from ..cost.model import remote_share

        return remote_share(self.ranks, len(self.ranks_on(self.machine_of[rank])))

    def describe(self) -> str:
        sizes = [len(self.ranks_on(m)) for m in range(self.machines)]
        shape = f"{self.machines} x {sizes[0]}" if len(set(sizes)) == 1 else " + ".join(map(str, sizes))
        return f"{shape} ranks ({self.source})"


def resolve_topology(ranks: int, host_keys: list, plan=None, workers_per_machine: int | None = None) -> Topology:
    """The run's topology (module docstring). ``host_keys[r]``: any value naming rank r's host."""
    if workers_per_machine is not None:
        return Topology.blocks(ranks, workers_per_machine, "argument")
    if len(set(host_keys)) > 1:
        order = list(dict.fromkeys(host_keys))
        return Topology(tuple(order.index(k) for k in host_keys), "hosts")
    cluster = getattr(plan, "cluster", None)
    if cluster is not None and cluster.workers == ranks:
        return Topology.blocks(ranks, cluster.workers_per_machine, "plan's cluster on one host")
    return Topology.blocks(ranks, 1, "one machine per rank")


def host_key() -> str:
    """This rank's host: its hostname plus its network namespace (one namespace of the
    emulated cluster is one machine)."""
    return f"{socket.gethostname()}/{os.stat('/proc/self/ns/net').st_ino}"


def gather_topology(hvd, plan=None, workers_per_machine: int | None = None) -> Topology:
    """The job's topology from every rank's :func:`host_key` (a collective: call on all ranks)."""
    key = host_key()
    keys = hvd.allgather_object(key, name="px_hosts") if hvd.size() > 1 else [key]
    return resolve_topology(hvd.size(), keys, plan, workers_per_machine)
