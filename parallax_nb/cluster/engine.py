"""What runs inside each ipyparallel engine (one engine = one MPI rank).

:func:`train_on_engine` rebuilds the Job (cloudpickle bytes) and the Plan (its dict), calls
the training function (``parallax_nb.runtime.train`` by default) with two hooks, and returns
a small dict to the notebook:

- ``on_step(record)`` publishes each step record on the engine's IOPub channel
  (ipyparallel ``publish_data``), so the notebook sees progress while the engine is busy.
  Messages are signed with the cluster's session key; the notebook only accepts data from
  its own cluster.
- ``should_stop()`` turns a stop request into the same decision on every rank. The notebook
  asks for a stop by sending ``SIGUSR1`` to each engine through ipyparallel's nanny (the
  control channel, which works while the engine is busy); the handler only sets a flag.
  Ranks may see the signal at different steps, so the flags are combined across ranks every
  step (``runtime.train`` lets them ride the step's loss collective; for another training
  function, :class:`StopFlag` combines them with an ``allreduce(MAX)`` over MPI): all ranks
  leave the loop after the same step and none is left waiting in a collective.

Kept free of widgets and of the notebook side so that it imports fast on engines.
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable

STOP_SIGNAL = signal.SIGUSR1
RECORD_KEY_PREFIX = "px_record"   # data keys: "px_record:<rank>:<step>"
STATUS_KEY = "px_status"
#: the network interface of this engine's machine whose kernel counters each step record
#: carries (``link_bytes``, ``link_packets``: received + sent so far), e.g. ``eth0``; unset: none
LINK_INTERFACE_ENV = "PARALLAX_NB_LINK_INTERFACE"


def link_counters() -> tuple[int, int] | None:
    """(bytes, packets) received + sent so far by this machine's link (:data:`LINK_INTERFACE_ENV`),
    read from the kernel's interface statistics; None when no interface is named."""
    interface = os.environ.get(LINK_INTERFACE_ENV)
    if not interface:
        return None
    from ..runtime.accounting import interface_totals

    return interface_totals(interface)


def measure_on_engine(job=None, workers_per_machine: int | None = None, link_interface: str | None = None,
                      progress_dir: str | None = None) -> dict:
    """``px.calibrate(cluster=...)`` on one engine: :func:`parallax_nb.runtime.calibrate.measure_on_rank`
    reading the link the cluster named for its engines (:data:`LINK_INTERFACE_ENV`, e.g. an
    emulated machine's ``eth0``) unless ``link_interface`` is given. ``progress_dir``: the
    notebook's folder for each step's report (:func:`~parallax_nb.failures.report_progress`),
    written where this engine sees it (an emulated machine, a shared filesystem), so a
    calibration that stops progressing is named before its cap."""
    from ..runtime.calibrate import measure_on_rank

    with rank_folder(progress_dir):
        return measure_on_rank(job=job, workers_per_machine=workers_per_machine,
                               link_interface=link_interface or os.environ.get(LINK_INTERFACE_ENV) or None)


@contextmanager
def rank_folder(folder: str | None):
    """While it lasts, this rank's errors and progress go to the notebook's ``folder``
    (:data:`~parallax_nb.failures.ERROR_DIR_ENV`) where this engine sees it (this host, an
    emulated machine, a shared filesystem); elsewhere, and without one, nothing changes."""
    from ..failures import ERROR_DIR_ENV

    before = os.environ.get(ERROR_DIR_ENV)
    if folder and os.path.isdir(folder):
        os.environ[ERROR_DIR_ENV] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ERROR_DIR_ENV, None)
        else:
            os.environ[ERROR_DIR_ENV] = before


class StopFlag:
    """A stop request that every rank agrees on (see module docstring).

    Installed as a ``SIGUSR1`` handler while the training runs (signal handlers can only be
    installed from the main thread, which is where ipyparallel runs tasks).
    """

    def __init__(self, comm=None):
        self.requested = False
        self.agreed = False
        self.comm = comm
        self._previous = None

    def _on_signal(self, signum, frame):
        self.requested = True

    def install(self) -> "StopFlag":
        self._previous = signal.signal(STOP_SIGNAL, self._on_signal)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(STOP_SIGNAL, self._previous)
            self._previous = None

    def __call__(self) -> bool:
        """True on every rank once any rank was asked to stop (a collective: call on all ranks)."""
        if self.agreed:
            return True
        local = int(self.requested)
        if self.comm is not None and self.comm.Get_size() > 1:
            from mpi4py import MPI

            local = self.comm.allreduce(local, op=MPI.MAX)
        self.agreed = bool(local)
        return self.agreed


class ProgressPublisher:
    """Publishes step records to the notebook over the engine's IOPub channel.

    Each record goes under its own key so that the notebook's copy of the engine's data
    (ipyparallel merges published dicts) accumulates every step, not just the latest.
    """

    def __init__(self, rank: int, publish: Callable[[dict], None] | None = None):
        self.rank = rank
        self.steps_published = 0
        if publish is None:
            from ipyparallel.datapub import publish_data as publish
        self._publish = publish

    def __call__(self, record: Any) -> None:
        from .handle import record_to_dict

        d = record_to_dict(record)
        link = link_counters()
        if link is not None:   # read right after the step: its traffic is in, the next step's not yet
            d.update(link_bytes=link[0], link_packets=link[1])
        self._publish({f"{RECORD_KEY_PREFIX}:{self.rank}:{d['step']:09d}": d})
        self.steps_published += 1

    def status(self, text: str) -> None:
        self._publish({STATUS_KEY: {"rank": self.rank, "text": text, "time": time.time()}})


def _load_plan(plan_dict):
    if plan_dict is None:
        return None
    from ..plan import Plan

    return Plan.from_dict(plan_dict)


def _mpi_comm():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def _weights_of(result) -> tuple["dict | list | None", list | None]:
    """The trained single-device weights: ``result.weights`` ({path: array}, the runtime's
    TrainResult), else those of ``result.single_device_model()`` in model order."""
    weights = getattr(result, "weights", None)
    if isinstance(weights, dict):
        return {str(k): v for k, v in weights.items()}, list(weights)
    model = result.single_device_model() if hasattr(result, "single_device_model") else None
    if model is None:
        return None, None
    return [w for w in model.get_weights()], [getattr(v, "path", v.name) for v in model.weights]


class TrainingThread:
    """The one thread of this engine that runs training, for the engine's whole life.

    Why not the engine's main thread: ipyparallel runs each task as a freshly compiled
    ``_result = f(*args, **kwargs)`` statement (and ships a plain function as its code), so
    every task's stack starts with new code objects. TensorFlow records the Python stack of
    every op it traces, and its native side keeps memory (and those code objects) for each
    code object it has not seen before, for the life of the process: each run dispatched on
    the main thread left ~1 MiB per engine behind (soak: +11 % engine RSS after 60 runs).
    Measured: Python objects and tracemalloc flat, malloc's bytes in use +1.0 MiB per run;
    the same runs looped inside one task: flat; that loop calling through a freshly
    compiled statement each time: +1.1 MiB per run again. On this thread every run's stack
    is made of the same code objects, so nothing accumulates.

    A daemon thread: an engine stuck in a collective can still be ended. Calls are serial
    (one run at a time per engine, which is how the dispatcher uses engines).
    """

    def __init__(self):
        self._tasks: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _serve(self) -> None:
        while True:
            fn, args, kwargs, box, done = self._tasks.get()
            try:
                box["result"] = fn(*args, **kwargs)
            except BaseException as e:   # handed to the caller, which raises it
                box["error"] = e
            finally:
                done.set()
            del fn, args, kwargs, box, done

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the training thread; its result, or its exception raised here.

        The caller (the engine's main thread) waits interruptibly, so Python signal handlers
        (the stop flag's ``SIGUSR1``) still run while training goes on.
        """
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="parallax_nb-training", daemon=True)
                self._thread.start()
        box: dict = {}
        done = threading.Event()
        self._tasks.put((fn, args, kwargs, box, done))
        done.wait()
        if "error" in box:
            error = box.pop("error")
            try:
                raise error
            finally:
                del error
        return box["result"]


_training_thread = TrainingThread()


def train_on_engine(job_bytes: bytes, plan_dict: dict | None, steps: int, options: dict,
                    train_fn_bytes: bytes | None = None) -> dict:
    """Run the training on this engine's rank and return what the notebook needs.

    Rank 0 returns ``summary``, ``history`` (list of record dicts) and ``weights``; every
    rank returns ``rank``, ``size``, ``host``, ``pid``, ``steps_done`` and ``stopped``.
    ``options`` holds ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``step_timeout_s``
    and ``publish`` (False to train without streaming). ``train_fn_bytes`` is a cloudpickled
    function with ``runtime.train``'s signature, or None for ``parallax_nb.runtime.train``.

    The stop flag's signal handler is installed here (only the main thread may); the rest
    runs on the engine's :class:`TrainingThread`.
    """
    comm = _mpi_comm()
    # runtime.train agrees on should_stop across ranks itself; another train_fn gets an agreeing flag
    stop = StopFlag(comm if train_fn_bytes is not None else None).install()
    try:
        return _training_thread.call(_train, job_bytes, plan_dict, steps, options, train_fn_bytes, stop)
    finally:
        stop.uninstall()


def _train(job_bytes: bytes, plan_dict: dict | None, steps: int, options: dict, train_fn_bytes: bytes | None,
           stop: "StopFlag") -> dict:
    """The body of :func:`train_on_engine`, on the training thread."""
    from ..job import Job
    from ..runtime.context import clear_keras_session, horovod

    horovod()   # this rank's GPU is chosen before the job, Keras or the training run anything

    comm = _mpi_comm()
    rank = comm.Get_rank() if comm is not None else 0
    size = comm.Get_size() if comm is not None else 1
    job = Job.from_bytes(job_bytes)
    plan = _load_plan(plan_dict)
    if train_fn_bytes is None:
        from ..runtime.trainer import train as train_fn
    else:
        import cloudpickle

        train_fn = cloudpickle.loads(train_fn_bytes)
    clear_keras_session()   # same variable names on every run of a reused engine

    publisher = ProgressPublisher(rank) if options.get("publish", True) else (lambda record: None)
    from .. import progress

    def publish_phase(event):     # the runtime's start-up and wrap-up phases, shown by the notebook
        if event.kind == progress.PHASE and event.task == "run" and hasattr(publisher, "status"):
            publisher.status(event.text)
    kwargs = dict(on_step=publisher, should_stop=stop, checkpoint_dir=options.get("checkpoint_dir"),
                  resume=bool(options.get("resume", False)), step_timeout_s=options.get("step_timeout_s"))
    if options.get("checkpoint_every"):
        kwargs["checkpoint_every"] = int(options["checkpoint_every"])
    # a rank that gives up (the runtime's step watchdog) writes why to error-<rank>.txt there:
    # its stderr goes to the notebook through IOPub, which a process ending at once never flushes
    progress.listen(publish_phase)
    try:
        with rank_folder(options.get("error_dir")):
            result = train_fn(job, plan, steps, **kwargs)
    finally:
        progress.unlisten(publish_phase)

    history = list(getattr(result, "history", []) or [])
    out = dict(rank=rank, size=size, host=socket.gethostname(), pid=os.getpid(),
               steps_done=int(getattr(result, "steps_done", getattr(history[-1], "step", 0) if history else 0)),
               stopped=bool(stop.agreed or getattr(result, "stopped_early", False)))
    if rank == 0:
        from .handle import record_to_dict

        summary = result.summary() if hasattr(result, "summary") else None
        weights, names = _weights_of(result)
        out.update(summary=summary, history=[record_to_dict(r) for r in history],
                   weights=weights, weight_names=names)
    return out


def engine_identity() -> dict:
    """Rank, size, host and pid of this engine (to map ipyparallel engine ids to MPI ranks)."""
    comm = _mpi_comm()
    return dict(rank=comm.Get_rank() if comm is not None else 0, size=comm.Get_size() if comm is not None else 1,
                host=socket.gethostname(), pid=os.getpid())
