"""Dispatch: ship a Job and a Plan to the engines, train there, stream progress back, stop.

:func:`run` submits :func:`parallax_nb.cluster.engine.train_on_engine` to every engine (one
task per MPI rank) and returns a :class:`~parallax_nb.cluster.handle.Run` at once; a watcher
thread (:class:`RunController`) then polls, every ``poll_s`` seconds:

- the step records each engine published (ipyparallel ``publish_data``, merged by the
  Client's IO thread into the task metadata) -> ``Run.add_records``;
- which tasks finished, and with what -> ``Run.finish`` or ``Run.fail``.

Stopping is cooperative first, forceful second, all inside 30 s:

1. ``stop()`` sends ``SIGUSR1`` to every engine through ipyparallel's nanny (works while an
   engine is busy). The engines agree on the step to stop at (``engine.StopFlag``) and
   return normally; typical latency is one step.
2. If they have not returned after ``stop_grace_s`` (default 15 s: e.g. a rank stuck in a
   collective or in a long step), the engines are killed and restarted (new ``mpiexec``);
   the run is marked stopped and the cluster stays usable.

A failure is handled the same way: when one rank raised, the others are usually blocked in
a collective waiting for it; after ``failure_grace_s`` the engines are restarted and the
run fails with a :class:`DistributedError` naming the rank, engine and host of the first
error, with that rank's remote traceback.
"""
from __future__ import annotations

import re
import shutil
import threading
import time
import traceback
from typing import Any, Callable

from .. import progress
from ..errors import ConfigError, DistributedError
from ..launch import make_workdir
from .cluster import Cluster, default_cluster
from .engine import RECORD_KEY_PREFIX, STATUS_KEY, STOP_SIGNAL, train_on_engine
from .handle import FAILED, RUNNING, STOPPING, Run

STOP_GRACE_S = 15.0
FAILURE_GRACE_S = 10.0
#: A run's folder for its ranks' error reports: ``<prefix><notebook's process id>-<random>``
#: (:func:`~parallax_nb.launch.make_workdir`: a killed kernel's is removed by its next run).
ERROR_DIR_PREFIX = "parallax_nb-run-errors-"
OUTPUT_WAIT_S = 2.0      # at most this long for an engine's last published data after its result
_last_run: Run | None = None


def last_run() -> Run | None:
    """The most recent run started in this process (kept even if ``run(...)`` raised)."""
    return _last_run


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


class RunController:
    """Watches the engines' tasks of one Run and carries out stop and abort requests."""

    def __init__(self, run: Run, cluster: Cluster, async_results: list, engine_ids: list[int],
                 poll_s: float = 0.1, stop_grace_s: float = STOP_GRACE_S, failure_grace_s: float = FAILURE_GRACE_S):
        self.run = run
        self.cluster = cluster
        self.async_results = async_results     # one per rank, rank order
        self.engine_ids = engine_ids
        self.hosts = [cluster.host_of(eid) for eid in engine_ids]   # before any restart renumbers them
        self.poll_s = poll_s
        self.stop_grace_s = stop_grace_s
        self.failure_grace_s = failure_grace_s
        self.error_dir: str | None = None   # where ranks that give up write error-<rank>.txt
        self._seen_keys: list[set] = [set() for _ in async_results]
        self._engine_phase: str | None = None
        self._first_error: tuple[float, int, BaseException] | None = None
        self._mpi_output = ""      # mpiexec's output, read before engines are restarted
        self._abort_reason: str | None = None
        self._stop_event = threading.Event()
        self.stop_latency_s: float | None = None
        self.restarted_engines = False
        self.thread = threading.Thread(target=self._watch, name="parallax_nb-run-watcher", daemon=True)

    # ----- requests from the notebook thread ---------------------------------------------------
    def request_stop(self) -> None:
        """Ask every engine to stop after the current step (returns at once)."""
        if self.run.done or self.run.stop_requested_at is not None:
            return
        self.run.stop_requested_at = time.monotonic()
        self.run.set_status(STOPPING, "stopping: engines finish their current step")
        try:
            self.cluster.client.send_signal(int(STOP_SIGNAL), targets=self.engine_ids, block=False)
        except Exception as e:   # the watcher escalates to an abort after stop_grace_s
            self.run.message = f"stopping (signal failed: {e}); engines will be restarted"

    def abort(self, reason: str) -> None:
        """Kill and restart the engines now (used when they do not stop by themselves)."""
        self._abort_reason = reason
        self._stop_event.set()

    # ----- the watcher thread ------------------------------------------------------------------
    def _collect_records(self) -> None:
        for rank, ar in enumerate(self.async_results):
            try:
                # the AsyncResult's own copy: the Client drops its copy of a task's metadata
                # once the task's output is complete, which can be before the last poll here
                metadata = ar.metadata
                data = (metadata[0] if isinstance(metadata, list) else metadata)["data"]
            except Exception:
                continue
            status = data.get(STATUS_KEY) if rank == 0 else None
            if status and status.get("text") != self._engine_phase:   # rank 0's latest phase
                self._engine_phase = status.get("text")
                self.run.set_phase(self._engine_phase)
            new = [k for k in list(data) if k.startswith(RECORD_KEY_PREFIX) and k not in self._seen_keys[rank]]
            if not new:
                continue
            new.sort()
            self._seen_keys[rank].update(new)
            self.run.add_records([data[k] for k in new], rank=rank)

    def _check_failures(self) -> None:
        """The failure to report, of the tasks that failed so far: the one its engine finished
        first (then the lowest rank), unless that one names another failed rank as its cause
        (an asynchronous peer that stopped because a rank aborted,
        :func:`~parallax_nb.failures.failed_peer`): then that rank's own. Both can end
        within one poll, in either order. The time the first failure was seen is kept."""
        from ..failures import failed_peer

        failed = {}
        for rank, ar in enumerate(self.async_results):
            if ar.ready():
                try:
                    ar.get(0)
                except Exception as e:
                    failed[rank] = (_completed_s(ar), rank, e)
        if not failed:
            return
        _, rank, exc = min(failed.values(), key=lambda f: (f[0], f[1]))
        cause = failed_peer(str(getattr(exc, "evalue", exc)))
        if cause in failed:
            _, rank, exc = failed[cause]
        seen = self._first_error[0] if self._first_error is not None else time.monotonic()
        self._first_error = (seen, rank, exc)

    def _error_for(self, rank: int, exc: BaseException, others_restarted: bool) -> DistributedError:
        engine_id, host = self.engine_ids[rank], self.hosts[rank]
        ename = getattr(exc, "ename", type(exc).__name__)
        evalue = getattr(exc, "evalue", str(exc))
        remote_tb = "\n".join(getattr(exc, "traceback", None) or []) if isinstance(
            getattr(exc, "traceback", None), list) else (getattr(exc, "traceback", None) or "")
        if not remote_tb and not hasattr(exc, "ename"):
            remote_tb = "".join(traceback.format_exception(exc))
        message = f"rank {rank} (engine {engine_id} on host {host}) failed: {ename}: {evalue}"
        if ename == "EngineError":
            output = self._mpi_output or self.cluster.engine_output()
            culprit = self._error_file_report() or _rank_report(output) or _mpi_exit_culprit(output)
            if culprit is not None:
                rank, how = culprit
                engine_id, host = self.engine_ids[rank], self.hosts[rank]
                message = (f"rank {rank} (engine {engine_id} on host {host}) died while training ({how}); "
                           "mpiexec then ended the other ranks")
            else:
                message = f"rank {rank} (engine {engine_id} on host {host}) " + _lost_engine(
                    self.cluster.engine_process_alive(engine_id))
        hint = ("the other ranks are stopped and the engines restarted; the next run waits for them"
                if others_restarted else "fix the cause above and run again")
        err = DistributedError(message, hint=hint)
        err.rank, err.engine_id, err.host, err.remote_traceback = rank, engine_id, host, remote_tb
        err.ename, err.evalue = ename, evalue
        return err

    def _restart_engines(self) -> None:
        self._mpi_output = self._mpi_output or self.cluster.engine_output()
        try:
            self.cluster.restart_engines()
            self.restarted_engines = True
        except Exception as e:
            self.run.message = f"engines could not be restarted: {e}"

    def _finish_from_results(self) -> None:
        results = [ar.get(0) for ar in self.async_results]
        rank0 = next((r for r in results if r.get("rank") == 0), results[0])
        stopped = any(r.get("stopped") for r in results)
        # a result can arrive before the last data the engine published (they travel on
        # different channels): wait briefly for each engine's output, so the last phase and
        # records reach the view before the run is marked finished
        for ar in self.async_results:
            try:
                ar.wait_for_output(OUTPUT_WAIT_S)
            except Exception:
                pass
        self._collect_records()
        if self.run.stop_requested_at is not None:
            self.stop_latency_s = time.monotonic() - self.run.stop_requested_at
        self.run.finish(summary=rank0.get("summary"), weights=rank0.get("weights"),
                        weight_names=rank0.get("weight_names"), history=rank0.get("history"), stopped=stopped)

    def _forget_results(self) -> None:
        """Drop this run's results and streamed records from the Client's memory (they are in
        the Run now), so hundreds of runs on one cluster do not grow the notebook's memory."""
        try:
            msg_ids = [m for ar in self.async_results for m in ar.msg_ids]
            self.cluster.client.purge_local_results(jobs=msg_ids)
        except Exception:
            pass

    def _watch(self) -> None:
        try:
            self._watch_until_finished()
        finally:
            if all(ar.ready() for ar in self.async_results):
                self._forget_results()
            if self.error_dir:
                shutil.rmtree(self.error_dir, ignore_errors=True)

    def _error_file_report(self) -> tuple[int, str] | None:
        """(rank, last line of its error) from the first error file a rank wrote, if any."""
        if not self.error_dir:
            return None
        from ..failures import read_failures

        try:
            failures = read_failures(self.error_dir)
        except OSError:
            return None
        if not failures:
            return None
        rank, _, text = failures[0]
        return _rank_report(f"[parallax_nb] rank {rank} failed:\n{text}")

    def _watch_until_finished(self) -> None:
        try:
            self.run.set_status(RUNNING, "running")
            while True:
                self._collect_records()
                if all(ar.ready() for ar in self.async_results):
                    self._check_failures()
                    if self._first_error is None:
                        self._finish_from_results()
                    else:
                        _, rank, exc = self._first_error
                        self.run.fail(self._error_for(rank, exc, others_restarted=False))
                    return
                self._check_failures()
                now = time.monotonic()
                if self._first_error is None and self.cluster.mpiexec_exited():
                    # a rank died and mpiexec ended the others: no need to wait for heartbeats
                    from ipyparallel.error import EngineError

                    self._first_error = (now - self.failure_grace_s, 0, EngineError("the engines' mpiexec exited"))
                    continue
                if self._abort_reason is not None:
                    self._restart_engines()
                    self.stop_latency_s = now - (self.run.stop_requested_at or now)
                    self.run.finish(stopped=True, message=f"stopped: {self._abort_reason}; engines restarted")
                    return
                if self._first_error is not None and now - self._first_error[0] > self.failure_grace_s:
                    _, rank, exc = self._first_error
                    # named at once; holding the cluster's lock, so that its next use (a new run,
                    # status) waits for the restarted engines
                    with self.cluster._lock:
                        self._mpi_output = self._mpi_output or self.cluster.engine_output()
                        self.run.fail(self._error_for(rank, exc, others_restarted=True))
                        self._restart_engines()
                    return
                if self.run.stop_requested_at is not None and now - self.run.stop_requested_at > self.stop_grace_s:
                    self._restart_engines()
                    self.stop_latency_s = time.monotonic() - self.run.stop_requested_at
                    self.run.finish(stopped=True, message=f"stopped: engines did not stop within "
                                                          f"{self.stop_grace_s:g} s and were restarted")
                    return
                self._stop_event.wait(self.poll_s)
        except Exception as e:   # the watcher itself must never leave the run hanging
            err = DistributedError(f"lost track of the run: {type(e).__name__}: {e}")
            err.remote_traceback = traceback.format_exc()
            if self.run.status != FAILED:
                self.run.fail(err)


def _lost_engine(process_alive: bool | None) -> str:
    """How an engine whose task ended in ipyparallel's EngineError was lost, from whether its
    process still runs (None: unknown, the engine is on another host). The controller drops
    an engine when its nanny reports the process ended, or after about 30 s without an answer
    to its heartbeats (10 missed, 3 s apart)."""
    if process_alive is None:
        return ("was lost while training: its process ended (killed, out of memory, or crashed) or it stopped "
                "answering the controller's heartbeats (its host unreachable or stalled)")
    if process_alive:
        return ("stopped answering the controller's heartbeats while training (for about 30 s); its process "
                "still runs, stalled or cut off from the controller")
    return "died while training: its process ended (killed, out of memory, or crashed)"


def _completed_s(async_result) -> float:
    """When the engine finished the task (Unix seconds, the reply's date), +inf when unknown
    (an engine that died sends no reply)."""
    try:
        metadata = async_result.metadata
        completed = (metadata[0] if isinstance(metadata, list) else metadata).get("completed")
        return completed.timestamp() if completed is not None else float("inf")
    except Exception:
        return float("inf")


_RANK_REPORT = re.compile(r"\[parallax_nb\] rank (\d+) failed:\n(.*?)(?=\n\[parallax_nb\] rank|\Z)", re.S)


def _rank_report(output: str) -> tuple[int, str] | None:
    """(rank, last line of its error) from the runtime's own report of a rank that gave up
    (``failures.report_rank_failure``, e.g. a step past ``step_timeout_s``), if any."""
    m = _RANK_REPORT.search(output or "")
    if not m:
        return None
    exception_lines = [line.strip() for line in m.group(2).splitlines()
                       if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", line)]
    return int(m.group(1)), (exception_lines[0] if exception_lines else "failed")


def _mpi_exit_culprit(output: str) -> tuple[int, str] | None:
    """(rank, "killed by signal N (NAME)") from Open MPI's report of the rank that died first."""
    from ..launch import mpi_exit_culprit

    culprit = mpi_exit_culprit(output)
    return (culprit[0], culprit[2]) if culprit else None


def run(job, plan=None, engines: int = 2, steps: int = 100, *, cluster: Cluster | None = None,
        checkpoint_dir: str | None = None, checkpoint_every: int = 0, resume: bool = False,
        step_timeout_s: float | None = None, wait: bool = True, display: bool = True,
        profile=None, train_fn: Callable | None = None, stop_grace_s: float = STOP_GRACE_S,
        failure_grace_s: float = FAILURE_GRACE_S, calibration=None) -> Run:
    """Train ``job`` with ``plan`` on ``engines`` MPI engines for ``steps`` steps.

    ``plan`` None means HYBRID (PS for sparse variables, AR for dense) from the variable
    kinds of one single-device step. The job travels by cloudpickle, the plan as its dict; every engine calls
    ``parallax_nb.runtime.train(job, plan, steps, on_step=..., should_stop=..., ...)``
    (or ``train_fn``, a function with the same signature). Progress streams back while it
    trains; the returned :class:`Run` is live.

    cluster:          a :class:`Cluster` to use; default: the notebook's shared cluster of
                      ``engines`` engines (started on first use, reused afterwards).
    checkpoint_dir / checkpoint_every / resume: passed to the runtime (resume continues from
                      the last checkpoint in ``checkpoint_dir``).
    step_timeout_s:   a step that takes longer fails the run (a rank hung in a collective).
    wait:             block until the run is finished (Ctrl-C stops it; a failure raises).
    display:          show the live :class:`~parallax_nb.widgets.run_view.RunView` (in IPython).
    profile:          the job's Profile, if known: the view then shows the bytes per step the
                      cost model predicts for this run's engines next to the measured ones.
    calibration:      a :class:`~parallax_nb.calibration.Calibration` of the engines' cluster:
                      the predicted step time and link bytes shown after the run use it
                      (without one they are uncalibrated).
    train_fn:         advanced: a function with ``runtime.train``'s signature to run instead.
    stop_grace_s / failure_grace_s: how long engines get to stop by themselves (after
                      ``stop()``, or after one rank failed) before they are killed and restarted.
    """
    global _last_run
    from ..job import Job

    if not isinstance(job, Job):
        raise ConfigError(f"run() needs a parallax_nb.Job, got {type(job).__name__}",
                          hint="build one with px.Job(model=..., loss=..., optimizer=..., data=..., batch_size=...)")
    _check_positive_int("steps", steps)
    _check_positive_int("engines", engines)
    _check_positive_int("checkpoint_every", checkpoint_every, minimum=0)
    if step_timeout_s is not None and not (isinstance(step_timeout_s, (int, float)) and step_timeout_s > 0):
        raise ConfigError(f"step_timeout_s must be a positive number of seconds, got {step_timeout_s!r}")
    if resume and not checkpoint_dir:
        raise ConfigError("resume=True needs checkpoint_dir: the folder the earlier run saved checkpoints in")
    if plan is not None and not hasattr(plan, "to_dict") and not isinstance(plan, dict):
        raise ConfigError(f"plan must be a parallax_nb Plan (or its dict), got {type(plan).__name__}",
                          hint="make one with px.plan(profile, ...).plan or px.make_plan(...)")
    if cluster is not None and cluster.n != engines:
        raise ConfigError(f"the cluster has {cluster.n} engines but engines={engines}",
                          hint=f"pass engines={cluster.n} or a cluster of {engines} engines")
    if calibration is not None:
        from ..calibration import Calibration

        if not isinstance(calibration, Calibration):
            raise ConfigError(f"calibration must be a parallax_nb Calibration, got {type(calibration).__name__}",
                              hint="measure one with px.calibrate(...) or load it with Calibration.from_json(path)")
    architecture = plan.get("architecture") if isinstance(plan, dict) else getattr(
        getattr(plan, "architecture", None), "value", None)
    the_run = Run(job=job, plan=plan, steps=steps, engines=engines, architecture=architecture, profile=profile,
                  calibration=calibration)
    _last_run = the_run
    if display:       # at once: the start-up phases below are shown while they happen
        _display(the_run)
    try:
        cluster, async_results, error_dir = _start(the_run, job, cluster, train_fn, steps, dict(
            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
            step_timeout_s=step_timeout_s))
    except BaseException as e:
        from ..errors import ParallaxError

        error = e if isinstance(e, ParallaxError) else DistributedError(f"the run could not start: {type(e).__name__}: {e}")
        the_run.fail(error)
        raise
    controller = RunController(the_run, cluster, async_results, cluster.engine_ids, stop_grace_s=stop_grace_s,
                               failure_grace_s=failure_grace_s)
    controller.error_dir = error_dir
    the_run._controller = controller
    the_run.cluster = cluster
    the_run.hosts = controller.hosts
    controller.thread.start()
    if wait:
        the_run.wait()
    return the_run


def _start(the_run: Run, job, cluster: Cluster | None, train_fn, steps: int, options: dict):
    """Plan if needed, start the cluster and submit the training to every engine, naming each
    phase on ``the_run``; returns (cluster, async results in rank order, error folder)."""
    def forward(event: progress.Event) -> None:
        if event.kind == progress.PHASE and event.task == "cluster":
            the_run.set_phase(f"starting the cluster: {event.text}")

    with progress.task("run", f"starting the run of {job.name}"):
        if the_run.plan is None and train_fn is None:
            the_run.set_phase("planning HYBRID from the variable kinds (one single-device step)")
            from ..runtime.reference import default_plan

            the_run.plan = default_plan(job, ranks=the_run.engines)
            the_run.architecture = the_run.plan.architecture.value
        plan = the_run.plan
        plan_dict = plan if isinstance(plan, dict) or plan is None else plan.to_dict()
        the_run.set_phase("starting the cluster")
        progress.listen(forward)
        try:
            cluster = cluster if cluster is not None else default_cluster(the_run.engines, start=False)
            cluster.start()
        finally:
            progress.unlisten(forward)
        cluster.check_idle(f"starting a run of {job.name}")   # not queued behind another run or calibration
        the_run.set_phase(f"shipping the job to {the_run.engines} engines")
        error_dir = make_workdir(ERROR_DIR_PREFIX)     # 0700, removed when the run ends
        options = dict(options, error_dir=error_dir)
        job_bytes = job.to_bytes()
        train_fn_bytes = _pickle_function(train_fn) if train_fn is not None else None
        client = cluster.client
        async_results = [client[eid].apply_async(train_on_engine, job_bytes, plan_dict, steps, options, train_fn_bytes)
                         for eid in cluster.engine_ids]
        cluster.occupy(the_run)
    return cluster, async_results, error_dir


def _pickle_function(fn: Callable) -> bytes:
    """cloudpickle ``fn`` by value unless it lives in parallax_nb (engines import that)."""
    import importlib
    import cloudpickle

    inner = fn
    while hasattr(inner, "func"):          # functools.partial
        inner = inner.func
    module_name = getattr(inner, "__module__", None) or "__main__"
    if module_name == "__main__" or module_name.split(".")[0] == "parallax_nb":
        return cloudpickle.dumps(fn)
    module = importlib.import_module(module_name)
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def _display(the_run: Run) -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    if get_ipython() is None:
        return
    from IPython.display import display

    display(the_run)  # a live view, registered by parallax_nb.widgets.ipython
