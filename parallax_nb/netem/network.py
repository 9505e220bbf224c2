"""An emulated cluster on one host: each machine a network namespace on a shaped link.

Why: communication only costs what it costs between machines when the bytes cross a link of
bounded bandwidth. Here each "machine" is a network namespace whose ``eth0`` (one end of a
veth pair) joins a private bridge; both ends of the pair are shaped with a ``tc`` token
bucket to ``bandwidth`` bits/s, so each machine has a full-duplex NIC of that rate. Ranks of
one machine talk through that namespace's own stack (unshaped, like processes on one host),
ranks of different machines through the shaped links. ``mpirun`` starts one ``orted`` per
namespace through an rsh agent that runs its command under ``ip netns exec`` (ranks started
straight under ``ip netns exec`` cannot reach mpirun's PMIx server).

    with EmulatedCluster(machines=2, workers_per_machine=2, bandwidth="1Gbit/s") as cluster:
        subprocess.run(["mpirun", "-np", str(cluster.ranks), *cluster.mpirun_args(), "python", "train.py"])

Everything is removed on exit, on an exception, on Ctrl-C and on SIGTERM/SIGHUP (more of them
arriving while it is removed wait until it is done); after a
``kill -9``, ``python -m parallax_nb.netem cleanup`` removes the leftovers.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import secrets
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass

from ..devices import SHARED_HOST_ENV
from ..errors import ConfigError, SetupError
from ..types import format_bandwidth, parse_bandwidth
from . import links
from .links import PREFIX, ClusterRecord

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rsh_agent.sh")
MAX_MACHINES = 32
LOCK_PATH = "/run/parallax_nb-netem.lock"


@dataclass(frozen=True)
class Machine:
    """One emulated machine: its namespace (also its hostname for mpirun) and address."""

    index: int
    namespace: str
    address: str
    host_veth: str
    slots: int


class EmulatedCluster:
    """``machines`` namespaces x ``workers_per_machine`` MPI slots, links of ``bandwidth``.

    ``bandwidth``: e.g. ``"1Gbit/s"``, ``"10Gbit/s"`` (bits per second, see
    :func:`parallax_nb.types.parse_bandwidth`), or ``None`` for unshaped links.
    Attributes once entered: ``machines`` (list of :class:`Machine`), ``hostfile`` (path),
    ``subnet`` (CIDR), ``ranks`` (machines x workers_per_machine).
    """

    def __init__(self, machines: int = 2, workers_per_machine: int = 1, bandwidth: "str | float | None" = "1Gbit/s"):
        for name, value in (("machines", machines), ("workers_per_machine", workers_per_machine)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"EmulatedCluster {name} must be a whole number >= 1, got {value!r}")
        if machines > MAX_MACHINES:
            raise ConfigError(f"EmulatedCluster machines={machines} is more than {MAX_MACHINES}",
                              hint="each machine is a network namespace with its own link; use fewer")
        self.num_machines = machines
        self.workers_per_machine = workers_per_machine
        self.bandwidth_bps = None if bandwidth is None else parse_bandwidth(bandwidth)
        self.cluster_id = secrets.token_hex(2)
        self.machines: list[Machine] = []
        self.subnet: str | None = None
        self.bridge = f"{PREFIX}{self.cluster_id}br"
        self._workdir: str | None = None
        self._record: ClusterRecord | None = None
        self._previous_handlers: dict = {}
        self._closed = True

    @classmethod
    def from_spec(cls, spec: str) -> "EmulatedCluster":
        """``"2x2@1Gbit/s"``: MACHINES x WORKERS per machine @ link BANDWIDTH (``"2x2"``: unshaped).
        Nothing is created until :meth:`up`."""
        machines, workers, bandwidth = parse_spec(spec)
        return cls(machines=machines, workers_per_machine=workers, bandwidth=bandwidth)

    # -- public --------------------------------------------------------------------------------

    @property
    def ranks(self) -> int:
        return self.num_machines * self.workers_per_machine

    @property
    def spec(self) -> str:
        """``"2x2@1Gbit/s"``: what :meth:`from_spec` reads."""
        shape = f"{self.num_machines}x{self.workers_per_machine}"
        return shape if self.bandwidth_bps is None else f"{shape}@{self.bandwidth}"

    @property
    def bandwidth(self) -> str:
        return "unshaped" if self.bandwidth_bps is None else format_bandwidth(self.bandwidth_bps)

    @property
    def hostfile(self) -> str:
        self._require_up()
        return os.path.join(self._workdir, "hostfile")

    #: every machine's network interface inside its namespace (the far end of its link)
    interface = "eth0"

    @property
    def gateway(self) -> str:
        """This host's address on the cluster's bridge: where an ipyparallel controller listens
        so that engines on every machine reach it (and nothing else does)."""
        self._require_up()
        return self.subnet.rsplit(".", 1)[0] + ".1"

    def mpirun_args(self) -> list[str]:
        """Arguments for ``mpirun`` (before the program) that place ranks on the namespaces:
        ``--hostfile`` :attr:`hostfile` and :meth:`transport_args`."""
        return ["--hostfile", self.hostfile, *self.transport_args()]

    def transport_args(self) -> list[str]:
        """The ``mpirun`` arguments besides the hostfile: how a real cluster's MPI would be
        told which network to use, plus the rsh agent that reaches the namespaces.

        Ranks fill machines in order (rank r on machine r // workers_per_machine); MPI's
        byte transport and its out-of-band channel use only the cluster's subnet. MPI binds
        no core; every rank is told that all ranks share this host (``PARALLAX_SHARED_HOST``),
        and when they are at least as many as its cores each binds itself to one once Horovod
        has started (:func:`parallax_nb.devices.bind_rank`).

        ``rtc_hwloc_vmhole none``: each machine's ``orted`` otherwise maps a shared-memory copy
        of the hardware topology at an address it picks from its own memory map; two daemons
        on one host doing that at once segfault now and then (Open MPI 4.1, seen about one
        launch in ten), and a daemon dying after ``--daemonize`` leaves mpirun waiting forever.

        ``mpi_yield_when_idle 1``: the machines share this host's cores, so a rank waiting in
        MPI yields its core instead of spinning on it (Open MPI does this by itself only when
        it knows a host is oversubscribed). Measured on 2 x 2 ranks on 2 cores: a chain of
        small alltoalls took 31 ms per collective spinning, 1.4 ms yielding.
        """
        self._require_up()
        return ["--map-by", "slot", "--bind-to", "none",
                "--mca", "plm_rsh_agent", AGENT, "--mca", "plm_rsh_no_tree_spawn", "1",
                "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "oob_tcp_if_include", self.subnet, "--mca", "rtc_hwloc_vmhole", "none",
                "--mca", "mpi_yield_when_idle", "1", "-x", f"{SHARED_HOST_ENV}=1"]

    def counters(self) -> dict[str, tuple[int, int]]:
        """Per machine namespace: (rx_bytes, tx_bytes) its link carried so far (the kernel's count)."""
        self._require_up()
        return {m.namespace: links.interface_counters(m.host_veth)[::-1] for m in self.machines}

    def up(self) -> "EmulatedCluster":
        """Create the namespaces, links and bridge (``with`` does this for you)."""
        links.check_privileges()
        if shutil.which("mpirun") is None:
            raise SetupError("mpirun (Open MPI) is not on PATH", hint="apt-get install openmpi-bin")
        self._closed = False
        self._install_signal_handlers()
        atexit.register(self.down)
        try:
            with open(LOCK_PATH, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._reserve()
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Remove everything this cluster created; safe to call twice."""
        if self._closed:
            return []
        self._closed = True
        held = _hold_signals()   # a second Ctrl-C or SIGTERM may not cut the removal short
        try:
            # the record's objects, the work folder (hostfile) included; none before the record
            removed = links.remove(self._record) if self._record is not None else []
        finally:
            pending = _release_signals(held)
            self._restore_signal_handlers()
            atexit.unregister(self.down)
        for sig in pending:   # what arrived while removing, delivered now that nothing is left
            handler = signal.getsignal(sig)
            if handler in (signal.SIG_DFL, None):   # exit as the held handler would, unwinding the rest
                _raise_system_exit(sig, None)
            if handler is not signal.SIG_IGN:
                signal.raise_signal(sig)
        return removed

    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def __repr__(self) -> str:
        state = "down" if self._closed else f"up on {self.subnet}"
        return (f"EmulatedCluster({self.num_machines} machines x {self.workers_per_machine} workers, "
                f"{self.bandwidth}, {state})")

    # -- construction --------------------------------------------------------------------------

    def _reserve(self) -> None:
        """Pick a free 10.213.K.0/24 and write the record before creating anything."""
        used = links.used_subnets()
        for k in range(1, 255):
            subnet = f"{links.SUBNET_FIRST_OCTETS}.{k}.0/24"
            if subnet not in used:
                break
        else:
            raise SetupError("emulated cluster: no free 10.213.K.0/24 subnet",
                             hint="remove leftovers with `python -m parallax_nb.netem cleanup`")
        self.subnet = subnet
        base = subnet.rsplit(".", 1)[0]
        self.machines = [
            Machine(i, f"{PREFIX}{self.cluster_id}m{i}", f"{base}.{i + 2}", f"{PREFIX}{self.cluster_id}v{i}",
                    self.workers_per_machine)
            for i in range(self.num_machines)
        ]
        self._record = ClusterRecord(self.cluster_id, os.getpid(), self.bridge, subnet,
                                     tuple(m.namespace for m in self.machines),
                                     tuple(m.host_veth for m in self.machines))
        self._record.save()

    def _build(self) -> None:
        run = links.run
        base = self.subnet.rsplit(".", 1)[0]
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{base}.1/24", "dev", self.bridge)  # mpirun's own address
        run("ip", "link", "set", self.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{m.address} {m.namespace}\n" for m in self.machines)
        for m in self.machines:
            peer = f"{PREFIX}{self.cluster_id}p{m.index}"
            run("ip", "netns", "add", m.namespace)
            etc = os.path.join(links.NETNS_ETC, m.namespace)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts)
            run("ip", "link", "add", m.host_veth, "type", "veth", "peer", "name", peer)
            run("ip", "link", "set", peer, "netns", m.namespace)
            run("ip", "link", "set", m.host_veth, "master", self.bridge)
            run("ip", "link", "set", m.host_veth, "up")
            run("ip", "link", "set", "lo", "up", netns=m.namespace)
            run("ip", "link", "set", peer, "name", "eth0", netns=m.namespace)
            run("ip", "addr", "add", f"{m.address}/24", "dev", "eth0", netns=m.namespace)
            run("ip", "link", "set", "eth0", "up", netns=m.namespace)
            if self.bandwidth_bps is not None:
                tbf = links.tbf_args(self.bandwidth_bps)
                run("tc", "qdisc", "replace", "dev", "eth0", "root", *tbf, netns=m.namespace)  # upload
                run("tc", "qdisc", "replace", "dev", m.host_veth, "root", *tbf)  # download
        self._workdir = tempfile.mkdtemp(prefix=f"{PREFIX}{self.cluster_id}-")
        with open(os.path.join(self._workdir, "hostfile"), "w") as f:
            f.writelines(f"{m.namespace} slots={m.slots}\n" for m in self.machines)

    # -- signals -------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP become SystemExit so ``with`` blocks unwind and remove the cluster."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)
            if previous in (signal.SIG_DFL, None):
                self._previous_handlers[sig] = previous
                signal.signal(sig, _raise_system_exit)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous_handlers.items():
            if signal.getsignal(sig) is _raise_system_exit:
                signal.signal(sig, previous or signal.SIG_DFL)
        self._previous_handlers.clear()

    def _require_up(self) -> None:
        if self._closed or self._workdir is None:
            raise SetupError("the emulated cluster is not up",
                             hint="use it inside `with EmulatedCluster(...) as cluster:` or call .up() first")


#: the signals held while a cluster is removed (:func:`_hold_signals`)
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _hold_signals():
    """Hold Ctrl-C, SIGTERM and SIGHUP while a cluster is removed (main thread only; None
    elsewhere): a second one, which a user pressing Ctrl-C twice or ``timeout`` and a shell both
    sending SIGTERM deliver while the first still unwinds, would otherwise raise in the middle
    of the removal and leave namespaces behind. Returns (the handlers, the signals that came)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    came: list[int] = []
    handlers = {sig: signal.getsignal(sig) for sig in _HELD_SIGNALS}
    for sig in _HELD_SIGNALS:
        signal.signal(sig, lambda number, frame: came.append(number))
    return handlers, came


def _release_signals(held) -> list[int]:
    """Put back the handlers :func:`_hold_signals` replaced; the signals that came, once each."""
    if held is None:
        return []
    handlers, came = held
    for sig, handler in handlers.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return list(dict.fromkeys(came))


def parse_spec(spec: str) -> tuple[int, int, "str | None"]:
    """``"2x2@1Gbit/s"`` -> (2, 2, "1Gbit/s"); ``"2x2"`` -> (2, 2, None): unshaped links."""
    shape, _, bandwidth = str(spec).partition("@")
    try:
        machines, workers = (int(x) for x in shape.lower().replace(" ", "").split("x"))
    except ValueError:
        raise ConfigError(f"cannot read the emulated network {spec!r}",
                          hint='write MACHINESxWORKERS@BANDWIDTH, e.g. "2x2@1Gbit/s" (2 machines of 2 engines)') from None
    if bandwidth:
        parse_bandwidth(bandwidth)
    return machines, workers, bandwidth or None


def _raise_system_exit(signum, frame):
    raise SystemExit(128 + signum)
