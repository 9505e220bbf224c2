"""Cluster: an ipyparallel controller plus engines that are MPI ranks of one ``mpiexec``.

On a laptop or one host (the default)::

    cluster = Cluster(n=2)        # controller on 127.0.0.1, 2 engines = MPI ranks 0 and 1
    cluster.start()               # ~7-10 s; idempotent: a running cluster is reused
    cluster.status()              # engines, ids, ranks, hosts, alive
    cluster.stop()                # controller, engines and mpiexec gone

On real hosts, two routes:

1. An MPI hostfile: ``Cluster(n=8, hostfile="hosts.txt", ip="0.0.0.0", location="10.0.0.5")``
   starts ``mpiexec --hostfile hosts.txt`` for the engines; the controller listens on every
   interface of this host and tells engines to reach it at ``location`` (an address of this
   host the others can route to). Every host needs the same Python environment at the same
   path, passwordless ssh for mpiexec, and this package importable (Open MPI forwards
   ``PYTHONPATH`` and the controller's connection info with ``-x``).
2. An ipyparallel profile: ``Cluster(n=8, profile="mycluster")`` loads
   ``~/.ipython/profile_mycluster/ipcluster_config.py``, where any launcher ipyparallel
   supports can be configured (``c.MPIEngineSetLauncher.mpi_args = ["--hostfile", ...]``,
   ``c.Cluster.controller_ip``, Slurm/PBS launchers, ...). Engines must still be MPI ranks.

Security (issue 9): the controller listens on loopback unless ``ip`` says otherwise;
the profile's ``security`` folder is made private (0700) and every connection and cluster
file in it readable by the owner only (0600). Without a named profile, each Cluster uses a
fresh private profile folder (0700, from ``tempfile.mkdtemp``) removed by :meth:`stop`.
Messages between notebook, controller and engines are signed with the cluster's session
key (HMAC), so pickled data is only accepted from this session's own cluster.

No orphans: ipyparallel stops everything at a normal exit; a small reaper process
(``reaper.py``) also kills the controller, ``mpiexec`` and engines if the notebook process is
killed without stopping the cluster.
"""
from __future__ import annotations

import glob
import ipaddress
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import progress
from ..devices import yield_when_idle_args
from ..errors import ConfigError, SetupError
from .engine import LINK_INTERFACE_ENV
from .handle import Run

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

#: One host: ``mpiexec``'s out-of-band channel advertises and connects over loopback only. Its
#: listener still binds the wildcard address: Open MPI 4.1 has no parameter for the bind
#: address (README, "Listening sockets"). The ranks' bytes go through shared memory
#: (``btl self,vader``); PMIx's TCP listener is loopback-only by default.
LOOPBACK_ONLY = ["--mca", "oob_tcp_if_include", "lo"]


@dataclass(frozen=True)
class EngineInfo:
    """One engine: its ipyparallel id, MPI rank, host and process id."""

    engine_id: int
    rank: int
    host: str
    pid: int


@dataclass(frozen=True)
class ClusterStatus:
    """What :meth:`Cluster.status` reports."""

    running: bool
    engines_requested: int
    engines: tuple[EngineInfo, ...] = ()
    controller_ip: str = ""
    profile_dir: str = ""
    alive: bool = False

    @property
    def ids(self) -> list[int]:
        return [e.engine_id for e in self.engines]

    @property
    def ranks(self) -> list[int]:
        return [e.rank for e in self.engines]

    @property
    def hosts(self) -> list[str]:
        return sorted({e.host for e in self.engines})

    def __str__(self) -> str:
        if not self.running:
            return "cluster: stopped"
        state = "alive" if self.alive else "NOT all engines alive"
        return (f"cluster: {len(self.engines)}/{self.engines_requested} engines {state}, controller on "
                f"{self.controller_ip}, ranks {self.ranks} (engine ids {self.ids}) on {', '.join(self.hosts) or '-'}")


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def _mpi_flavour() -> str:
    """"openmpi", "mpich" or "" from ``mpiexec --version``."""
    exe = shutil.which("mpiexec")
    if exe is None:
        raise SetupError("mpiexec not found: engines are MPI ranks and need an MPI installation",
                         hint="install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and mpi4py")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return "openmpi" if "Open MPI" in out or "OpenRTE" in out else ("mpich" if "HYDRA" in out else "")


def _descendants(pids: list[int]) -> list:
    """psutil Processes of ``pids`` and all their descendants (collected before stopping)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.extend([p, *p.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
    return procs


def _terminate(procs: list, grace_s: float) -> None:
    """Wait up to ``grace_s`` for ``procs`` to exit, then SIGTERM, then SIGKILL what is left."""
    import psutil

    if not procs:
        return
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for sig in ("terminate", "kill"):
        for p in alive:
            try:
                getattr(p, sig)()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=3)
        if not alive:
            return


def make_private(profile_dir: str) -> list[str]:
    """chmod the profile's security folder 0700 and its files 0600; return the files."""
    security = os.path.join(profile_dir, "security")
    os.makedirs(security, exist_ok=True)
    os.chmod(security, stat.S_IRWXU)
    files = sorted(glob.glob(os.path.join(security, "*.json")))
    for path in files:
        try:
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        except FileNotFoundError:
            pass
    return files


class Cluster:
    """An ipyparallel cluster whose ``n`` engines are the MPI ranks of one ``mpiexec``.

    n:          engines (= MPI ranks = workers).
    profile:    an ipyparallel profile name whose ``ipcluster_config.py`` configures launchers
                for real hosts; None uses a private temporary profile.
    hostfile:   an MPI hostfile naming real hosts (passed to ``mpiexec --hostfile``).
    ip:         the interface the controller listens on; loopback by default. Engines on
                other hosts need ``ip="0.0.0.0"`` (or this host's address) and ``location``.
    location:   the address engines use to reach the controller when ``ip`` is 0.0.0.0.
    mpi_args:   extra ``mpiexec`` arguments.
    engine_timeout_s: how long :meth:`start` waits for engines to register.
    emulate:    ``"2x2@1Gbit/s"``: run the engines on an emulated network of 2 machines x 2
                engines (network namespaces on shaped links, :mod:`parallax_nb.netem`; root only),
                through the real-hosts path: its hostfile, mpiexec with its rsh agent, and the
                controller on this host's address on the cluster's bridge.
    """

    def __init__(self, n: int | None = None, profile: str | None = None, hostfile: str | None = None,
                 ip: str = "127.0.0.1", location: str | None = None, mpi_args: tuple[str, ...] = (),
                 engine_timeout_s: float = 120.0, emulate: str | None = None):
        network = None
        if emulate is not None:
            from ..netem import EmulatedCluster

            network = EmulatedCluster.from_spec(emulate)
            if n is not None and n != network.ranks:
                raise ConfigError(f"emulate={emulate!r} has {network.ranks} engines but n={n}",
                                  hint=f"leave n out or pass n={network.ranks}")
            if hostfile is not None or profile is not None or location is not None:
                raise ConfigError("emulate= makes its own hostfile and controller address",
                                  hint="pass emulate= alone, or hostfile=/profile= for real hosts")
            n = network.ranks
        n = 2 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"a cluster needs a whole number of engines >= 1, got {n!r}",
                              hint="e.g. Cluster(n=2)")
        if hostfile is not None and not os.path.isfile(hostfile):
            raise ConfigError(f"MPI hostfile not found: {hostfile!r}",
                              hint="write one host per line, e.g. 'node1 slots=4'")
        if hostfile is not None and _is_loopback(ip):
            raise ConfigError(f"engines on the hosts of {hostfile!r} cannot reach a controller on loopback ({ip})",
                              hint="pass ip='0.0.0.0' and location='<this host's address>'")
        self.n = n
        self.profile = profile
        self.hostfile = hostfile
        self.ip = ip
        self.location = location
        self.mpi_args = tuple(mpi_args)
        self.engine_timeout_s = float(engine_timeout_s)
        self._ipp = None           # ipyparallel.Cluster
        self._client = None
        self._private_dir: str | None = None
        self._engines: tuple[EngineInfo, ...] = ()
        # start, restart, stop and status one at a time: a run's watcher thread restarts the
        # engines after a failure while the notebook may already start the next run
        self._lock = threading.RLock()
        self._reaper: subprocess.Popen | None = None
        self.start_time_s: float | None = None
        self.network = network     # an EmulatedCluster (emulate=): its machines host the engines
        #: what this notebook has the engines doing (:meth:`occupy`): a Run, or a text such as
        #: "calibrating", with the time it began; None when nothing
        self._occupant: tuple[object, float] | None = None

    # ----- life cycle --------------------------------------------------------------------------
    def _profile_kwargs(self) -> dict:
        if self._private_dir is None or not os.path.isdir(self._private_dir):
            self._private_dir = tempfile.mkdtemp(prefix="parallax_nb-cluster-")  # mode 0700
        if self.profile:
            return dict(profile=self.profile)
        return dict(profile_dir=self._private_dir)

    @property
    def _pidfile(self) -> str | None:
        return os.path.join(self._private_dir, "reaper-pids.json") if self._private_dir else None

    def _process_ids(self) -> list[int]:
        return [p for p in [self.controller_pid(), *self.mpiexec_pids(), *(e.pid for e in self._engines)] if p]

    def _arm_reaper(self) -> None:
        """Record this cluster's pids and make sure a reaper watches this process (see reaper.py)."""
        import json

        from ..jsonfile import atomic_write_text

        atomic_write_text(self._pidfile, json.dumps(self._process_ids()))
        if self._reaper is None or self._reaper.poll() is not None:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p))
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "parallax_nb.cluster.reaper", str(os.getpid()), self._pidfile,
                 self._private_dir], env=env, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _disarm_reaper(self) -> None:
        if self._pidfile and os.path.exists(self._pidfile):
            os.remove(self._pidfile)
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=3 * 1.0 + 2)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None

    def _engine_mpi_args(self) -> list[str]:
        flavour = _mpi_flavour()
        args: list[str] = []
        if flavour == "openmpi":
            if self.hostfile is None:
                # a laptop may have fewer cores than engines; ranks talk through shared memory,
                # and mpiexec talks to its ranks over loopback (see LOOPBACK_ONLY)
                args += ["--bind-to", "none", "--oversubscribe", "--mca", "btl", "self,vader", *LOOPBACK_ONLY,
                         *yield_when_idle_args(self.n)]   # engines that share the cores wait without spinning
            else:
                forwarded = ["PYTHONPATH", "IPP_CONNECTION_INFO", "PATH", *self._engine_environment()]
                args += [a for name in dict.fromkeys(forwarded) for a in ("-x", name)]
                args += self.network.transport_args() if self.network is not None else ["--bind-to", "none"]
        if self.hostfile is not None:
            args += ["--hostfile", self.hostfile] if flavour != "mpich" else ["-f", self.hostfile]
        return args + list(self.mpi_args)

    def _engine_environment(self) -> dict:
        env = {"PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p),
               "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        if hasattr(os, "geteuid") and os.geteuid() == 0:   # Open MPI refuses root without these
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if self.network is not None:   # each engine reads its machine's link counters per step
            env[LINK_INTERFACE_ENV] = self.network.interface
        return env

    def _new_ipp_cluster(self):
        import ipyparallel as ipp
        from traitlets.config import Config

        config = Config()
        config.MPIEngineSetLauncher.mpi_args = self._engine_mpi_args()
        config.MPIEngineSetLauncher.environment = self._engine_environment()
        kwargs = dict(engines="mpi", n=self.n, controller_ip=self.ip, log_level=40, config=config,
                      engine_timeout=int(self.engine_timeout_s), **self._profile_kwargs())
        if self.location:
            kwargs["controller_location"] = self.location
        return ipp.Cluster(**kwargs)

    def start(self) -> "Cluster":
        """Start the controller and engines, or reuse them if they are running and alive.

        If the controller runs but engines died or are missing, the engines are restarted.
        Raises :class:`SetupError` naming the cause when engines do not register in time.
        """
        with self._lock:
            if self.running and self.alive():
                return self
            with progress.task("cluster", f"starting a cluster of {self.n} MPI engines"):
                return self._start()

    def _start(self) -> "Cluster":
        t0 = time.monotonic()
        if self._ipp is not None and self._ipp.controller is not None and self._client is not None:
            self._restart_engines()
        else:
            self.stop()
            try:
                if self.network is not None:
                    progress.phase("cluster", f"building the emulated network ({self.network})", done=0, total=self.n)
                    self.network.up()
                    self.hostfile = self.network.hostfile
                    self.ip = self.location = self.network.gateway
                self._ipp = self._new_ipp_cluster()
                progress.phase("cluster", "starting the controller", done=0, total=self.n)
                self._ipp.start_controller_sync()
                make_private(self._ipp.profile_dir)
                progress.phase("cluster", f"starting {self.n} engines (mpiexec)", done=0, total=self.n)
                self._ipp.start_engines_sync(self.n)
                self._client = self._ipp.connect_client_sync()
                self._wait_for_engines()
            except BaseException as e:
                output = self.engine_output()
                self.stop()
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise SetupError(f"the cluster of {self.n} MPI engines did not start: {type(e).__name__}: {e}",
                                 hint="check that mpiexec and mpi4py work: "
                                      "mpiexec -n 2 python -c 'from mpi4py import MPI'"
                                      + (f"\nengine output:\n{output}" if output else "")) from None
        make_private(self._ipp.profile_dir)
        self._arm_reaper()
        self.start_time_s = time.monotonic() - t0
        return self

    def engine_output(self, tail: int | None = 2000) -> str:
        """What the engines' mpiexec has printed so far (its last ``tail`` characters; None:
        all), "" when it cannot be read. Read from the launcher's output file each time:
        ipyparallel's ``get_output`` keeps its first reading."""
        texts = []
        for es in (self._ipp.engines.values() if self._ipp is not None else ()):
            try:
                path = getattr(es, "output_file", None)
                if path:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        text = f.read()
                else:
                    text = es.get_output(remove=False)
            except Exception:   # noqa: BLE001 (a launcher that is gone: nothing to read)
                continue
            texts.append(text[-tail:] if tail else text)
        return "\n".join(texts)

    def _wait_for_engines(self, old_pids: frozenset = frozenset()) -> None:
        """Wait until ``n`` engines whose pids are not in ``old_pids`` answer; learn their ranks.

        Engine ids are not proof of freshness: a dead engine may stay registered until its
        heartbeats time out. So every registered engine is asked who it is (rank, host, pid)
        and only new processes count.
        """
        from .engine import engine_identity

        deadline = time.monotonic() + self.engine_timeout_s
        asked: dict = {}
        fresh: dict[int, EngineInfo] = {}
        announced = -1
        while True:
            for engine_id in self._client.ids:
                if engine_id not in asked and engine_id not in fresh:
                    asked[engine_id] = self._client[engine_id].apply_async(engine_identity)
            for engine_id, ar in list(asked.items()):
                if ar.ready():
                    del asked[engine_id]
                    try:
                        d = ar.get(0)
                    except Exception:
                        continue
                    if d["pid"] not in old_pids:
                        fresh[engine_id] = EngineInfo(engine_id=engine_id, rank=d["rank"], host=d["host"],
                                                      pid=d["pid"])
            if len(fresh) != announced:
                announced = len(fresh)
                progress.phase("cluster", f"engines {announced} of {self.n} ready", done=announced, total=self.n)
            if len(fresh) >= self.n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(fresh)} of {self.n} engines registered and answered "
                                   f"within {self.engine_timeout_s:g} s")
            if self._ipp.engines and not any(es.running for es in self._ipp.engines.values()):
                raise RuntimeError("mpiexec exited before the engines registered")
            time.sleep(0.1)
        self._engines = tuple(sorted(fresh.values(), key=lambda e: e.rank))[: self.n]
        ranks = [e.rank for e in self._engines]
        if ranks != list(range(self.n)):
            raise SetupError(f"engines are not one MPI world: ranks {ranks}, expected 0..{self.n - 1}",
                             hint="mpi4py may be built against another MPI than mpiexec")

    def _restart_engines(self) -> None:
        """Stop the engines' mpiexec (killing stuck ranks) and start a fresh set of engines."""
        old_pids = frozenset(e.pid for e in self._engines)
        progress.phase("cluster", f"restarting {self.n} engines", done=0, total=self.n)
        self._ipp.stop_engines_sync()
        _terminate(_descendants(list(old_pids)), grace_s=3.0)   # ranks stuck in a collective
        self._engines = ()
        # Engines started by mpiexec ask for their rank as engine id. A replaced engine's
        # unregistration (sent by its nanny once the process ended) names only that id, so one
        # that arrives after a new engine took the same id unregisters the new engine and fails
        # its task. Replacements ask for no id: the controller numbers them past every id it gave.
        self._ipp.config.MPIEngineSetLauncher.engine_args = ["--IPEngine.id=None"]
        self._ipp.start_engines_sync(self.n)
        self._wait_for_engines(old_pids)
        make_private(self._ipp.profile_dir)
        self._arm_reaper()

    def restart_engines(self) -> "Cluster":
        """Kill every engine (also ranks stuck in a collective) and start new ones; ~5-10 s."""
        with self._lock:
            if self._ipp is None or self._ipp.controller is None:
                return self.start()
            self._restart_engines()
            return self

    def stop(self) -> None:
        """Stop engines, mpiexec and controller; remove the private profile folder.

        Whatever is still running 5 s after ipyparallel's own shutdown (an engine stuck in a
        collective, a nanny) is killed, so no process outlives the cluster.
        """
        with self._lock:
            if self._ipp is None:
                return self._stop()
            with progress.task("cluster", f"stopping the cluster of {self.n} MPI engines"):
                progress.phase("cluster", "stopping the engines and the controller")
                self._stop()

    def _stop(self) -> None:
        leftovers = _descendants(self._process_ids()) if self._ipp is not None else []
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None
        if self._ipp is not None:
            try:
                self._ipp.stop_cluster_sync()
            except Exception:
                pass
            self._ipp = None
        if leftovers:
            progress.phase("cluster", "ending leftover processes")
        _terminate(leftovers, grace_s=5.0)
        self._engines = ()
        if self.network is not None:   # also ends what still runs inside its machines
            self.network.down()
            self.hostfile, self.ip, self.location = None, "127.0.0.1", None
        self._disarm_reaper()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    # ----- one task at a time ------------------------------------------------------------------
    def occupy(self, occupant) -> None:
        """Mark the engines as doing ``occupant``'s work (a :class:`~parallax_nb.cluster.handle.Run`,
        free again once it is done; or a text such as ``"calibrating"``, free at :meth:`vacate`).
        :meth:`check_idle` names it to whoever asks for the engines meanwhile."""
        self._occupant = (occupant, time.monotonic())

    def vacate(self, occupant) -> None:
        """End :meth:`occupy` of ``occupant`` (nothing when another took the engines since)."""
        if self._occupant is not None and self._occupant[0] is occupant:
            self._occupant = None

    def pending_tasks(self) -> dict[int, int]:
        """``{engine id: tasks sent to it and not finished}`` of this cluster's engines that have
        any, as the controller counts them, less the tasks this notebook sent and already has the
        answer to: the controller counts a task done a moment after its result arrived (and may
        miss it when busy), and a finished run's results are dropped from the Client's memory.
        {} when the controller cannot be asked."""
        ids = self.engine_ids
        if not self.running or not ids:
            return {}
        client = self._client
        try:
            status = client.queue_status(targets=ids, verbose=True)
        except Exception:   # noqa: BLE001 - a controller that does not answer is start()'s to report
            return {}
        answered = set(client.history).difference(client.outstanding)
        pending = {}
        for eid in ids:
            queued = status.get(eid, {})
            unfinished = [m for m in (*queued.get("queue", ()), *queued.get("tasks", ())) if m not in answered]
            if unfinished:
                pending[eid] = len(unfinished)
        return pending

    def check_idle(self, purpose: str) -> None:
        """A ConfigError before ``purpose`` (e.g. "calibrating") while the engines are busy: a run
        of this notebook still training, a calibration under way, or tasks sent to them and not
        finished (an interrupted calibration's, another notebook's). Work sent to busy engines
        would wait behind it unseen; nothing is sent here."""
        occupant = self._occupant
        if occupant is not None:
            what, since = occupant
            if isinstance(what, Run):
                if not what.done:
                    name = getattr(what.job, "name", "a job")
                    raise ConfigError(
                        f"the cluster's engines are still training {name} ({what.status}, {what.steps_done} of "
                        f"{what.steps} steps); {purpose} now would wait behind that run",
                        hint="wait for it (run.wait()) or stop it (run.stop()) first")
            else:
                raise ConfigError(f"the cluster's engines are busy {what} (for {time.monotonic() - since:.0f} s); "
                                  f"{purpose} now would wait behind it",
                                  hint="wait until it has finished, or restart the engines "
                                       "(cluster.restart_engines())")
        pending = self.pending_tasks()
        if pending:
            listed = ", ".join(f"rank {e.rank} (engine {e.engine_id}): {pending[e.engine_id]}"
                               for e in sorted(self._engines, key=lambda e: e.rank) if e.engine_id in pending)
            raise ConfigError(f"the cluster's engines have tasks that have not finished ({listed}); "
                              f"{purpose} now would wait behind them",
                              hint="an interrupted calibration or run finishes or stops by itself within about "
                                   "a minute; otherwise restart the engines (cluster.restart_engines())")

    # ----- state -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._ipp is not None and self._client is not None and self._ipp.controller is not None

    @property
    def client(self):
        """The ipyparallel Client connected to the controller (starts the cluster if needed)."""
        if not self.running:
            self.start()
        return self._client

    @property
    def engines(self) -> tuple[EngineInfo, ...]:
        return self._engines

    @property
    def engine_ids(self) -> list[int]:
        """Engine ids in rank order (engine_ids[r] runs rank r)."""
        return [e.engine_id for e in self._engines]

    def host_of(self, engine_id: int) -> str:
        for e in self._engines:
            if e.engine_id == engine_id:
                return e.host
        return "?"

    def engine_process_alive(self, engine_id: int) -> bool | None:
        """Whether the process of engine ``engine_id`` still runs (a zombie has ended): known
        for engines of this machine and of its emulated machines, whose processes are this
        machine's; None for engines of a hostfile's hosts and for an engine not of this set."""
        import psutil

        if self.hostfile is not None and self.network is None:
            return None
        for e in self._engines:
            if e.engine_id == engine_id:
                try:
                    return psutil.Process(e.pid).status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    return False
        return None

    def alive(self) -> bool:
        """True when the controller runs and every engine of the current set is registered."""
        if not self.running or len(self._engines) != self.n:
            return False
        registered = set(self._client.ids)
        return all(e.engine_id in registered for e in self._engines) and all(
            es.running for es in self._ipp.engines.values()) and bool(self._ipp.engines)

    def mpiexec_exited(self) -> bool:
        """True when the engines' ``mpiexec`` has ended (e.g. it ended every rank because one
        died): their tasks will never return, whatever the controller still believes."""
        return self._ipp is not None and bool(self._ipp.engines) and not any(
            es.running for es in self._ipp.engines.values())

    @property
    def profile_dir(self) -> str | None:
        return self._ipp.profile_dir if self._ipp is not None else None

    def connection_files(self) -> list[str]:
        """The controller's connection and cluster files (they hold the session key)."""
        if self._ipp is None:
            return []
        return sorted(glob.glob(os.path.join(self._ipp.profile_dir, "security", "*.json")))

    def controller_pid(self) -> int | None:
        try:
            return int(self._ipp.controller.process.pid)
        except Exception:
            return None

    def mpiexec_pids(self) -> list[int]:
        pids = []
        for es in (self._ipp.engines.values() if self._ipp is not None else []):
            try:
                pids.append(int(es.process.pid))
            except Exception:
                pass
        return pids

    def status(self) -> ClusterStatus:
        """Engines, their ids, ranks and hosts, and whether all are alive (after a restart under way)."""
        with self._lock:
            if not self.running:
                return ClusterStatus(running=False, engines_requested=self.n, controller_ip=self.ip)
            return ClusterStatus(running=True, engines_requested=self.n, engines=self._engines,
                                 controller_ip=self.ip, profile_dir=self._ipp.profile_dir, alive=self.alive())

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Cluster n={self.n} ip={self.ip}: {self.status()}>"


_default: Cluster | None = None


def default_cluster(n: int | None = None, start: bool = True, emulate: str | None = None) -> Cluster:
    """The notebook's shared cluster: reused by every run with the same engine count.

    A different ``n`` stops the old cluster and starts one of the new size; ``emulate``
    (``"2x2@1Gbit/s"``, see :class:`Cluster`) makes it one on an emulated network, and a
    different ``emulate`` replaces it.
    """
    global _default
    wanted = Cluster(n=n, emulate=emulate) if emulate is not None else None   # checks the arguments first
    if _default is not None and ((n is not None and _default.n != n) or (
            emulate is not None and getattr(_default.network, "spec", None) != wanted.network.spec)):
        _default.stop()
        _default = None
    if _default is None:
        _default = wanted or Cluster(n=n or 2)
    if start:
        _default.start()
    return _default


def stop_default_cluster() -> None:
    global _default
    if _default is not None:
        _default.stop()
        _default = None


def current_default_cluster() -> Cluster | None:
    """The shared cluster if one was created (running or not), without starting anything."""
    return _default
