"""Kernel plumbing of the emulated cluster: namespaces, veth pairs, a bridge, tc shaping.

Every object this module creates carries the prefix :data:`PREFIX` followed by a cluster id,
and is recorded in a state file under :data:`STATE_DIR` together with the pid of the process
that owns it. :func:`cleanup_stale` removes what a dead owner left behind (a ``kill -9``, a
crash) and never touches objects without the prefix or those of a live owner.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass

from ..errors import SetupError

PREFIX = "pxnb"
STATE_DIR = "/run/parallax_nb-netem"
NETNS_ETC = "/etc/netns"  # `ip netns exec NAME` bind-mounts /etc/netns/NAME/* over /etc/*
SUBNET_FIRST_OCTETS = "10.213"  # clusters get 10.213.K.0/24, K = 1..254, never in use elsewhere


@dataclass(frozen=True)
class ClusterRecord:
    """What one emulated cluster created: enough to remove it without the Python object."""

    cluster_id: str
    owner_pid: int
    bridge: str
    subnet: str
    namespaces: tuple[str, ...]
    host_veths: tuple[str, ...]

    @property
    def state_path(self) -> str:
        return os.path.join(STATE_DIR, f"{self.cluster_id}.json")

    def save(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self), f)
        os.replace(tmp, self.state_path)

    @classmethod
    def load(cls, path: str) -> "ClusterRecord":
        with open(path) as f:
            d = json.load(f)
        return cls(d["cluster_id"], int(d["owner_pid"]), d["bridge"], d["subnet"],
                   tuple(d["namespaces"]), tuple(d["host_veths"]))


def run(*argv: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command (inside ``netns`` if given); a failure names the command."""
    cmd = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SetupError(f"emulated cluster: `{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.returncode}",
                         hint="the emulated cluster needs root (CAP_NET_ADMIN) and the ip/tc tools (iproute2)")
    return proc


def check_privileges() -> None:
    """Fail early, with a clear message, where namespaces cannot be made."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise SetupError(f"emulated cluster: the `{tool}` command is missing",
                             hint="install iproute2 (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise SetupError(f"emulated cluster needs root to create network namespaces (euid {os.geteuid()})",
                         hint="run as root, or in a container with CAP_NET_ADMIN and CAP_SYS_ADMIN")


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def namespace_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def list_namespaces() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def used_subnets() -> set[str]:
    """Every 10.213.K.0/24 already addressed in this namespace or reserved by a live record."""
    used = set()
    out = run("ip", "-o", "-4", "addr", "show", check=False).stdout
    for token in out.split():
        if token.startswith(SUBNET_FIRST_OCTETS + "."):
            used.add(".".join(token.split("/")[0].split(".")[:3]) + ".0/24")
    for record in records():
        used.add(record.subnet)
    return used


def records() -> list[ClusterRecord]:
    try:
        names = sorted(os.listdir(STATE_DIR))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.endswith(".json"):
            try:
                out.append(ClusterRecord.load(os.path.join(STATE_DIR, name)))
            except (OSError, ValueError, KeyError):
                continue
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace_processes(namespace: str, grace_s: float = 2.0) -> list[int]:
    """Stop the processes still running inside one of our namespaces (ranks, orteds).

    They were started into the namespace by this cluster; SIGTERM first, SIGKILL after
    ``grace_s`` seconds.
    """
    def pids() -> list[int]:
        out = run("ip", "netns", "pids", namespace, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    victims = pids()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while victims and time.monotonic() < deadline:
        time.sleep(0.05)
        victims = [p for p in victims if pid_alive(p)]
    for pid in pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def remove(record: ClusterRecord) -> list[str]:
    """Remove everything one record lists; returns what was removed. Never raises on absence."""
    removed = []
    for ns in record.namespaces:
        if not ns.startswith(PREFIX):
            continue
        if namespace_exists(ns):
            kill_namespace_processes(ns)
            run("ip", "netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
        shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
    for link in (*record.host_veths, record.bridge):
        if link.startswith(PREFIX) and link_exists(link):
            run("ip", "link", "del", link, check=False)
            removed.append(f"link {link}")
    for folder in work_folders(record.cluster_id):
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(f"folder {folder}")
    try:
        os.unlink(record.state_path)
    except FileNotFoundError:
        pass
    return removed


def work_folders(cluster_id: str) -> list[str]:
    """The cluster's work folder (its MPI hostfile), made by its owner in the temporary folder;
    the owner removes it, ``cleanup`` after a kill -9."""
    return glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}{cluster_id}-*"))


def cleanup_stale(include_live: bool = False) -> list[str]:
    """Remove clusters whose owner process is gone (all of ours with ``include_live``).

    Also removes prefixed namespaces and links that no record mentions (a crash between
    creating an object and saving the record), unless some live cluster owns that id.
    """
    removed = []
    live_ids = set()
    for record in records():
        if include_live or not pid_alive(record.owner_pid):
            removed += remove(record)
        else:
            live_ids.add(record.cluster_id)

    def orphan(name: str) -> bool:
        return name.startswith(PREFIX) and not any(name.startswith(PREFIX + cid) for cid in live_ids)

    for ns in list_namespaces():
        if orphan(ns):
            kill_namespace_processes(ns)
            run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
            removed.append(f"netns {ns}")
    for link in sorted(os.listdir("/sys/class/net")):
        if orphan(link) and link_exists(link):
            run("ip", "link", "del", link, check=False)
            removed.append(f"link {link}")
    if os.path.isdir(NETNS_ETC):
        for name in os.listdir(NETNS_ETC):
            if orphan(name):
                shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
    return removed


def tbf_args(bandwidth_bps: float) -> list[str]:
    """``tc`` token-bucket arguments for a link of ``bandwidth_bps`` bits/s.

    The bucket holds 2 ms of traffic (at least 64 KiB, one GSO segment), so bursts stay short
    against the rate; the queue holds 50 ms before the kernel drops (TCP then backs off,
    as it would on a real switch port).
    """
    rate_bytes_per_s = bandwidth_bps / 8.0
    burst_bytes = max(64 * 1024, int(rate_bytes_per_s * 0.002))
    return ["tbf", "rate", f"{int(bandwidth_bps)}bit", "burst", str(burst_bytes), "latency", "50ms"]


def interface_counters(interface: str, netns: str | None = None) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of one interface, read from the kernel's statistics."""
    if netns is None:
        base = f"/sys/class/net/{interface}/statistics"
        with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
            return int(rx.read()), int(tx.read())
    out = run("cat", f"/sys/class/net/{interface}/statistics/rx_bytes",
              f"/sys/class/net/{interface}/statistics/tx_bytes", netns=netns).stdout.split()
    return int(out[0]), int(out[1])
