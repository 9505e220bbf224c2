"""Asynchronous parameter-server training: every rank serves the partitions it owns from a
thread of its own, and workers pull rows and push gradients without a barrier (issue 16).

How it works
------------
Rows are owned as in the synchronous PS (:mod:`.partitioning`): row ``i`` of a variable split
into ``P`` partitions lives in partition ``p = i mod P`` at local row ``i div P``, owned by rank
``p mod N``. What a rank serves, and what an owner does with it (read rows, apply a push, take
or replace its state), is :mod:`.served_tables`; this module is the messaging around it. Each
rank runs one *serving thread* that receives, on a communicator of its own
(a duplicate of the job's, so nothing it sends can match Horovod's or the trainer's messages):

* ``pull``, ids of one or more variables: answers with their rows, as they are when the
  request is served;
* ``push``, the worker's step and ids and gradients of one or more variables: applies the
  update to its partitions (all of them, or none when one is refused), then acknowledges
  once. Duplicate ids of one push are summed first (as the synchronous PS does), so each
  touched row gets one update per push: with SGD ``w[i] -= lr * sum of the push's gradients
  of row i``, with other optimizers their update (:mod:`.owner_optimizers`);
* ``clock(c)``: worker ``r`` has finished ``c`` steps; ``done``: worker ``r`` has finished.

The training thread of the same rank is the *worker*: :meth:`AsyncPS.pull` (or
:meth:`AsyncPS.pull_many`), :meth:`AsyncPS.push` (or :meth:`AsyncPS.push_many`),
:meth:`AsyncPS.end_step`, :meth:`AsyncPS.close`. What a worker asks of its own rank's
partitions it does itself, in-process, without a message to itself. A step's messages are
one per owner and kind, whatever the number of variables: the trainer pulls all of a step's
dense variables in one :meth:`~AsyncPS.pull_many` and pushes all of its gradients in one
:meth:`~AsyncPS.push_many` (each round trip costs a serving thread's wake-up and a pickled
message, which on a loaded machine is most of a small step).

Exactly once
------------
A push to another rank is one MPI message, received once by its owner's serving thread,
applied in that one handler call, and never re-sent; a push to the own rank is one call.
Nothing retries, so no gradient is applied twice, and MPI loses none (a rank that dies ends
the job with an error, below). Both threads of a rank read and write its partitions under one
lock, so a pull never sees half a push.

Stale-synchronous parallel (SSP)
--------------------------------
``max_staleness = k``: a worker about to start step ``t`` (it has finished ``t`` steps) waits
while ``t - min_r c_r > k``, with ``c_r`` the steps worker ``r`` has finished (a finished
worker counts as infinitely far on). ``k = 0`` is lock-step, ``k = None`` never waits.
:meth:`AsyncPS.end_step` first waits for the acknowledgements of the step's pushes, then sends
its clock to every rank; so when a worker sees ``c_r >= s`` (from its own serving thread's
table), every push of worker ``r``'s steps ``< s`` is already applied at its owner, and a pull
sent after that sees it. Read guarantee: a pull of step ``t`` sees every push of every
worker's steps ``< t - k`` and this worker's own pushes of steps ``< t``. Waiting for the
acknowledgements also bounds how many pushes a fast worker can leave queued at an owner.

Unbounded (``k = None``) nothing waits for clocks, so a worker does not wait for its
acknowledgements at the end of a step but before its next push (and before a snapshot or its
end): they come back while it computes its next step, a round trip less per step, and an
owner still holds at most one step of a worker's pushes. Its own pushes are still in its next
pulls: an owner serves one worker's messages in the order they were sent (MPI keeps them in
order on one communicator, and one thread serves them), the push before the pull. Its clock
may then count a step whose pushes are not yet applied; only the measured staleness reads it.

Consistent snapshot
-------------------
:meth:`AsyncPS.snapshot`, called by every worker after the same number of steps ``c``,
returns this rank's partitions holding exactly the pushes of every worker's steps ``< c`` and
none of its later ones: each worker asks every owner for the snapshot after its step
``c - 1`` was acknowledged; an owner copies its partitions once all ``N`` have asked (before
that it keeps serving the workers still before ``c``), and a worker goes on only when every
owner has copied (so none of its pushes of step ``c`` can precede a copy). It is a barrier
at that step, and it is the state synchronous training would reach after ``c`` steps up to
the order of floating-point additions. A worker that finished before ``c`` (it stopped after
``d < c`` steps) is counted by its ``done``, which an owner receives after all its pushes: the
snapshot holds all of its ``d`` steps, which are again exactly its steps ``< c``. A worker may
ask to stop with its ask; every owner sees every ask, so every worker learns the same answer
(:attr:`AsyncPS.stop_agreed`) and all can stop together at that step. :meth:`AsyncPS.close`
returns the final state: all pushes of all workers.

One poller per rank
-------------------
The serving thread is the only thread of a rank that polls MPI: it receives the requests of
the other ranks' workers and the replies to its own worker (rows, acknowledgements,
snapshots), which it files by (sender, tag) and hands over through ``_state``; the worker (or
the TensorFlow thread running a step's pull) sleeps on that condition until its reply is
there. Each poll is one ``Iprobe`` per communicator (a C call); pkl5's message probe runs only
when something is there. A whole variable (a PS dense one) is pulled and pushed as its
owners' partitions, without row ids. On loopback, 4 ranks of the LM small on 2 cores, these
took an asynchronous step from 29-32 ms to 19-20 ms, 2.1-2.5x to 1.3-1.5x the time of a
synchronous one (``benchmarks/README.md``).

Shutdown
--------
:meth:`AsyncPS.close`: the worker waits for its acknowledgements, tells every rank it is done,
and its serving thread goes on serving the others until all ``N`` workers said done. MPI
keeps each sender's messages in order, so a worker's ``done`` is the last message an owner
gets from it: the queue is empty when the last one arrives, and the thread ends. Then the
ranks pass a barrier, so none leaves while another still exchanges with it: the end of one
rank (MPI finalised at the end of a rank started by ``run_on_ranks``) ends MPI under the
other ranks too (measured: a rank still polling MPI from a second thread crashed with a
segmentation fault when the other rank exited, 3 of 3 runs; with a barrier before leaving,
3 of 3 clean). Every wait (a reply, an acknowledgement, an SSP turn, a snapshot, the end)
has a deadline (``timeout_s``) and then raises :class:`~parallax_nb.errors.DistributedError` naming the
rank(s) waited for; after that the instance refuses every call but ``close()`` (a reply that
came late could otherwise answer a later request). A serving thread that is told to stop
leaves within one poll pause.

A worker that fails (its step raised) calls :meth:`AsyncPS.abort`: it sends every other rank
an ``abort`` naming itself, its host and its error, and stops its serving thread. An owner
that receives it records the failure and stops serving; its worker raises a
:class:`~parallax_nb.errors.DistributedError` naming the failed rank at its next wait (a pull
from another rank, an acknowledgement, an SSP turn, a snapshot, the end; in every case within
one poll), so every rank ends with an error instead of waiting ``timeout_s`` for a rank that
will not answer. A rank killed outright (SIGKILL) sends nothing: its launcher (``mpirun``, the
engines' ``mpiexec``) sees it die and ends the other ranks.

Why this mechanism (measured here, Open MPI 4.1.4, mpi4py 4.1.1, TensorFlow 2.18, Horovod
0.28.1; 2 ranks on a 2-core machine another job was loading: figures are medians of a few
hundred requests of 1,000 rows x 64 float32 from a 4,096-row partition)
-------------------------------------------------------------------------------------------
Inside a rank that ran ``hvd.init()``, ``MPI.Query_thread()`` is ``MPI_THREAD_MULTIPLE``
(Horovod asks for it), so a second thread may call MPI.

* **MPI one-sided windows** (passive target: ``Win.Lock`` / ``Get`` / ``Accumulate``).
  Ranks sharing memory (``btl self,vader``): Get 1.0-1.1 ms, Accumulate(SUM) 2.0-10 ms, and
  no stall while the target computes in TensorFlow (single-copy transfers need no target).
  Across machines (``btl tcp,self``, what the emulated network and Ethernet clusters use):
  at ``MPI_THREAD_MULTIPLE`` Open MPI 4.1.4 cannot create a window at all (``osc pt2pt``:
  "does not support MPI_THREAD_MULTIPLE in this release"; ``osc rdma``: no RDMA-capable
  transport), and Open MPI is built without an asynchronous progress thread ("OMPI
  progress: no"). Without Horovod, at ``MPI_THREAD_SERIALIZED``, ``osc pt2pt`` works, but a
  ``Get`` stalled 2998 ms while the target slept in Python for 3 s and 3021 ms while it ran
  TensorFlow matmuls for 3 s (0.07 ms while the target sat in ``MPI_Barrier``): a target
  busy computing answers only when it next enters MPI. And Accumulate can only add: no
  Adam on the owner. Rejected.
* **A serving thread per rank on its own communicator** (this module; ``mpi4py.util.pkl5``
  messages, the thread polls and sleeps 50 us doubling to 1 ms while idle).
  This module, ``benchmarks/bench_async_ps.py`` (one invocation each; pull, then push until
  applied and acknowledged): shared memory, owner idle: pull 0.60 ms, push 0.60 ms (p90 1.4
  / 1.8 ms); owner's main thread running TensorFlow matmuls: 1.13 / 1.18 ms (p90 3.4 ms).
  TCP: 1.13 / 1.35 ms idle, 1.52 / 1.87 ms busy. No stall: the serving thread is always in
  MPI, and TensorFlow releases the GIL while it computes. Idle cost, CPU seconds per second
  of one rank (probe): Horovod alone 0.21-0.22, with the polling thread 0.34-0.47, with a
  thread blocked in ``MPI_Recv`` instead 0.59-0.61 (Open MPI's blocking receive spins); the
  blocking thread also answered pulls in 20 ms (median) while its rank computed, against
  1.8 ms polling. Chosen: the polling thread.
* **TensorFlow's ParameterServerStrategy**: not measured; two eager workers connecting to
  one PS task hung here (DESIGN.md section 3), and it would be a second runtime beside MPI.

The owner's update is an :class:`~.owner_optimizers.OwnerRule` (the user's Keras optimizer's
update on numpy arrays), called under the rank's lock by whichever thread applies the push,
with the partition, its slots and the pushing worker's step. The slots are served state like
the partitions: snapshots, :meth:`AsyncPS.load` and :meth:`AsyncPS.close` carry them under
``"<variable>:<slot>"``, the checkpoint's keys.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError, DistributedError, SetupError
from ..failures import peer_failure_message
from .served_tables import ServedTable, ServedTables, sum_duplicates

#: the serving thread and a waiting worker poll MPI and sleep between polls, from
#: MIN_PAUSE_S doubling to MAX_PAUSE_S while nothing comes (measured: an idle serving thread
#: costs 0.1-0.25 of a core)
MIN_PAUSE_S = 50e-6
MAX_PAUSE_S = 1e-3
DEFAULT_TIMEOUT_S = 60.0
#: abort() waits at most this long for its messages to leave (a process that exits right
#: after could otherwise drop them on a TCP link)
ABORT_SEND_S = 1.0

# message tags: worker -> server on the request communicator, server -> worker on the reply one
PULL, PUSH, CLOCK, DONE, SNAPSHOT, ABORT = 1, 2, 3, 4, 5, 6
ROWS, ACK, SNAPSHOT_TAKEN = 11, 12, 13


def mpi():
    """mpi4py's MPI, initialised the way the runtime expects (:func:`.context.horovod`: mpi4py
    starts MPI, then Horovod joins it). Refused when a second thread may not call MPI."""
    from .context import horovod

    horovod()
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise SetupError(f"MPI runs at thread level {MPI.Query_thread()}, asynchronous PS needs "
                         f"MPI_THREAD_MULTIPLE ({MPI.THREAD_MULTIPLE}) for its serving thread",
                         hint="start MPI through Horovod (hvd.init) or with mpi4py.rc.thread_level = 'multiple'")
    return MPI


class AsyncPS:
    """Asynchronous PS of one rank: the serving thread of its partitions and the worker's calls.

    Collective to create (every rank of ``comm``, default the world, in the same order): it
    duplicates ``comm`` twice and starts the serving thread. Use as a context manager or call
    :meth:`close`. ``tables``: the variables served, each partitioned over ``comm``'s ranks;
    ``update``: the owner's optimizer step on one partition (an
    :class:`~.owner_optimizers.OwnerRule`, e.g. :class:`~.owner_optimizers.SGD`).
    ``steps_ahead[t]``: how many steps this worker was ahead of the slowest when it started
    step ``t`` (after any SSP wait): the measured staleness. ``traffic[name]``: per peer rank,
    the payload bytes this rank handed to MPI for it and received from it (``[sent,
    received]``: ids, rows and gradients of pulls and pushes, as worker and as owner; not the
    pickle framing), counted as the messages are sent and received.
    """

    def __init__(self, tables: list[ServedTable], update, max_staleness: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, comm=None):
        if max_staleness is not None and (isinstance(max_staleness, bool) or not isinstance(max_staleness, int)
                                          or max_staleness < 0):
            raise ConfigError(f"max_staleness must be None or a whole number >= 0, got {max_staleness!r}",
                              hint="pass max_staleness=None for fully asynchronous training, 0 for lock-step")
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        MPI = self._MPI = mpi()
        from mpi4py.util import pkl5

        comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.served = ServedTables(tables, update, self.rank, self.ranks)   # read and written under _state
        self.traffic = {t.name: np.zeros((self.ranks, 2)) for t in tables}
        self.update = update
        self.max_staleness = max_staleness
        self.timeout_s = float(timeout_s)
        self._requests = pkl5.Intracomm(comm.Dup())   # workers -> serving threads
        self._replies = pkl5.Intracomm(comm.Dup())    # serving threads -> workers
        self.step = 0
        self.steps_ahead: list[int] = []
        self._turn_taken = -1
        self._unacked = [0] * self.ranks
        self._sends: list = []
        self._inbox: dict[tuple[int, int], collections.deque] = {}   # (source, tag) -> replies to this worker
        # what both threads of this rank share, under one lock: the partitions, every worker's
        # clock, who is done, the snapshots asked for and taken
        self._state = threading.Condition()
        self._clocks = [0] * self.ranks
        self._done: set[int] = set()
        self._snapshot_asks: dict[int, set[int]] = {}
        self._snapshot_stops: dict[int, bool] = {}
        self._snapshots: dict[int, tuple[dict[str, dict[int, np.ndarray]], bool]] = {}
        self.stop_agreed = False   # the last snapshot: did any worker ask to stop there
        self._server_error: BaseException | None = None
        self._peer_error: DistributedError | None = None   # another rank failed and said so (ABORT)
        self._heard = time.monotonic()   # when another rank last sent something
        self._stop = threading.Event()
        self._closed = False
        self._failed: DistributedError | None = None   # a wait that timed out: only close() is left
        self._thread = threading.Thread(target=self._serve, name=f"px-async-ps-server-{self.rank}", daemon=True)
        self._thread.start()

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], partitions: int, update, **kwargs) -> "AsyncPS":
        """Serve whole initial arrays (the same on every rank), each split into ``partitions``;
        this rank keeps only the partitions it owns."""
        comm = kwargs.get("comm") or mpi().COMM_WORLD
        tables = [ServedTable.from_array(name, array, partitions, comm.Get_size(), comm.Get_rank())
                  for name, array in arrays.items()]
        return cls(tables, update, **kwargs)

    # ----- worker side -------------------------------------------------------------------

    def pull(self, name: str, ids) -> np.ndarray:
        """Rows ``ids`` (any shape of int ids, duplicates allowed) of variable ``name`` as their
        owners hold them now: shape ``ids.shape + row_shape``. Waits first for its SSP turn."""
        return self.pull_many({name: ids})[name]

    def pull_many(self, wanted: dict) -> dict[str, np.ndarray]:
        """:meth:`pull` of several variables at once (name -> ids, or None for the whole
        variable, sent as its partitions): one request to each owner for all of them, so a
        step that reads several variables waits for one round trip."""
        self._check_usable()
        tables = self.served.tables
        asked: dict[str, "_Asked | None"] = {}   # None: the whole variable
        for name, ids in wanted.items():
            table = self.served.table(name)
            if ids is None:
                asked[name] = None
                continue
            ids = np.asarray(ids, dtype=np.int64)
            unique, inverse = np.unique(ids.reshape(-1), return_inverse=True)
            asked[name] = _Asked(ids, unique, inverse, self.served.owners(table, unique))
        self.wait_turn()
        remote = {}   # owner -> the names asked of it, in order
        for name, a in asked.items():
            owners = tables[name].partitioning.owner_ranks() if a is None else np.unique(a.owners).tolist()
            for owner in owners:
                if owner != self.rank:
                    remote.setdefault(owner, []).append(name)
        for owner, names in remote.items():
            request = [(name, None if asked[name] is None else asked[name].unique[asked[name].owners == owner])
                       for name in names]
            self._send(request, owner, PULL)
            for name, ids in request:
                self._count(name, owner, _nbytes(ids), 0)
        rows = {name: np.empty((len(a.unique),) + tables[name].row_shape, tables[name].dtype)
                for name, a in asked.items() if a is not None}
        parts: dict[str, dict[int, np.ndarray]] = {name: {} for name, a in asked.items() if a is None}
        with self._state:
            for name, a in asked.items():
                if a is None:
                    parts[name].update(self.served.whole(name))
                    continue
                mine = a.owners == self.rank
                if np.any(mine):
                    rows[name][mine] = self.served.rows(name, a.unique[mine])
        for owner, names in remote.items():
            got = self._receive(owner, ROWS, f"the pull of {', '.join(map(repr, names))}")
            for name, part in zip(names, got):
                self._count(name, owner, 0, _nbytes(part))
                if asked[name] is None:
                    parts[name].update(part)
                else:
                    rows[name][asked[name].owners == owner] = part
        return {name: (tables[name].partitioning.assemble(parts[name]) if a is None else
                       rows[name][a.inverse].reshape(a.ids.shape + tables[name].row_shape))
                for name, a in asked.items()}

    def push(self, name: str, ids, grads) -> None:
        """Send the gradients ``grads`` of rows ``ids`` (``grads.shape = ids.shape + row_shape``)
        to their owners (applied at once when this rank owns them); returns without waiting.
        Duplicate ids are summed here, before sending."""
        self.push_many([(name, ids, grads)])

    def push_many(self, pushes: list[tuple]) -> None:
        """:meth:`push` of several variables at once ((name, ids, grads) each; ids None: ``grads``
        is the whole variable's gradient, sent as its partitions): one message to each owner for
        all of them, applied by the owner together (all of it or, when a part is refused, none
        of it) and acknowledged once."""
        self._check_usable()
        outgoing: dict[int, list] = {}   # owner -> [(name, ids, grads)]
        for name, ids, grads in pushes:
            table = self.served.table(name)
            if ids is None:
                for owner, by_partition in self.served.split_whole(table, grads).items():
                    outgoing.setdefault(owner, []).append((name, None, by_partition))
                continue
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            grads = np.asarray(grads, dtype=table.dtype).reshape((len(ids),) + table.row_shape)
            ids, grads = sum_duplicates(ids, grads)
            owners = self.served.owners(table, ids)
            for owner in np.unique(owners).tolist():
                mine = owners == owner
                outgoing.setdefault(owner, []).append((name, ids[mine], grads[mine]))
        if self.max_staleness is None:
            self._await_acks()   # the previous step's, deferred by end_step (module docstring)
        if self.rank in outgoing:
            with self._state:
                self.served.apply(self.step, outgoing.pop(self.rank))
        for owner, items in outgoing.items():
            self._send((self.step, items), owner, PUSH)
            for name, ids, grads in items:
                self._count(name, owner, _nbytes(ids) + _nbytes(grads), 0)
            self._unacked[owner] += 1

    def end_step(self) -> None:
        """This worker finished a step: wait until its pushes are applied (under SSP; unbounded,
        before the next push), then tell every rank."""
        self._check_usable()
        if self.max_staleness is not None:
            self._await_acks()
        self.step += 1
        with self._state:
            self._clocks[self.rank] = self.step
        for rank in self._others():
            self._send(self.step, rank, CLOCK)

    def wait_turn(self) -> None:
        """Wait while this worker is more than ``max_staleness`` steps ahead of the slowest
        (once per step; :meth:`pull` calls it)."""
        if self._turn_taken == self.step:
            return
        k, t = self.max_staleness, self.step
        deadline, seen = time.monotonic() + self.timeout_s, None
        with self._state:
            while True:
                self._raise_server_error()
                slowest = min([self._clocks[r] for r in self._others()] + [t])
                if k is None or t - slowest <= k:
                    break
                if slowest != seen:   # the slowest moved on: a new deadline for the next step
                    deadline, seen = time.monotonic() + self.timeout_s, slowest
                left = deadline - time.monotonic()
                if left <= 0:
                    behind = [r for r in self._others() if t - self._clocks[r] > k]
                    raise self._give_up(
                        f"rank {self.rank} waited {self.timeout_s:g} s to start step {t} (max_staleness={k}) for "
                        f"rank(s) {behind}, still at step(s) {[self._clocks[r] for r in behind]}",
                        hint="a rank that stopped or died; raise timeout_s if it is only slow")
                self._state.wait(min(left, 0.1))
        self.steps_ahead.append(int(t - slowest))
        self._turn_taken = t

    def snapshot(self, stop: bool = False) -> dict[str, dict[int, np.ndarray]]:
        """This rank's partitions (and their optimizer slots, under ``"name:slot"``) holding
        exactly the pushes of every worker's steps before ``self.step`` (module docstring).
        Collective: every worker that has not finished calls it after the same number of steps
        (a worker that finished earlier, after fewer steps, is counted with all its pushes: it
        has no step at or after ``self.step``).

        ``stop``: this worker wants to stop here; afterwards :attr:`stop_agreed` says whether
        any worker asked, the same on every worker (every owner saw every ask)."""
        self._check_usable()
        self._await_acks()
        at = self.step
        for rank in self._others():
            self._send((at, bool(stop)), rank, SNAPSHOT)
        self._reply_all(self._snapshot_asked(self.rank, at, bool(stop)))
        for rank in self._others():
            self._receive(rank, SNAPSHOT_TAKEN, f"the snapshot at step {at}")
        with self._state:   # this rank's own copy: taken when the last worker asked it
            if not self._state.wait_for(lambda: at in self._snapshots or self._server_error or self._peer_error,
                                        self.timeout_s):
                missing = sorted(set(range(self.ranks)) - self._snapshot_asks.get(at, set()) - self._done)
                raise self._give_up(f"rank {self.rank} waited {self.timeout_s:g} s for rank(s) {missing} to "
                                    f"reach the snapshot at step {at}", hint="a rank that stopped or died")
            self._raise_server_error()
            parts, self.stop_agreed = self._snapshots.pop(at)
            return parts

    def load(self, parts: dict[str, dict[int, np.ndarray]], step: int) -> None:
        """Serve ``parts`` from now on, as the state after ``step`` steps of every worker (a
        resumed checkpoint): this rank's partitions of every variable (name -> partition ->
        array) and of every slot of the owners' optimizer (``"name:slot"`` -> partition ->
        array, as :meth:`snapshot` returns them); this worker's step count and every worker's
        clock start there. Call it on every rank before any worker pulls or pushes (then pass
        a barrier): a pull served before would read the old values. Everything is checked
        before anything is replaced."""
        self._check_usable()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"step must be a whole number >= 0, got {step!r}")
        with self._state:
            self.served.replace(parts)
            self.step = step
            self._clocks = [max(c, step) for c in self._clocks]
            self._state.notify_all()

    def close(self) -> dict[str, dict[int, np.ndarray]]:
        """Say done, serve the others until all are done, stop; return this rank's final
        partitions and slots (every push of every worker applied; keys as :meth:`snapshot`).
        Raises naming the ranks that sent nothing for ``timeout_s`` and never said done; the
        serving thread is stopped either way."""
        if self._closed:
            return self._final()
        self._closed = True
        clean = False
        try:
            self._raise_peer_error()
            self._await_acks()
            for rank in self._others():
                self._send(None, rank, DONE)
            self._reply_all(self._finished(self.rank))
            self._heard = time.monotonic()
            while self._thread.is_alive():   # serving the others until they are done too
                self._thread.join(0.05)
                if self._thread.is_alive() and time.monotonic() - self._heard > self.timeout_s:
                    with self._state:
                        missing = sorted(set(range(self.ranks)) - self._done)
                    raise DistributedError(f"rank {self.rank} finished; rank(s) {missing} sent nothing for "
                                           f"{self.timeout_s:g} s and never finished", hint="a rank that stopped or died")
            self._raise_server_error()
            self._wait_sends()
            self._barrier("every rank's end")
            clean = True
        finally:
            self._stop.set()
            self._thread.join(1.0)
            if clean:   # else left allocated: see abort()
                self._requests.Free()
                self._replies.Free()
        return self._final()

    def abort(self, error: BaseException) -> None:
        """End this rank's part after ``error`` without waiting for anyone: tell every other
        rank that this one failed (their next wait raises a :class:`DistributedError` naming
        this rank, its host and ``error``; not when ``error`` is another rank's failure, which
        every rank heard already), and stop the serving thread. Nothing pending is waited for
        beyond :data:`ABORT_SEND_S`.

        The two communicators stay allocated: a message already on its way to this rank
        would stay queued on a freed communicator's context id and could be matched by the
        next communicator given that id (Open MPI reuses them); on a live one it is never
        received. (Two communicators per failed run.)"""
        if self._closed:
            return
        self._closed = True
        try:
            if self._peer_error is None:
                import socket

                text = f"{type(error).__name__}: {getattr(error, 'message', error)}"
                sends = [self._requests.isend((text, socket.gethostname()), rank, ABORT) for rank in self._others()]
                deadline = time.monotonic() + ABORT_SEND_S
                while sends and time.monotonic() < deadline:
                    sends = [r for r in sends if not r.test()[0]]
                    time.sleep(MIN_PAUSE_S)
        finally:
            self._stop.set()
            self._thread.join(1.0)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.abort(value)

    def _barrier(self, what: str) -> None:
        """Wait until every rank reaches this point (polled, raising after ``timeout_s``)."""
        request = self._requests.Ibarrier()
        deadline = time.monotonic() + self.timeout_s
        while not request.Test():
            if time.monotonic() > deadline:
                raise DistributedError(f"rank {self.rank} waited {self.timeout_s:g} s for {what}",
                                       hint="a rank that stopped or died")
            time.sleep(MAX_PAUSE_S)

    def _others(self) -> list[int]:
        return [r for r in range(self.ranks) if r != self.rank]

    def _final(self) -> dict[str, dict[int, np.ndarray]]:
        with self._state:
            return self.served.state()

    def _send(self, payload, rank: int, tag: int) -> None:
        self._sends.append(self._requests.isend(payload, rank, tag))

    def _reply_all(self, replies: list[tuple[int, int, object]]) -> None:
        """Replies this thread owes after serving its own worker (a snapshot it completed)."""
        from mpi4py.util import pkl5

        pkl5.Request.waitall([self._replies.isend(payload, rank, tag) for rank, tag, payload in replies])

    def _wait_sends(self) -> None:
        from mpi4py.util import pkl5

        pkl5.Request.waitall(self._sends)
        self._sends = []

    def _await_acks(self) -> None:
        for owner in self._others():
            while self._unacked[owner]:
                self._receive(owner, ACK, "the acknowledgement of a push")
                self._unacked[owner] -= 1
        self._wait_sends()

    def _receive(self, source: int, tag: int, what: str):
        """The next reply ``tag`` from ``source``'s serving thread, until ``timeout_s``: received
        by this rank's serving thread (the rank's one poller), which wakes the waiting worker."""
        deadline = time.monotonic() + self.timeout_s
        with self._state:
            while True:
                queue = self._inbox.get((source, tag))
                if queue:
                    got = queue.popleft()
                    break
                self._raise_server_error()
                if not self._thread.is_alive():   # stopped: nobody else receives the replies
                    message = self._replies.improbe(source, tag)
                    if message is not None:
                        got = message.recv()
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._give_up(f"rank {self.rank} waited {self.timeout_s:g} s for {what} from rank {source}",
                                        hint=f"rank {source} stopped serving or died")
                self._state.wait(min(left, 0.05) if self._thread.is_alive() else MAX_PAUSE_S)
        if isinstance(got, BaseException):
            raise got
        return got

    def traffic_now(self) -> dict[str, np.ndarray]:
        """A copy of :attr:`traffic` as counted so far (both threads count into it)."""
        with self._state:
            return {name: counts.copy() for name, counts in self.traffic.items()}

    def _count(self, name: str, peer: int, sent: int, received: int) -> None:
        """Payload bytes handed to MPI for ``peer`` and received from it (``traffic``)."""
        counts = self.traffic.get(name)
        if counts is not None:
            with self._state:   # both threads count
                counts[peer, 0] += sent
                counts[peer, 1] += received

    def _give_up(self, message: str, hint: str) -> DistributedError:
        """The error of a wait that timed out; the instance refuses every later call but close():
        a reply that comes late could otherwise answer a later request."""
        self._failed = DistributedError(message, hint=hint)
        return self._failed

    def _check_usable(self) -> None:
        self._raise_peer_error()
        if self._failed is not None:
            raise DistributedError(f"rank {self.rank}'s asynchronous PS gave up earlier ({self._failed.message})",
                                   hint="close() it: after a timeout a late reply could answer a later request")

    def raise_failure(self) -> None:
        """Raise what ended this instance, if anything did: another rank's failure, a wait that
        timed out, or the serving thread's error (for a caller that met it wrapped, e.g. by
        TensorFlow around a pull made inside a step)."""
        self._raise_server_error()
        if self._failed is not None:
            raise DistributedError(self._failed.message, hint=self._failed.hint)

    def _raise_peer_error(self) -> None:
        error = self._peer_error
        if error is not None:   # a fresh exception each time: its traceback is this call's
            raise DistributedError(error.message, hint=error.hint)

    def _raise_server_error(self) -> None:
        self._raise_peer_error()
        if self._server_error is not None:
            raise DistributedError(f"rank {self.rank}'s serving thread failed: {self._server_error!r}") \
                from self._server_error

    # ----- serving thread ----------------------------------------------------------------

    def _serve(self) -> None:
        """Serve the other ranks' workers until every worker is done (or told to stop)."""
        MPI = self._MPI
        status = MPI.Status()
        pending: list = []
        pause = 0.0
        try:
            while len(self._done) < self.ranks and not self._stop.is_set():
                # Iprobe (one C call) first: pkl5's improbe costs far more Python, every poll
                busy = False
                if MPI.Comm.Iprobe(self._replies, MPI.ANY_SOURCE, MPI.ANY_TAG):
                    busy = True   # a reply for this rank's worker, which waits for it on _state
                    reply = self._replies.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                    key, got = (status.Get_source(), status.Get_tag()), reply.recv()
                    with self._state:
                        self._inbox.setdefault(key, collections.deque()).append(got)
                        self._state.notify_all()
                if MPI.Comm.Iprobe(self._requests, MPI.ANY_SOURCE, MPI.ANY_TAG):
                    busy = True
                    message = self._requests.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                    source, tag = status.Get_source(), status.Get_tag()
                    self._heard = time.monotonic()
                    for rank, reply_tag, payload in self._handle(source, tag, message.recv()):
                        pending.append(self._replies.isend(payload, rank, reply_tag))
                    if self._peer_error is not None:
                        return   # the job is over: every rank heard it, none waits for this thread
                if busy:
                    pause = 0.0
                    continue
                pending = [r for r in pending if not r.test()[0]]
                time.sleep(pause)
                pause = min(MAX_PAUSE_S, max(2 * pause, MIN_PAUSE_S))
            deadline = time.monotonic() + self.timeout_s
            while pending and time.monotonic() < deadline and not self._stop.is_set():
                pending = [r for r in pending if not r.test()[0]]
                time.sleep(MIN_PAUSE_S)
        except BaseException as exc:  # noqa: BLE001 - the worker raises it (it waits on this thread)
            with self._state:
                self._server_error = exc
                self._state.notify_all()

    def _handle(self, source: int, tag: int, payload) -> list[tuple[int, int, object]]:
        """Serve one request from another rank; the replies to send as (rank, tag, payload)."""
        if tag == PULL:   # [(name, ids)] -> [rows] in the same order
            with self._state:
                rows = self._guarded(lambda: [self.served.whole(name) if ids is None else self.served.rows(name, ids)
                                              for name, ids in payload])
                for i, (name, ids) in enumerate(payload):
                    self._count(name, source, _nbytes(rows[i]) if isinstance(rows, list) else 0, _nbytes(ids))
                return [(source, ROWS, rows)]
        if tag == PUSH:   # (the worker's step, [(name, ids, grads)]), applied together
            step, items = payload
            with self._state:
                for name, ids, grads in items:
                    self._count(name, source, 0, _nbytes(ids) + _nbytes(grads))
                return [(source, ACK, self._guarded(self.served.apply, step, items))]
        if tag == CLOCK:
            with self._state:
                self._clocks[source] = max(self._clocks[source], payload)
                self._state.notify_all()
        elif tag == DONE:
            return self._finished(source)
        elif tag == SNAPSHOT:
            return self._snapshot_asked(source, *payload)
        elif tag == ABORT:
            text, host = payload
            with self._state:
                self._peer_error = DistributedError(peer_failure_message(self.rank, source, host, text),
                                                    hint=f"rank {source}'s error is the cause; every rank of the job "
                                                         "stopped")
                self._state.notify_all()
        return []

    def _finished(self, rank: int) -> list[tuple[int, int, object]]:
        """Worker ``rank`` is done; the replies owed for snapshots it completes (it will never ask)."""
        with self._state:
            self._done.add(rank)
            self._clocks[rank] = _FINISHED
            self._state.notify_all()
            return self._take_complete_snapshots()

    def _snapshot_asked(self, rank: int, at: int, stop: bool = False) -> list[tuple[int, int, object]]:
        """Worker ``rank`` asks for the snapshot after ``at`` steps (``stop``: and wants to stop
        there); the ask that completes it takes it and is owed the other workers' replies."""
        with self._state:
            self._snapshot_asks.setdefault(at, set()).add(rank)
            self._snapshot_stops[at] = self._snapshot_stops.get(at, False) or stop
            return self._take_complete_snapshots()

    def _take_complete_snapshots(self) -> list[tuple[int, int, object]]:
        """(Under ``_state``.) Take every snapshot that every worker asked for or finished
        before (a copy of this rank's partitions); the replies owed to the other askers."""
        replies = []
        for at in sorted(self._snapshot_asks):
            asked = self._snapshot_asks[at]
            if len(asked | self._done) < self.ranks:
                continue
            del self._snapshot_asks[at]
            stop = self._snapshot_stops.pop(at)
            if self.rank in asked:
                self._snapshots[at] = (self.served.state(), stop)
            replies += [(r, SNAPSHOT_TAKEN, (at, stop)) for r in sorted(asked) if r != self.rank]
            self._state.notify_all()
        return replies

    def _guarded(self, serve, *args):
        try:
            return serve(*args)
        except Exception as exc:  # noqa: BLE001 - sent back to the worker that asked, which raises it
            return exc

class _Asked(NamedTuple):
    """One variable's rows asked for by a pull: the ids as given, their unique values, where
    each id is among them, and each unique id's owner rank."""

    ids: np.ndarray
    unique: np.ndarray
    inverse: np.ndarray
    owners: np.ndarray


def _nbytes(payload) -> int:
    """Bytes of the arrays in a message part: an array, a dict of arrays, or None."""
    if payload is None:
        return 0
    if isinstance(payload, dict):
        return sum(a.nbytes for a in payload.values())
    return payload.nbytes


#: the clock of a worker that said done: it never holds anyone back again
_FINISHED = float("inf")
