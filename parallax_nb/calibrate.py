"""``px.calibrate``: measure what one collective call and one step of compute cost on the
user's own ranks, and fit a :class:`~parallax_nb.calibration.Calibration`.

    cal = px.calibrate(np=4, emulate="2x2@1Gbit/s", job="parallax_nb.workloads:lm_tiny")
    cal.to_json("calibration.json")

Where the ranks run, like ``python -m parallax_nb run``: on this host (``np`` ranks over
shared memory), on the hosts of an MPI ``hostfile``, or on an emulated network
(``emulate="MxG@BANDWIDTH"``, :mod:`parallax_nb.netem`, needs root; the namespaces are removed
afterwards, also on failure). Every rank runs :func:`parallax_nb.runtime.calibrate.measure_on_rank`
under ``mpirun`` (:func:`parallax_nb.launch.run_on_ranks`, which leaves no process behind);
this process combines their figures:

* a collective at one size takes the slowest rank's median time per call, and each op and
  scope is fitted as ``latency_s + bytes / (bandwidth_bps / 8)``
  (:func:`~parallax_nb.calibration.fit_collective`). Where every rank had a core of its own
  (on each host, by the kernel's boot id, no more ranks than the cores they could use
  together), a call below 1 MiB takes instead the slowest rank's time in stride, what one
  more call adds to a chain (``call_pricing``, :mod:`parallax_nb.calibration`), at least
  :data:`STRIDE_FLOOR` of the chain's mean;
* ``compute_time_s[job name]`` = the largest per-rank median step time (the step waits for
  the slowest rank); ``baseline_compute_time_s[job name][baseline]`` the same for the Horovod
  baselines' own single-device step (the model as Keras builds it; empty when the model has
  no sparse gradient and they run the runtime's program);
  ``compute_recheck_time_s[job name]`` the same as ``compute_time_s``, timed again at the end;
* ``coordination_bytes_per_s`` / ``coordination_packets_per_s`` = the mean over machines of
  what each machine's link carried per second while Horovod ran idle (0 without a link to
  read: on one host, or on real hosts without ``link_interface``);
* ``busy_coordination_bytes_per_s``: the same while every rank computes (during the job's
  timed steps, or :func:`~parallax_nb.runtime.calibrate.measure_on_rank`'s stand-in load
  without a job);
* ``link_fits``: per op and scope, what each machine's link carried per call (read by local
  rank 0 of every machine around each timed chain of calls, the median over the chains),
  the mean over machines at each size, fitted by :func:`~parallax_nb.calibration.fit_link`;
* ``horovod_env``: the Horovod settings the ranks ran with (rank 0's; every rank gets the same
  environment);
* ``rank_cores``: the most cores any rank could use (one each where ranks share the cores and
  bound themselves: :func:`parallax_nb.devices.bind_rank`).

Measure under the settings of the run to be predicted: the ranks get this process's
environment plus ``env`` (e.g. ``env={"HOROVOD_CYCLE_TIME": "0.1"}`` for a run started with
it), forwarded to the ranks of a hostfile or an emulated network too.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from . import labels
from .calibration import (CALL_PRICING_CHAIN, CALL_PRICING_STRIDE, Calibration, fit_collective, fit_link,
                          horovod_cycle_time_ms)
from .errors import ConfigError, JobError

#: The least share of a chain's mean per call that a call in stride is priced at: two medians
#: of noisy chains can differ by less than a call costs, or by less than nothing.
STRIDE_FLOOR = 0.25


#: a calibration none of whose ranks reported a step for this long is stopped as hung
#: (:func:`~parallax_nb.launch.run_on_ranks`): its longest step, one chain of 3 calls of 4 MiB
#: a rank, takes about 6 s on the emulated 2 x 2 network at 100 Mbit/s (the allgather among
#: all ranks, 1.9-2.0 s a call, 2026-11-29), and the job's tracing and warm-up take seconds.
#: Its whole time is capped by ``timeout_s`` only: 201 s on that network with the CNN, where
#: the 300 s cap before stopped three of six calibrations of the LM and the CNN (one after
#: Open MPI's failed-connection warning, two still under way or hung: the error could not say).
STALL_S = 120.0
#: the cap on a whole calibration, under mpirun and on a cluster's engines
TIMEOUT_S = 1800.0
#: how often the engines of ``calibrate(cluster=...)`` are looked at: their results, their
#: mpiexec's output and their progress reports
ENGINES_POLL_S = 0.5


def calibrate(np: int | None = None, hostfile: str | None = None, emulate: str | None = None, job=None,
              workers_per_machine: int | None = None, link_interface: str | None = None,
              timeout_s: float | None = None, echo: bool = False, env: dict | None = None,
              cluster=None) -> Calibration:
    """Measure this cluster and return its :class:`Calibration` (module docstring).

    ``np``: ranks (default 2; with ``emulate`` the emulated network's machines x ranks).
    ``hostfile``: an MPI hostfile (ranks fill its machines in order). ``emulate``:
    ``"2x2@1Gbit/s"``, an emulated network of 2 machines x 2 ranks (root only).
    ``job``: a :class:`~parallax_nb.job.Job` or ``"module:name"`` whose compute per step is
    measured (none: collectives and coordination only). ``workers_per_machine``: treat
    ranks r // G as one machine (as ``run --workers-per-machine``; default: the hosts).
    ``link_interface``: on real hosts, the network interface whose counters give Horovod's
    idle traffic (the emulated network names its own). ``echo``: copy the ranks' output to
    stderr. ``env``: environment variables for the ranks besides this process's, e.g. the
    run's ``HOROVOD_CYCLE_TIME`` (module docstring). ``cluster``: a started ``px.Cluster``
    whose engines are measured instead (a notebook's engines, e.g.
    ``px.Cluster(emulate="2x2@1Gbit/s")``, whose links are read); then ``np``, ``hostfile``,
    ``emulate`` and ``env`` do not apply. ``timeout_s``: the whole calibration's cap, default
    :data:`TIMEOUT_S`; ranks that report no step for :data:`STALL_S` are stopped sooner, and
    so are ranks :data:`~parallax_nb.launch.CONNECT_GRACE_S` after Open MPI said it could not
    connect two of them (:class:`~parallax_nb.errors.RankConnectionError`). Reports reach this
    process from ranks on this host and on its emulated machines; elsewhere only the cap
    applies. Raises :class:`ConfigError` for bad arguments before anything starts.
    """
    from .launch import _check_np, check_host_resources, run_on_ranks
    from .runtime.calibrate import measure_on_rank

    if cluster is not None:
        return _calibrate_engines(cluster, job, workers_per_machine, link_interface,
                                  TIMEOUT_S if timeout_s is None else timeout_s,
                                  given={"np": np, "hostfile": hostfile, "emulate": emulate, "env": env})
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    network = _network(emulate, hostfile)
    if network is not None:
        if np is not None and _check_np(np) != network.ranks:
            raise ConfigError(f"emulate={emulate!r} has {network.ranks} ranks but np={np}",
                              hint=f"pass np={network.ranks}, or leave np out")
        np = network.ranks
    np = _check_np(2 if np is None else np)
    if hostfile is not None and not os.path.isfile(hostfile):
        raise ConfigError(f"hostfile {hostfile!r} does not exist", hint="write one host per line: 'host slots=N'")
    if workers_per_machine is not None and (isinstance(workers_per_machine, bool)
                                            or not isinstance(workers_per_machine, int)
                                            or workers_per_machine < 1 or np % workers_per_machine):
        raise ConfigError(f"workers_per_machine must be a whole number >= 1 that divides np={np}, "
                          f"got {workers_per_machine!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    env = _check_env(env)
    job_arg = _check_job(job)
    if hostfile is None:
        check_host_resources(np)
    kwargs = dict(job=job_arg, workers_per_machine=workers_per_machine, link_interface=link_interface)
    timeout_hint = _TIMEOUT_HINT + "; echo=True shows the ranks' output as it comes"
    if network is None:
        where = hostfile or "loopback"
        per_rank = run_on_ranks(measure_on_rank, np, kwargs=kwargs, hostfile=hostfile, timeout_s=timeout_s,
                                echo=echo, env=env, timeout_hint=timeout_hint, stall_s=STALL_S)
    else:
        where = f"emulated {network.spec}"
        with network:
            kwargs["link_interface"] = _emulated_link(network, workers_per_machine)
            per_rank = run_on_ranks(measure_on_rank, np, kwargs=kwargs, hostfile=network.hostfile,
                                    mpi_args=network.transport_args(), timeout_s=timeout_s, echo=echo, env=env,
                                    timeout_hint=timeout_hint, stall_s=STALL_S)
    return combine(per_rank, where)


_TIMEOUT_HINT = ("a rank may wait in a collective for a rank that stopped (the ranks' last steps above), or the "
                 "calls (up to 4 MiB a rank) need longer on slow links: give it longer (timeout_s= in Python, "
                 "--timeout on the command line)")


def _emulated_link(network, workers_per_machine: int | None) -> str:
    """The interface an emulated network's ranks read as their link: every machine's own, but
    on one machine whose ranks are each taken as a machine, its loopback, which carries their
    traffic (read as a link per rank, :class:`~parallax_nb.runtime.calibrate._LinkReading`)."""
    from .runtime.calibrate import LOOPBACK_INTERFACE

    return LOOPBACK_INTERFACE if network.num_machines == 1 and workers_per_machine == 1 else network.interface


def _calibrate_engines(cluster, job, workers_per_machine, link_interface, timeout_s: float, given: dict) -> Calibration:
    """:func:`calibrate` on the engines of a started ``px.Cluster`` (each runs
    :func:`~parallax_nb.cluster.engine.measure_on_engine`), combined in rank order."""
    from .cluster.cluster import Cluster

    if not isinstance(cluster, Cluster):
        raise ConfigError(f"calibrate(cluster=...) needs a px.Cluster, got {type(cluster).__name__}",
                          hint="start one with px.Cluster(n=4).start() or %parallax cluster start")
    mixed = [name for name, value in given.items() if value is not None]
    if mixed:
        raise ConfigError(f"calibrate(cluster=...) measures the cluster's running engines; "
                          f"{', '.join(mixed)} do(es) not apply to them",
                          hint="leave them out, or start the cluster with the environment to measure under")
    if not cluster.running:
        raise ConfigError("calibrate(cluster=...) needs a started cluster; this one is not running",
                          hint="call cluster.start() first")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    job_arg = _check_job(job)
    cluster.check_idle("calibrating")
    from .cluster.engine import measure_on_engine

    network = getattr(cluster, "network", None)
    if link_interface is None and network is not None:
        link_interface = _emulated_link(network, workers_per_machine)
    client, ids = cluster.client, cluster.engine_ids
    hosts = {eid: cluster.host_of(eid) for eid in ids}
    progress_dir = tempfile.mkdtemp(prefix="parallax-calibrate-")
    occupant = "calibrating"
    cluster.occupy(occupant)
    try:
        pending = [client[eid].apply_async(measure_on_engine, job_arg, workers_per_machine, link_interface,
                                           progress_dir) for eid in ids]
        failure = _wait_for_engines(cluster, pending, timeout_s, progress_dir)
    except KeyboardInterrupt:
        # stopped from the notebook: the engines would go on calibrating for the rest of it, and
        # the next run or calibration wait behind them
        _restart_after_interrupt(cluster)
        raise
    finally:
        cluster.vacate(occupant)
        shutil.rmtree(progress_dir, ignore_errors=True)
    if failure is not None:
        error, message, hint = failure
        try:
            cluster.restart_engines()
            restarted = "the engines were restarted"
        except Exception as again:   # noqa: BLE001 (the first failure is the one to report)
            restarted = f"restarting the engines failed too ({again}); stop the cluster"
        on = ", ".join(f"rank {rank} on {hosts[eid]}" for rank, eid in enumerate(ids))
        raise error(f"calibrating the cluster's {len(ids)} engines ({on}) failed: {message}; {restarted}",
                    hint=hint) from None
    per_rank = sorted((result.get(0) for result in pending), key=lambda r: r["rank"])
    where = f"emulated {network.spec}" if network is not None else f"{len(ids)} engines of {cluster}"
    return combine(per_rank, where)


def _restart_after_interrupt(cluster) -> None:
    """Restart the engines of a calibration the notebook interrupted (their collectives cannot
    be left half-way by one rank), saying so; a second interrupt leaves them as they are."""
    print("calibration interrupted: restarting the engines (5-10 s) so that they stop calibrating", flush=True)
    try:
        cluster.restart_engines()
    except KeyboardInterrupt:
        print("the engines were not restarted: they finish the calibration by themselves (under a minute)",
              flush=True)
    except Exception as e:   # noqa: BLE001 - the interrupt is what the notebook asked for; report and go on
        print(f"restarting the engines failed ({type(e).__name__}: {e}); stop the cluster", flush=True)


def _wait_for_engines(cluster, pending: list, timeout_s: float, progress_dir: str):
    """Wait until every engine's result of ``pending`` (rank order) is in: None then, else
    ``(error class, message, hint)`` of the first of: a rank's error (the others wait for it
    in a collective), :data:`~parallax_nb.launch.CONNECT_GRACE_S` after Open MPI's
    failed-connection warning in the engines' mpiexec output, no rank's progress report in
    ``progress_dir`` for :data:`STALL_S`, ``timeout_s``."""
    from .errors import DistributedError, RankConnectionError
    from .failures import read_progress
    from .launch import (CONNECT_GRACE_S, CONNECT_HINT, MPI_CONNECT_WARNING, connect_failure_note, connect_stopped,
                         mpi_connect_failure, progress_stalled, progress_text)

    deadline = time.monotonic() + timeout_s
    warned_at, connect = None, None
    before = len(cluster.engine_output(tail=None))   # what mpiexec printed before this calibration
    while True:
        for rank, result in enumerate(pending):
            if result.ready() and not result.successful():
                try:
                    result.get(0)
                except Exception as e:   # the rank's own error, e.g. a RemoteError with its traceback
                    return (DistributedError, f"rank {rank}: {type(e).__name__}: {e}",
                            "the error above is that rank's; the other ranks were stopped")
        if all(result.ready() for result in pending):
            return None
        now = time.monotonic()
        if warned_at is None:
            output = cluster.engine_output(tail=None)[before:]
            if MPI_CONNECT_WARNING in output:
                warned_at, connect = now, mpi_connect_failure(output)
        elif now - warned_at >= CONNECT_GRACE_S:
            return RankConnectionError, connect_stopped(connect), CONNECT_HINT
        reports = read_progress(progress_dir)
        if progress_stalled(reports, STALL_S):
            return (DistributedError, f"they made no progress for {STALL_S:g} s; the ranks' last steps: "
                                      f"{progress_text(reports)}", _TIMEOUT_HINT)
        if now >= deadline:
            note = connect_failure_note(cluster.engine_output(tail=None)[before:])
            return (RankConnectionError if note else DistributedError,
                    f"they did not finish within {timeout_s:g} s{note}; the ranks' last steps: "
                    f"{progress_text(reports)}", _TIMEOUT_HINT)
        time.sleep(min(ENGINES_POLL_S, max(0.0, deadline - now)))


def _network(emulate, hostfile):
    if emulate is None:
        return None
    from .netem import EmulatedCluster

    if hostfile is not None:
        raise ConfigError("give either emulate= (an emulated network makes its own hostfile) or hostfile=, not both")
    network = EmulatedCluster.from_spec(emulate)   # a ConfigError for a spec it cannot read
    return network


def _check_env(env) -> dict:
    """``env`` as ``{str: str}``, or a ConfigError naming the bad entry."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"calibrate(env=...) needs a dict of environment variables, got {type(env).__name__}",
                          hint='pass env={"HOROVOD_CYCLE_TIME": "0.1"}')
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise ConfigError(f"calibrate(env=...) entry {key!r}: {value!r} is not NAME: 'text'",
                              hint='pass env={"HOROVOD_CYCLE_TIME": "0.1"}')
    if horovod_cycle_time_ms(env) is None:
        raise ConfigError(f"HOROVOD_CYCLE_TIME={env['HOROVOD_CYCLE_TIME']!r} is not a number of milliseconds >= 0",
                          hint='pass env={"HOROVOD_CYCLE_TIME": "0.1"}')
    return dict(env)


def _check_job(job):
    """A Job travels to the ranks as it is; a ``module:name`` spec is loaded here first, so a
    wrong one fails before mpirun starts."""
    if job is None:
        return None
    from .job import Job, load_job

    if isinstance(job, str):
        load_job(job)
        return job
    if not isinstance(job, Job):
        raise JobError(f"calibrate(job=...) needs a parallax_nb.Job or 'module:name', got {type(job).__name__}",
                       hint="pass job=px.Job(...) or job='parallax_nb.workloads:lm_tiny'")
    return job


def combine(per_rank: list[dict], where: str) -> Calibration:
    """The Calibration from every rank's :func:`~parallax_nb.runtime.calibrate.measure_on_rank`
    figures (module docstring)."""
    first = per_rank[0]
    in_stride = ranks_have_own_cores(per_rank)
    fits = {}
    for key, points in first["collectives"].items():
        sizes = [b for b, _ in points]
        slowest = [max(r["collectives"][key][i][1] for r in per_rank) for i in range(len(points))]
        if in_stride:
            stride = {size: max(r["stride"][key][i][1] for r in per_rank)
                      for i, (size, _) in enumerate(first["stride"][key])}
            slowest = [max(stride[size], STRIDE_FLOOR * t) if size in stride else t for size, t in zip(sizes, slowest)]
        fits[key] = fit_collective(sizes, slowest)
    link_fits = {}
    if first["machines"] > 1:
        for key in first["collectives"]:
            readings = [r["link_per_call"][key] for r in per_rank if (r.get("link_per_call") or {}).get(key)]
            if readings:
                link_fits[key] = fit_link([(points[0][0], sum(p[1] for p in points) / len(points),
                                            sum(p[2] for p in points) / len(points))
                                           for points in zip(*readings)])
    compute, baseline_compute, recheck = {}, {}, {}
    if first["compute"] is not None:
        model = first["compute"]["model"]
        compute[model] = max(r["compute"]["median_step_s"] for r in per_rank)
        if first.get("compute_recheck_s") is not None:
            recheck[model] = max(r["compute_recheck_s"] for r in per_rank)
        baseline_compute[model] = {key: max(r["compute"]["baselines"][key] for r in per_rank)
                                   for key in first["compute"]["baselines"]}
    several = first["machines"] > 1
    bytes_per_s, packets_per_s = _link_rates([r["link"] for r in per_rank])
    busy_bytes_per_s, _ = _link_rates([r.get("busy_link") for r in per_rank])
    return Calibration(first["machines"], first["workers_per_machine"], fits, compute,
                       coordination_bytes_per_s=bytes_per_s if several else 0.0,
                       coordination_packets_per_s=packets_per_s if several else 0.0,
                       busy_coordination_bytes_per_s=busy_bytes_per_s if several else 0.0,
                       measured=True, where=where, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       horovod_env=first.get("horovod_env", {}), link_fits=link_fits,
                       baseline_compute_time_s=baseline_compute, compute_recheck_time_s=recheck,
                       rank_cores=max((r["rank_cores"] for r in per_rank if r.get("rank_cores")), default=None),
                       call_pricing=CALL_PRICING_STRIDE if in_stride else CALL_PRICING_CHAIN)


def ranks_have_own_cores(per_rank: list[dict]) -> bool:
    """Whether every rank had a core of its own while it was measured: on each host (``host``,
    the kernel's boot id) no more ranks than the cores they could use together (``cores``)."""
    hosts: dict = {}
    for r in per_rank:
        ranks, cores = hosts.setdefault(r["host"], (set(), set()))
        ranks.add(r["rank"])
        cores.update(r["cores"])
    return all(len(ranks) <= len(cores) for ranks, cores in hosts.values())


def _link_rates(readings) -> tuple[float, float]:
    """Mean over the machines' link readings of bytes and packets per second (0 without one)."""
    links = [link for link in readings if link is not None]
    if not links:
        return 0.0, 0.0
    return (sum(link["bytes"] / link["seconds"] for link in links) / len(links),
            sum(link["packets"] / link["seconds"] for link in links) / len(links))


def fits_table(calibration: Calibration) -> str:
    """The fits as a readable table: op, scope, latency, bandwidth, max error, sizes."""
    lines = [f"{'op':<10} {'scope':<8} {'latency':>10} {'bandwidth':>12} {'max error':>9} {'sizes':>5}"]
    if not calibration.fits and calibration.machines * calibration.workers_per_machine == 1:
        lines = ["one rank: no collective to time (a plan for one rank has no communication)"]
    for key, fit in sorted(calibration.fits.items()):
        op, scope = key.split("/")
        lines.append(f"{op:<10} {scope:<8} {fit.latency_s * 1e6:>7.0f} us {_gbits(fit.bandwidth_bps):>12} "
                     f"{100 * fit.max_relative_error:>8.1f}% {fit.samples:>5}")
    for model, seconds in sorted(calibration.compute_time_s.items()):
        lines.append(f"compute of {model}: {seconds * 1e3:.1f} ms per step (slowest rank, all ranks computing)")
        if model in calibration.compute_recheck_time_s:
            drift = calibration.compute_drift(model)
            lines.append(f"  again at the end: {calibration.compute_recheck_time_s[model] * 1e3:.1f} ms per step"
                         + (f"; {drift}" if drift else ""))
        for key, baseline_s in sorted(calibration.baseline_compute_time_s.get(model, {}).items()):
            lines.append(f"  as {labels.text(key)} runs it (the model as Keras builds it): "
                         f"{baseline_s * 1e3:.1f} ms per step")
    settings = ", ".join(f"{k}={v}" for k, v in calibration.horovod_env.items()) or "Horovod's defaults"
    lines.append(f"Horovod cycle time {calibration.horovod_cycle_time_ms:g} ms ({settings})")
    lines.append("calls below 1 MiB priced in stride, what one more adds to a running chain (each rank had a "
                 "core of its own)" if calibration.call_pricing == CALL_PRICING_STRIDE else
                 "calls priced at a short chain's mean per call (ranks shared cores)")
    if calibration.coordination_packets_per_s > 0:
        lines.append(f"Horovod idle, per machine link: {calibration.coordination_bytes_per_s / 1e3:.1f} KB/s, "
                     f"{calibration.coordination_packets_per_s:.0f} packets/s; with every rank computing: "
                     f"{calibration.step_coordination_bytes_per_s / 1e3:.1f} KB/s")
    elif calibration.machines > 1:
        lines.append("Horovod idle, per machine link: not measured (no link counters to read: one host, or "
                     "real hosts without --link-interface)")
    if calibration.link_fits:
        lines.append(f"per machine link, per call, by op and scope (the payload each carries framed at its "
                     f"own factor; x{calibration.payload_framing_factor:.3f}, the median, for payload of no call):")
        for key, fit in sorted(calibration.link_fits.items()):
            op, _, scope = key.partition("/")
            framing = "" if scope == "machine" else f" (payload x{calibration.link_framing(op, scope):.3f})"
            lines.append(f"  {key:<18} {fit.overhead_bytes / 1e3:>7.2f} KB per call, "
                         f"{fit.bytes_per_handed_byte:.3f} link bytes per byte handed{framing}")
    return "\n".join(lines)


def _gbits(bandwidth_bps: float) -> str:
    return f"{bandwidth_bps / 1e9:.3g} Gbit/s"
