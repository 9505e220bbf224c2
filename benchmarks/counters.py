"""The kernel's own byte counters, the second way of measuring what crossed the sockets.

Every rank runs inside a network namespace of an :class:`~parallax_nb.netem.EmulatedCluster`
(one namespace per emulated machine; the loopback table uses one machine), so the counters
of that namespace count this benchmark's traffic and nobody else's:

* ``lo``: bytes between ranks of the same machine (a TCP byte sent on ``lo`` is counted once
  in ``tx_bytes`` and once in ``rx_bytes`` of the same device);
* ``eth0``: bytes between machines, through the shaped link.

For N ranks on M machines over S steps, bytes sent + received per rank per step:

    kernel_bytes_per_rank = (sum_m (eth0_rx_m + eth0_tx_m) + sum_m 2 * lo_tx_m) / (N * S)

and per machine link per step ``(eth0_rx_m + eth0_tx_m) / S``. Counters include TCP/IP
headers, Open MPI's and Horovod's control messages: they are an upper bound of the payload.
"""
from __future__ import annotations

import os


def read_interfaces(path: str = "/proc/net/dev") -> dict[str, tuple[int, int]]:
    """``{interface: (rx_bytes, tx_bytes)}`` of this process's network namespace."""
    out = {}
    with open(path) as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            fields = data.split()
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def namespace_id() -> int:
    """Identity of this process's network namespace (ranks of one emulated machine share it)."""
    return os.stat("/proc/self/ns/net").st_ino


def kernel_bytes(start: dict[int, dict], end: dict[int, dict], ranks: int, steps: int) -> dict:
    """Bytes per rank per step and per machine link per step between two readings.

    ``start``/``end``: ``{namespace_id: read_interfaces()}``, one reading per machine.
    """
    link_total = local_total = 0
    for ns, before in start.items():
        after = end[ns]
        for name, (rx1, tx1) in after.items():
            rx0, tx0 = before.get(name, (0, 0))
            if name == "lo":
                local_total += 2 * (tx1 - tx0)
            elif name == "eth0":
                link_total += (rx1 - rx0) + (tx1 - tx0)
    machines = max(len(start), 1)
    return {
        "bytes_per_rank_per_step": (link_total + local_total) / (ranks * steps),
        "link_bytes_per_machine_per_step": link_total / (machines * steps),
        "local_bytes_per_rank_per_step": local_total / (ranks * steps),
    }
