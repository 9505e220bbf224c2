"""Run: the handle of one distributed training run, and the model its views observe.

A Run holds everything known about a run in plain Python: its status, the step records
streamed from the engines while it trains, the final summary and weights, or the error.
It knows nothing about widgets; :class:`~parallax_nb.widgets.run_view.RunView` subscribes
with :meth:`Run.observe` and redraws. The dispatcher (``dispatch.py``) feeds it from a
background thread; every mutation takes the lock and then notifies observers outside it.

Status moves forward only::

    starting -> running -> done
                        -> stopping -> stopped
                        -> failed
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import DistributedError, ParallaxError

STARTING, RUNNING, STOPPING, DONE, STOPPED, FAILED = "starting", "running", "stopping", "done", "stopped", "failed"
FINISHED = (DONE, STOPPED, FAILED)

#: Columns of :attr:`Run.history`, one row per step of rank 0 (units in the names); ``step``
#: is the number of steps done after that step (1, 2, ...). An asynchronous run adds
#: ``steps_ahead`` (:mod:`parallax_nb.staleness`).
HISTORY_COLUMNS = ("step", "loss", "examples_per_s", "step_time_s", "bytes_sent", "bytes_received",
                   "bytes_per_step")


def record_to_dict(record: Any) -> dict:
    """A StepRecord (dataclass, object or dict) as a plain dict with ``bytes_per_step`` added.

    ``bytes_by_variable`` values ``(sent, received)`` become their sum in bytes.

    ``bytes_per_step`` = bytes_sent + bytes_received of one rank in one step (what the cost
    model predicts per worker per step).
    """
    if isinstance(record, dict):
        d = dict(record)
    elif hasattr(record, "__dataclass_fields__"):
        d = {name: getattr(record, name) for name in record.__dataclass_fields__}
    else:
        d = dict(vars(record))
    d["bytes_by_variable"] = {str(k): float(sum(v)) if isinstance(v, (tuple, list)) else float(v)
                              for k, v in dict(d.get("bytes_by_variable") or {}).items()}
    for key in ("loss", "examples_per_s", "step_time_s", "bytes_sent", "bytes_received"):
        if key in d and d[key] is not None:
            d[key] = float(d[key])
    d["step"] = int(d.get("step", 0))
    d["bytes_per_step"] = float(d.get("bytes_sent") or 0.0) + float(d.get("bytes_received") or 0.0)
    return d


class Run:
    """A distributed training run: live while it trains, a result once it is finished.

    Attributes read by users: :attr:`status`, :attr:`done`, :attr:`history`,
    :meth:`summary`, :attr:`model`, :attr:`error`; actions: :meth:`wait`, :meth:`stop`.
    ``steps`` is the number of steps asked for; ``plan`` the plan it runs (or None);
    ``engines`` the number of engines (MPI ranks); ``profile`` (optional) the job's profile,
    used to predict bytes per step and step time for this run's topology; ``calibration``
    (optional) a :class:`~parallax_nb.calibration.Calibration` of the cluster, used by those
    predictions (without one they are uncalibrated).
    """

    def __init__(self, job: Any = None, plan: Any = None, steps: int = 0, engines: int = 0,
                 architecture: str | None = None, profile: Any = None, calibration: Any = None):
        self.job = job
        self.plan = plan
        self.profile = profile
        self.calibration = calibration
        self.cluster = None                      # set by dispatch: the Cluster the engines run on
        self.steps = int(steps)
        self.engines = int(engines)
        self.architecture = architecture
        self.status = STARTING
        self.message = "starting"
        self.phase = "starting"             # what the run is doing now, in words (see set_phase)
        self.phase_started_at = time.time()
        self.error: DistributedError | None = None
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.stop_requested_at: float | None = None
        self._records: list[dict] = []          # rank 0, ordered by step
        self._last_step_by_rank: dict[int, int] = {}
        self._summary: dict | None = None
        self._weights: list | None = None
        self._weight_names: list[str] | None = None
        self._model = None
        self._lock = threading.RLock()
        self._finished = threading.Event()
        self._observers: list[Callable[["Run", str], None]] = []
        self._controller = None                  # set by dispatch: has .request_stop(), .abort()
        self.hosts: list[str] = []               # per rank, set by dispatch before records arrive
        self._link_marks: dict[str, dict[int, tuple]] = {}   # host -> step -> its link's (bytes, packets) so far

    # ----- observation -------------------------------------------------------------------------
    def observe(self, callback: Callable[["Run", str], None]) -> None:
        """Call ``callback(run, what)`` after each change; ``what`` is "records", "status" or "phase"."""
        self._observers.append(callback)

    def unobserve(self, callback) -> None:
        if callback in self._observers:
            self._observers.remove(callback)

    def _notify(self, what: str) -> None:
        for callback in list(self._observers):
            try:
                callback(self, what)
            except Exception:  # a broken view must not break the run
                pass

    # ----- fed by the dispatcher ---------------------------------------------------------------
    def add_records(self, records: list, rank: int = 0) -> None:
        """Append streamed step records of ``rank``; rank 0's become the history."""
        if not records:
            return
        with self._lock:
            dicts = [record_to_dict(r) for r in records]
            self._last_step_by_rank[rank] = max([self._last_step_by_rank.get(rank, -1)] + [d["step"] for d in dicts])
            if self.hosts and self.hosts.index(self.hosts[rank]) == rank:   # one reader per machine
                for d in dicts:
                    if d.get("link_bytes") is not None:
                        self._link_marks.setdefault(self.hosts[rank], {})[d["step"]] = (
                            int(d["link_bytes"]), int(d["link_packets"]))
            if rank == 0:
                if self.phase != "training" and not self.phase.startswith("gathering") and not self.done:
                    self.phase, self.phase_started_at = "training", time.time()
                known = {d["step"] for d in self._records}
                self._records.extend(d for d in dicts if d["step"] not in known)
                self._records.sort(key=lambda d: d["step"])
        self._notify("records")

    def set_phase(self, text: str) -> None:
        """Name what the run is doing now ("starting the cluster: engines 1 of 2 ready",
        "building the model", "training", "gathering the trained weights"): a view shows it
        with the time since it began, so no wait looks like a hang."""
        with self._lock:
            if self.status in FINISHED or text == self.phase:
                return
            self.phase, self.phase_started_at = text, time.time()
        self._notify("phase")

    def plan_mismatch(self) -> str | None:
        """A sentence when the plan was made for another cluster than the engines it runs on,
        saying what the predictions then mean; None when they agree."""
        cluster = getattr(self.plan, "cluster", None)
        if cluster is None or self.engines < 1 or cluster.workers == self.engines:
            return None
        meaning = ("the predicted bytes are recomputed from the profile for those engines" if self.profile is not None
                   else "there is no prediction for them (pass profile=prof to px.run to get one), so predictions "
                        "show '-'")
        return (f"This plan was made for {cluster.machines} machine(s) x {cluster.workers_per_machine} worker(s) "
                f"({cluster.workers} workers) but runs on {self.engines} engines: its per-variable methods and "
                f"partitions are used as they are, the engines count as {self.engines} machines of 1 worker, and "
                f"{meaning}.")

    def set_status(self, status: str, message: str | None = None) -> None:
        with self._lock:
            if self.status in FINISHED:
                return
            self.status = status
            self.message = message or status
            if status in FINISHED:
                self.finished_at = time.time()
        self._notify("status")
        if status in FINISHED:
            self._finished.set()

    def finish(self, summary: dict | None = None, weights: list | None = None, weight_names: list | None = None,
               history: list | None = None, stopped: bool = False, message: str | None = None) -> None:
        """The engines returned: keep rank 0's summary, weights and full history."""
        with self._lock:
            self.phase, self.phase_started_at = "finished", time.time()
            if history:
                self._records = sorted((record_to_dict(r) for r in history), key=lambda d: d["step"])
                self._last_step_by_rank[0] = self._records[-1]["step"]
            self._summary = summary
            self._weights = weights
            self._weight_names = weight_names
        self._notify("records")
        default = f"stopped after {self.steps_done} of {self.steps} steps" if stopped else \
            f"done: {self.steps_done} steps"
        if self.batch_norm_note:
            default += f"; {self.batch_norm_note}"
        self.set_status(STOPPED if stopped else DONE, message or default)

    def fail(self, error: DistributedError) -> None:
        with self._lock:
            self.error = error
        self.set_status(FAILED, f"failed: {error.message}")

    # ----- read by users and views -------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the run finished, was stopped, or failed."""
        return self.status in FINISHED

    @property
    def records(self) -> list[dict]:
        """Rank 0's step records so far (plain dicts, see :func:`record_to_dict`)."""
        with self._lock:
            return list(self._records)

    @property
    def steps_done(self) -> int:
        """Steps rank 0 has completed: its last record's ``step`` (records count steps from 1,
        and a resumed run continues the numbering of its checkpoint)."""
        with self._lock:
            return self._records[-1]["step"] if self._records else 0

    @property
    def progress(self) -> float:
        """steps_done / steps, in [0, 1]."""
        return min(1.0, self.steps_done / self.steps) if self.steps > 0 else 0.0

    @property
    def elapsed_s(self) -> float:
        return (self.finished_at or time.time()) - self.started_at

    @property
    def history(self):
        """One row per step of rank 0 (columns :data:`HISTORY_COLUMNS`), a pandas DataFrame."""
        import pandas as pd

        columns = list(HISTORY_COLUMNS) + ([] if self.sync else ["steps_ahead"])
        rows = [{c: r.get(c) for c in columns} for r in self.records]
        return pd.DataFrame(rows, columns=columns)

    @property
    def sync(self) -> bool:
        """Whether the run trains synchronously: as executed once the summary is in, else as planned."""
        summary = self._summary or {}
        if "sync" in summary:
            return bool(summary["sync"])
        return bool(getattr(self.plan, "sync", True))

    @property
    def max_staleness(self) -> int | None:
        summary = self._summary or {}
        if "sync" in summary:
            return summary.get("max_staleness")
        return getattr(self.plan, "max_staleness", None)

    @property
    def training_text(self) -> str:
        """``"synchronous"`` or ``"asynchronous, max staleness k"`` (``"..., unbounded staleness"``)."""
        from ..staleness import describe_sync

        return describe_sync(self.sync, self.max_staleness)

    @property
    def staleness(self):
        """The measured staleness of every rank of an asynchronous run
        (:class:`parallax_nb.staleness.MeasuredStaleness`), from its summary; None for a
        synchronous run or before the summary (see :attr:`live_staleness`)."""
        from ..staleness import MeasuredStaleness

        summary = (self._summary or {}).get("staleness")
        return MeasuredStaleness.from_dict(summary) if summary and not self.sync else None

    @property
    def live_staleness(self):
        """Rank 0's measured staleness so far, from its step records (the others' arrive with
        the summary); None for a synchronous run or before its first step."""
        from ..staleness import MeasuredStaleness

        ahead = [r["steps_ahead"] for r in self.records if r.get("steps_ahead") is not None]
        return MeasuredStaleness.from_steps_ahead([ahead], self.max_staleness) if ahead and not self.sync else None

    def measured_bytes_by_variable(self) -> dict[str, float]:
        """Mean measured bytes per step of each variable on rank 0 (sent + received)."""
        records = self.records
        totals: dict[str, float] = {}
        counted = 0
        for r in records:
            if r["bytes_by_variable"]:
                counted += 1
                for name, value in r["bytes_by_variable"].items():
                    totals[name] = totals.get(name, 0.0) + value
        return {name: total / counted for name, total in totals.items()} if counted else {}

    @property
    def machines(self) -> tuple[int, int] | None:
        """(machines, engines per machine) when the engines span several hosts, else None."""
        hosts = list(dict.fromkeys(self.hosts))
        return (len(hosts), len(self.hosts) // len(hosts)) if len(hosts) > 1 else None

    def link_bytes_per_step(self) -> dict[str, float]:
        """Per machine (host): bytes its network link carried per step, received + sent, from
        the kernel's counters that its first engine read after every step (engines started
        with ``PARALLAX_NB_LINK_INTERFACE``, e.g. ``Cluster(emulate=...)``). Over the steps after
        the first streamed one (the first also carries start-up traffic); {} when not known."""
        return self._link_per_step(0)

    def link_packets_per_step(self) -> dict[str, float]:
        """Per machine (host): packets (frames) its link carried per step, received + sent; as
        :meth:`link_bytes_per_step`."""
        return self._link_per_step(1)

    def _link_per_step(self, counter: int) -> dict[str, float]:
        out = {}
        with self._lock:
            for host, marks in self._link_marks.items():
                steps = sorted(marks)
                if len(steps) >= 2:
                    out[host] = (marks[steps[-1]][counter] - marks[steps[0]][counter]) / (steps[-1] - steps[0])
        return out

    def predicted_link_bytes_per_step(self) -> float | None:
        """Bytes per step each machine's link is predicted to carry, as its kernel counters
        count them (:meth:`link_prediction`'s total), or None without a prediction."""
        prediction = self.link_prediction()
        return prediction.total_bytes if prediction is not None else None

    def link_prediction(self):
        """:class:`~parallax_nb.types.LinkBytes` of one machine's link per step
        (:func:`parallax_nb.cost.link.predict_link_bytes`): the cost model's payload (a rank's
        prediction times engines per machine) with TCP/IP framing, plus the calibration's
        Horovod coordination rate times this run's measured median step time (the seconds are
        the run's, so the comparison tests the bytes, not the time model); None without a
        prediction or on one machine. With a calibration that measured its link per call
        (``px.calibrate(cluster=...)``), the framing and every call of the step are priced as
        measured; the calls, and the split of the payload by the calls that carry it (each
        framed at its own measured factor), are those of the executed plan's estimate
        (:meth:`_executed_estimate`)."""
        predicted = self.predicted_bytes_by_variable()
        machines = self.machines
        if not predicted or not machines:
            return None
        from ..cost.link import predict_link_bytes

        executed = self._executed_estimate()
        payload = sum(predicted.values()) * machines[1]
        calls = shares = None
        if executed is not None and executed.link is not None:
            calls = dict(executed.link.calls)
            whole = executed.link.payload_bytes   # its split by call, scaled to this run's payload
            shares = {k: v * payload / whole for k, v in executed.link.payload_calls} if whole > 0 else None
        return predict_link_bytes(payload, self.measured_step_time_s() or 0.0, self.calibration,
                                  calls=calls, payload_calls=shares)

    def _executed_topology(self):
        """(the executed plan, the ClusterSpec it ran on: the ranks' machines, the emulated
        network's bandwidth or the plan's), or None before the run's summary."""
        executed = (self._summary or {}).get("executed_plan")
        if not executed:
            return None
        from ..executed import ExecutedPlan
        from ..types import ClusterSpec

        ran = ExecutedPlan.from_dict(executed)
        planned = getattr(self.plan, "cluster", None) or ClusterSpec(machines=1)
        emulated = getattr(getattr(self.cluster, "network", None), "bandwidth_bps", None)
        spec = planned.replace(machines=ran.machines, workers_per_machine=ran.workers_per_machine,
                               local_aggregation=ran.local_aggregation,
                               **({"bandwidth_bps": emulated} if emulated else {}))
        return ran, spec

    def _executed_estimate(self):
        """The cost model's estimate of what the ranks executed, with this run's calibration
        when it is of the run's shape; None without a profile, before the summary, or when the
        profile is not of this model."""
        topology = self._executed_topology() if self.profile is not None else None
        if topology is None:
            return None
        from ..cost.against_run import calibration_of_shape
        from ..cost.estimate import estimate_executed

        ran, spec = topology
        try:
            return estimate_executed(self.profile, ran, spec, calibration_of_shape(spec, self.calibration))
        except ParallaxError:
            return None

    def measured_step_time_s(self) -> float | None:
        """Median step time of rank 0 over its steps after the first (the first traces and
        allocates), seconds; the whole history when it has one step; None before any step."""
        import statistics

        times = [r["step_time_s"] for r in self.records if r.get("step_time_s") is not None]
        measured = times[1:] if len(times) > 1 else times
        return float(statistics.median(measured)) if measured else None

    def step_time_check(self):
        """Predicted against measured step time once the run is done
        (:class:`~parallax_nb.types.StepTimeCheck`, :func:`parallax_nb.cost.against_run.check_step_time`):
        the estimate of what the ranks executed on their topology (the emulated network's or
        the plan's bandwidth), with this run's calibration, against the run's median step time
        after the first step. None while it runs, without ``profile=`` or without steps."""
        if self.profile is None or self._summary is None or not self.records:
            return None
        topology = self._executed_topology()
        if topology is None:
            return None
        from ..cost.against_run import check_step_time, measured_steps_text, recorded_settings
        from ..types import StepTimeCheck

        ran, spec = topology
        records = self.records
        measured, steps = self.measured_step_time_s(), measured_steps_text(records[0]["step"], records[-1]["step"])
        try:
            return check_step_time(self.profile, ran, spec, measured, steps, self.calibration,
                                   **recorded_settings(self._summary))
        except ParallaxError as e:   # e.g. a profile of another model: the run stands, the reason is shown
            if measured is None or measured != measured:
                return None
            return StepTimeCheck(predicted_step_time_s=None, measured_step_time_s=float(measured),
                                 measured_steps=steps, basis=f"no prediction: {e.message}")

    def predicted_bytes_by_variable(self) -> dict[str, float]:
        """Bytes per step per rank the cost model predicts for each variable of the plan, or {}.

        The engines share this host, so the runtime takes them as the plan's machines when the
        plan's cluster has exactly ``engines`` workers, else as one machine each (see
        :mod:`parallax_nb.runtime.topology`); the prediction is for that cluster, divided by
        its workers per machine (a rank's share; only bytes between machines are counted).
        With the profile the run was started with (``run(..., profile=...)``) it is recomputed
        (``cost.variable_cost``) under the plan's method of each variable; without one, the
        plan's own figures are used when they are for that cluster, else {} is returned.
        """
        plan = self.plan
        if plan is None or not hasattr(plan, "variables") or self.engines < 1:
            return {}
        cluster = getattr(plan, "cluster", None)
        planned_here = cluster is not None and cluster.workers == self.engines
        workers = cluster.workers_per_machine if planned_here else 1
        if self.machines is not None:   # engines on several hosts: the runtime finds these machines
            planned_here = planned_here and cluster.workers_per_machine == self.machines[1]
            workers = self.machines[1]
        if self.profile is not None:
            from ..cost.pricing import variable_costs
            from ..types import ClusterSpec

            topology = ClusterSpec(machines=self.engines // workers, workers_per_machine=workers,
                                   local_aggregation=bool(plan.local_aggregation) and workers > 1)
            costs = {c.name: c for c in variable_costs(self.profile, topology)}
            return {vp.name: float(costs[vp.name].bytes_for(vp.method)) / workers
                    for vp in plan.variables if vp.name in costs}
        if not planned_here or (workers > 1 and not plan.local_aggregation):
            return {}
        return {vp.name: float(vp.bytes_per_step) / workers for vp in plan.variables if vp.bytes_per_step is not None}

    @property
    def batch_norm_note(self) -> str | None:
        """Said wherever the run is shown when its BatchNorm layers kept per-rank statistics."""
        if ((self._summary or {}).get("batch_norm") or {}).get("statistics") == "per rank":
            return "BatchNorm statistics per rank, not of the global batch (Job(sync_batch_norm=False))"
        return None

    @property
    def plan_changes(self) -> list[str]:
        """What the ranks changed from the plan, one sentence with its reason each (from the
        executed plan in the run's summary; empty before the run ends or when nothing changed)."""
        from ..executed import ExecutedPlan

        executed = (self._summary or {}).get("executed_plan")
        return ExecutedPlan.from_dict(executed).change_lines() if executed else []

    def summary(self) -> dict:
        """Rank 0's run summary (schema ``parallax_nb.run``); raises if the run has none yet."""
        if self._summary is None:
            if self.error is not None:
                raise self.error
            from ..errors import ParallaxError

            raise ParallaxError(f"the run has no summary yet (status: {self.status})",
                                hint="wait for it with run.wait()")
        return dict(self._summary)

    @property
    def weights(self) -> "dict | list | None":
        """The trained single-device weights: {variable path: numpy array} (or a list in model order)."""
        return self._weights

    @property
    def model(self):
        """A single-device Keras model (built with ``job.model()``) holding the trained weights."""
        if self._model is None:
            if self._weights is None:
                from ..errors import ParallaxError

                raise ParallaxError(f"the run has no trained weights (status: {self.status})",
                                    hint="wait for the run to finish; a failed run has no weights")
            model = self.job.build_model()
            if isinstance(self._weights, dict):
                missing = [v.path for v in model.variables if v.path not in self._weights]
                if missing:
                    from ..errors import CheckpointError

                    raise CheckpointError(f"the trained weights lack model variables {missing}",
                                          hint="did job.model() change since the run?")
                for v in model.variables:
                    v.assign(self._weights[v.path])
            else:
                model.set_weights(self._weights)
            self._model = model
        return self._model

    # ----- actions -----------------------------------------------------------------------------
    def stop(self, wait: bool = True, timeout: float | None = 60.0) -> "Run":
        """Ask every engine to stop after its current step; with ``wait``, wait until they did.

        The engines agree on the step to stop at, so no rank is left inside a collective;
        engines that do not stop within the dispatcher's grace period (< 30 s) are aborted
        and restarted, leaving the cluster usable.
        """
        if not self.done and self._controller is not None:
            self._controller.request_stop()
        if wait:
            self._finished.wait(timeout)
        return self

    def wait(self, timeout: float | None = None, raise_on_error: bool = True) -> "Run":
        """Block until the run is finished (or ``timeout`` seconds pass); return self.

        Ctrl-C (KeyboardInterrupt) while waiting stops the run instead of leaving engines
        busy; a second Ctrl-C aborts them. In a Jupyter kernel, widget clicks (the view's
        Stop button) are handled while waiting. A failed run raises its :class:`DistributedError`.
        """
        try:
            self._wait_handling_widgets(timeout)
        except KeyboardInterrupt:
            print("parallax_nb: interrupted, stopping the engines ...", flush=True)
            try:
                self.stop(wait=True, timeout=60.0)
            except KeyboardInterrupt:
                if self._controller is not None:
                    self._controller.abort("aborted by a second interrupt")
                self._finished.wait(60.0)
        if raise_on_error and self.error is not None:
            raise self.error
        return self

    def _wait_handling_widgets(self, timeout: float | None) -> None:
        """Wait for the end; inside a Jupyter kernel, handle widget clicks (Stop) meanwhile."""
        from .kernel_events import current_kernel, handle_widget_messages

        kernel = current_kernel()
        if kernel is None:
            self._finished.wait(timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self._finished.wait(0.2 if left is None else min(0.2, left))
            try:
                handle_widget_messages(kernel)
            except Exception:   # never let the event pump break waiting
                kernel = None
                self._finished.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                return

    def __repr__(self) -> str:
        return (f"<Run {self.status}: {self.steps_done}/{self.steps} steps on {self.engines} engines, "
                f"{self.elapsed_s:.1f} s; {self.message}>")

    @property
    def watched(self) -> bool:
        """True while something (a live view) observes this run."""
        return bool(self._observers)
