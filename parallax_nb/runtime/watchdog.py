"""Turning a hang into an error that names the rank which did not arrive.

Each rank records where it is (its *heartbeat*: phase, step, host, time) in
``heartbeat-<rank>.json`` of the run's shared folder (``PARALLAX_NB_RANK_ERROR_DIR``, where
ranks that give up also write their errors), and a :class:`Watchdog` thread holds a deadline
for the current phase. When it passes, the watchdog compares heartbeats: ranks whose position
(step, phase) is behind this rank's are the ones it waits for in a collective. It then

* waits longer when such a rank is in a phase that is slow but not hung (starting, tracing
  the step function, writing a checkpoint: up to :data:`SLOW_LIMIT_S`), or moved on less than
  the timeout ago;
* otherwise reports a :class:`DistributedError` naming those ranks, their hosts, and what
  they have been doing for how long (or this rank itself when it is the one behind), and
  ends the process: a thread blocked inside MPI cannot be unwound, and exiting lets
  ``mpirun`` (or the notebook's dispatcher) stop the other ranks.

Without a shared folder (a user's own ``mpirun``) every rank still times out on its own
deadline; the error then says only where this rank waited.
"""
from __future__ import annotations

import json
import os
import threading
import time

from ..errors import DistributedError
from ..failures import ERROR_DIR_ENV

SLOW_LIMIT_S = 300.0
FLUSH_S = 1.0  # a running step's heartbeat reaches its file at most this late
STEP = "the step timeout"   # Watchdog.watch(limit=STEP): the user's step timeout
KEEP = "the current deadline"   # Watchdog.watch(limit=KEEP): a new phase under the running deadline
#: phases in the order a rank passes them within one step; start-up phases are step 0
PHASES = ("starting", "started", "first batch", "first batch check", "set-up", "data", "tracing", "traced", "step",
          "callback", "checkpoint", "done")
_SLOW = {"starting", "tracing", "checkpoint"}
_DOING = {"starting": "starting (building the model)", "started": "waiting for the other ranks to start",
          "first batch": "reading its first batch",
          "first batch check": "checking the first batch with the other ranks",
          "set-up": "setting up (broadcasting and sharding the variables)",
          "data": "loading its batch",
          "tracing": "tracing the step function", "traced": "waiting for the others to finish tracing",
          "step": "inside the step", "callback": "in the on_step callback", "checkpoint": "writing a checkpoint",
          "done": "done"}


def _position(beat: dict) -> tuple[int, int]:
    return int(beat["step"]), PHASES.index(beat["phase"])


class Heartbeats:
    """This rank's heartbeat file and a reader of everyone's (no-op without a folder).

    A step passes four phases: writing each to the file cost four file replacements per
    step on the training thread. Start-up, slow phases and the end are written at once;
    the phases of a running step at most every :data:`FLUSH_S` seconds, and the watchdog
    thread writes the latest one when it is older (:meth:`flush`), so a file is never more
    than ~1 s behind the rank, well inside any step timeout."""

    def __init__(self, directory: str | None, rank: int, ranks: int, host: str):
        self.directory = directory if directory and os.path.isdir(directory) else None
        self.rank, self.ranks, self.host = rank, ranks, host
        self.current = {"rank": rank, "host": host, "pid": os.getpid(), "phase": "starting", "step": 0,
                        "since": time.time()}
        self._written = float("-inf")
        self._dirty = False
        self._lock = threading.Lock()

    def _path(self, rank: int) -> str:
        return os.path.join(self.directory, f"heartbeat-{rank}.json")

    def beat(self, phase: str, step: int) -> None:
        self.current = dict(self.current, phase=phase, step=int(step), since=time.time())
        self._dirty = True
        if not step or phase in _SLOW or phase == "done" or time.monotonic() - self._written >= FLUSH_S:
            self.flush()

    def flush(self, older_than_s: float = 0.0) -> None:
        """Write the latest beat if it is not on file yet (and the file is ``older_than_s``)."""
        if self.directory is None or not self._dirty or time.monotonic() - self._written < older_than_s:
            return
        path = self._path(self.rank)
        with self._lock:
            self._dirty = False
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump(self.current, f)
                os.replace(path + ".tmp", path)
            except OSError:
                pass  # a folder that vanished (the run ended) must not fail training
            self._written = time.monotonic()

    def read(self) -> dict[int, dict | None]:
        out: dict[int, dict | None] = {}
        for r in range(self.ranks):
            if r == self.rank:
                out[r] = self.current
                continue
            try:
                with open(self._path(r)) as f:
                    out[r] = json.load(f)
            except (OSError, ValueError):
                out[r] = None
        return out

    def remove(self) -> None:
        if self.directory is not None:
            try:
                os.unlink(self._path(self.rank))
            except OSError:
                pass


class Watchdog(threading.Thread):
    """Deadline of this rank's current phase, judged against everyone's heartbeats."""

    def __init__(self, heartbeats: Heartbeats, step_timeout_s: float, poll_s: float = 0.25):
        super().__init__(daemon=True, name="parallax-step-watchdog")
        self.heartbeats = heartbeats
        self.step_timeout_s = float(step_timeout_s)
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._timeout = 0.0
        self._stop = threading.Event()

    def watch(self, phase: str, step: int, limit=KEEP) -> None:
        """Enter ``phase`` of ``step``. ``limit``: seconds from now (or :data:`STEP`), None to
        leave the phase unwatched, :data:`KEEP` to stay under the running deadline."""
        self.heartbeats.beat(phase, step)
        if limit is KEEP:
            return
        if limit is None:
            self.disarm()
            return
        timeout = self.step_timeout_s if limit is STEP else float(limit)
        with self._lock:
            self._timeout, self._deadline = timeout, time.monotonic() + timeout

    @property
    def wait_limit(self):
        """Deadline of a wait for every rank (a barrier): the step timeout when heartbeats tell
        a slow rank (still tracing, starting) from a hung one, else :data:`SLOW_LIMIT_S`."""
        return STEP if self.heartbeats.directory is not None else SLOW_LIMIT_S

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def stop(self) -> None:
        self._stop.set()
        self.heartbeats.remove()

    def run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.heartbeats.flush(older_than_s=FLUSH_S)
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                timeout = self._timeout
            if not expired:
                continue
            wait_more, error = self.verdict(timeout)
            if wait_more:
                with self._lock:
                    if self._deadline is not None:
                        self._deadline = time.monotonic() + wait_more
                continue
            from ..failures import report_rank_failure

            report_rank_failure(error, os.environ.get(ERROR_DIR_ENV))
            os._exit(3)

    def verdict(self, timeout: float) -> tuple[float, DistributedError | None]:
        """(seconds to wait more, 0 with the error to report)."""
        hb = self.heartbeats
        hb.flush()
        me = hb.current
        now = time.time()
        beats = hb.read()
        mine = _position(me)
        behind = {} if hb.directory is None else {
            r: b for r, b in beats.items() if r != hb.rank and (b is None or _position(b) < mine)}
        for b in behind.values():
            if b is None:
                continue
            age = now - float(b["since"])
            if b["phase"] in _SLOW and age < SLOW_LIMIT_S:
                return SLOW_LIMIT_S - age, None
            if age < timeout:
                return max(timeout - age, self.poll_s), None
        step, phase = me["step"], me["phase"]
        where = f"step {step}" if step else "start-up"
        head = f"rank {hb.rank} on host {hb.host}: {where} did not finish within {timeout:g} s"
        hint = "the rank(s) named are the ones to look at; raise the step timeout if steps are legitimately slow"
        if behind:
            named = "; ".join(self._describe(r, b, now) for r, b in sorted(behind.items()))
            return 0, DistributedError(f"{head}: it waits ({_DOING[phase]}) for rank(s) {sorted(behind)}, which did "
                                       f"not arrive: {named}", hint=hint)
        if phase in ("data", "first batch", "callback", "tracing", "starting"):
            return 0, DistributedError(f"{head}: this rank is the one behind: it has been {_DOING[phase]} for "
                                       f"{now - float(me['since']):.1f} s", hint=hint)
        return 0, DistributedError(f"{head}: every rank is {_DOING[phase]} (a collective is hung: another rank "
                                   "probably failed or stopped)", hint=hint)

    @staticmethod
    def _describe(rank: int, beat: dict | None, now: float) -> str:
        if beat is None:
            return f"rank {rank} has not reported at all"
        where = f"step {beat['step']}" if beat["step"] else "start-up"
        return (f"rank {rank} on host {beat['host']} (pid {beat['pid']}) has been {_DOING[beat['phase']]} "
                f"at {where} for {now - float(beat['since']):.1f} s")


def start_watchdog(step_timeout_s: float, rank: int, ranks: int, host: str) -> Watchdog:
    """A started watchdog whose heartbeats live in the run's shared folder (if any)."""
    heartbeats = Heartbeats(os.environ.get(ERROR_DIR_ENV), rank, ranks, host)
    watchdog = Watchdog(heartbeats, step_timeout_s)
    watchdog.watch("starting", 0, None)
    watchdog.start()
    return watchdog
