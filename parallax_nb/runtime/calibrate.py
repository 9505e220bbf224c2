"""The rank side of a calibration: time the collectives the runtime issues, the job's compute
under the real placement, and Horovod's idle traffic on each machine's link.

Every rank calls :func:`measure_on_rank` with the same arguments (``px.calibrate`` and
``python -m parallax_nb calibrate`` start them under ``mpirun``); each returns its own raw
figures and the launcher fits them (:func:`parallax_nb.calibration.fit_collective`).

In order, identical on every rank:

1. Horovod is initialised as the runtime does it, the topology found as the runtime finds it
   (:func:`.topology.gather_topology`: hosts, or ``workers_per_machine``), and with machines
   of several ranks the machines' process sets are added by :class:`.hierarchical.Hierarchy`,
   as in a run with local aggregation.
2. **Compute** (with a job): every rank builds the model as the runtime does (its Keras
   ``Embedding`` layers read through :func:`parallax_nb.ops.embedding_lookup`,
   :func:`.sharded.route_embedding_layers`) and runs :func:`.reference.single_device_step`
   (forward, backward, optimizer update; no communication) on its own shard of the per-rank
   batch, all ranks at once after a barrier, so ranks that share cores or a device slow each
   other as they will in the run. ``warmup_steps`` untimed (the first traces), then at least
   ``compute_steps`` timed, and as many more as fill :data:`COMPUTE_MIN_S` (at most
   :data:`COMPUTE_MAX_STEPS`); each rank reports its median. A timed step includes taking its
   batch from the job's data, as a training loop pays it every step (the recommender's batch
   of 64 took 0.25-0.30 ms on one rank, a step of 0.73-0.99 ms timed on batches taken before,
   2026-11-30; until then the batches were taken before the timing). The routing matters: Keras's own
   ``Embedding`` reads the whole table (``ReadVariableOp``) and gathers from the copy; once the
   optimizer has written rows of that table (a sparse update), TensorFlow keeps the variable
   in copy-on-read mode and every such read copies the whole table (measured: 13.8 ms per
   step for a 100,000 x 256 float32 table against 0.45 ms for the runtime's gather of the
   rows), which the runtime never pays.
   Plain Horovod as users run it pays it: with sparse gradients, the same timing follows for
   the baselines that run the model as Keras builds it (``baselines``): ``horovod``, its
   ``IndexedSlices`` applied as they come, and ``sparse_as_dense``, them densified first. A
   model with no sparse gradient runs the runtime's program under both, and is timed once.
3. **Coordination**: all ranks idle for ``idle_s`` seconds while Horovod's background loop
   runs under the ranks' own Horovod settings (``HOROVOD_CYCLE_TIME`` and the others of
   :data:`parallax_nb.calibration.HOROVOD_TIMING_SETTINGS`, reported as ``horovod_env``);
   local rank 0 of each machine reads its link's kernel counters (``link_interface``, e.g.
   ``eth0`` of an emulated machine) before and after. The same counters are read around the
   timed compute steps of step 2 (``busy_link``; without a job around ``idle_s`` seconds of
   matrix products on every rank): with the cores busy Horovod's loop negotiates far less
   often than idle (measured on 2 x 2 ranks, 2 cores, 1 Gbit/s, ``HOROVOD_CYCLE_TIME=0.1``:
   5.9 MB/s idle, 3-23 KB/s while the LM computes), and a step is mostly busy.
4. **Collectives**, each op and scope at every size of ``sizes_bytes`` (bytes one rank hands
   to a call: the allreduce tensor, the own allgather slice, the whole alltoall input),
   inside one ``tf.function`` per op and scope with a ``[None]`` float32 input (traced once):
   a chain of ``chain`` calls, each fed the previous one's output so they run one after the
   other (independent calls would be fused by Horovod). One untimed chain, then ``repeats``
   timed chains, each after a barrier; per-call time = chain time / ``chain``, the rank's
   median over repeats. Scopes, as the runtime issues them:

   * ``all``: over every rank (equal alltoall splits);
   * ``machine``: in the machine's process set (:meth:`.hierarchical.Hierarchy.alltoall`);
   * ``cross``: alltoall over all ranks with zero-length parts to every rank but the own
     local index on the other machines (the runtime's cross steps). The runtime issues no
     allreduce or allgather across machines alone, and they are not timed: they would need a
     Horovod process set per local index, that is two restarts of Horovod (to add the sets
     and to remove them again), and a restart is where calibrations on a notebook's engines
     stalled (:mod:`.context`). Their fits had fed only the medians of the link's framing and
     pace; re-read without them, the saved runs of 2026-11-28/29 predicted within the same
     median and largest error (``benchmarks/README.md``).

   With a link to read, local rank 0 of each machine also reads its counters around each
   timed chain (after its barrier): the median over the chains of the link bytes and packets
   per call (``link_per_call``). At the smallest size, where a call's link bytes are mostly
   its own overhead (headers, ACKs, Horovod's negotiation while it runs), the reading comes
   from ``link_chain`` calls per chain instead: a call's overhead rises with its duration at
   about Horovod's idle rate, and the first call of a chain waits for the loop's next cycle,
   so three calls scatter. Measured on 2 x 2 ranks at 1 Gbit/s, six readings of one start
   each: an alltoall across machines 3.09 KB per call, standard deviation 137 B, in chains of
   3; 2.95 KB, 61 B in chains of 12 (inside a machine 133 B against 22 B).

   Below ``stride_below`` bytes a call is also timed **in stride**: ``repeats`` chains of
   ``link_chain`` calls, and ``(T(link_chain) - T(chain)) / (link_chain - chain)`` of the two
   chains' median times is what one more call adds once a chain runs (``stride``). A chain's
   mean also pays once for its start (the function's call, the ranks leaving the barrier
   apart, the wait for Horovod's next cycle), which a step pays once for all its calls; on 2
   ranks on loopback, 256 B, one call took 230-252 us and each call of a chain of 12 after the
   first 209-216 us (``benchmarks/call_overlap.py``). Which of the two prices a step's calls
   is the launcher's choice (:func:`parallax_nb.calibrate.combine`), from where each rank ran:
   ``host`` (the kernel's boot id: ranks of one host share its cores, emulated machines too)
   and ``cores`` (the cores it could use once bound).

   ``machine`` and ``cross`` are measured only with several machines of several ranks each
   (otherwise they are the ``all`` calls, or empty).
5. **Compute again** (with a job): step 2's timing of the runtime's program, repeated
   (``compute_recheck_s``): whether the cores computed at the same speed from start to end.
"""
from __future__ import annotations

import statistics
import time

COLLECTIVE_SIZES_BYTES = (256, 4 << 10, 64 << 10, 1 << 20, 4 << 20)
CHAIN_CALLS = 3
LINK_CHAIN_CALLS = 12
#: Calls of fewer bytes than this are also timed in stride (module docstring, step 4): from
#: 1 MiB on a call's own transfer outlasts a chain's start.
STRIDE_BELOW_BYTES = 1 << 20
REPEATS = 7
IDLE_S = 2.0
WARMUP_STEPS = 2
COMPUTE_STEPS = 5
#: the compute is timed for at least this long, at most
#: :data:`COMPUTE_MAX_STEPS` steps: the first steps after the ranks' barrier run slower (a
#: 1 ms recommender step read 1.2-1.4 ms over 5 steps, 1.02-1.03 ms over 100 and in the run)
COMPUTE_MIN_S = 0.5
COMPUTE_MAX_STEPS = 200


def measure_on_rank(job=None, workers_per_machine: int | None = None, link_interface: str | None = None,
                    sizes_bytes=COLLECTIVE_SIZES_BYTES, chain: int = CHAIN_CALLS, repeats: int = REPEATS,
                    idle_s: float = IDLE_S, link_chain: int = LINK_CHAIN_CALLS, warmup_steps: int = WARMUP_STEPS,
                    compute_steps: int = COMPUTE_STEPS, stride_below: int = STRIDE_BELOW_BYTES) -> dict:
    """This rank's figures (module docstring): ``{"rank", "machines", "workers_per_machine",
    "topology", "collectives": {"op/scope": [(bytes, seconds per call), ...]}, "stride": {"op/scope":
    [(bytes, seconds one more call adds to a chain), ...]} (sizes below ``stride_below``), "host",
    "cores",
    "compute": {"model", "median_step_s", "steps_s", "baselines": {baseline key: median step s}}
    or None, "link" and "busy_link": {"bytes", "packets", "seconds"} or None, "link_per_call":
    {"op/scope": [(bytes, link bytes, link packets) per call, ...]} (local rank 0 with a link to
    read, else {}), "horovod_env": {Horovod setting: value}, "compute_recheck_s": the compute
    again at the end (with a job)}``. ``job``: a
    :class:`~parallax_nb.job.Job` or a ``module:name`` spec."""
    import os

    from ..calibration import horovod_settings
    from ..devices import rank_cores
    from ..failures import report_progress
    from .context import barrier, configure_threads, horovod
    from .topology import gather_topology

    report_progress("starting Horovod")
    configure_threads()
    hvd = horovod()
    topology = gather_topology(hvd, None, workers_per_machine)
    machines, per_machine = topology.machines, topology.workers_per_machine
    hierarchy = None
    if topology.uniform and machines > 1 and per_machine > 1:
        from .hierarchical import Hierarchy

        hierarchy = Hierarchy(topology, hvd.rank())
    out = {"rank": hvd.rank(), "machines": machines, "workers_per_machine": per_machine,
           "uniform": topology.uniform, "topology": topology.describe(), "collectives": {}, "compute": None,
           "link": None, "horovod_env": horovod_settings(os.environ),
           "rank_cores": rank_cores(),   # as Horovod's start placed this rank (devices.bind_rank)
           "host": host_id(), "cores": sorted(os.sched_getaffinity(0)), "stride": {}}
    if job is not None:
        from ..job import Job, load_job

        job = job if isinstance(job, Job) else load_job(job)
        out["compute"] = _compute(job, hvd, barrier, warmup_steps, compute_steps, link_interface)
        out["busy_link"] = out["compute"].pop("link")
    else:
        out["busy_link"] = _busy_link(hvd, barrier, link_interface, idle_s)
    report_progress("reading the idle link")
    barrier("calibrate_idle")
    out["link"] = _idle_link(hvd, link_interface, idle_s)
    out["link_per_call"] = {}
    if hvd.size() > 1:
        for key, call in _collective_calls(hvd, hierarchy).items():
            timed, stride, link = _time_sizes(_chained(call, chain), _chained(call, link_chain), hvd, barrier,
                                              key, sizes_bytes, chain, link_chain, repeats, stride_below,
                                              link_interface)
            out["collectives"][key] = timed
            out["stride"][key] = stride
            if link is not None:
                out["link_per_call"][key] = link
    # the machines' sets may still be timing: nobody leaves (and shuts Horovod down) before them
    barrier("calibrate_done")
    if job is not None:   # step 5: the compute again, whether the cores' speed held
        report_progress("timing the job's compute again")
        seconds, _ = _program_steps(job, None, hvd, barrier, warmup_steps, compute_steps, None)
        out["compute_recheck_s"] = statistics.median(seconds)
    return out


def _compute(job, hvd, barrier, warmup_steps: int, compute_steps: int, interface: str | None = None) -> dict:
    from ..job import Job, load_job
    from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE

    job = job if isinstance(job, Job) else load_job(job)
    times, link = _program_steps(job, None, hvd, barrier, warmup_steps, compute_steps, interface)
    # the Horovod baselines run the model as Keras builds it; with no sparse gradient that is
    # the runtime's program, whose figure stands for theirs (module docstring)
    baselines = {}
    if _has_sparse_gradient(job):
        for key in (PLAIN_HOROVOD, SPARSE_AS_DENSE):
            seconds, _ = _program_steps(job, key, hvd, barrier, warmup_steps, compute_steps, None)
            baselines[key] = statistics.median(seconds)
    return {"model": job.name, "median_step_s": statistics.median(times), "steps_s": times, "link": link,
            "baselines": baselines}


def compute_seconds(job, baseline: str | None = None, warmup_steps: int = WARMUP_STEPS,
                    compute_steps: int = COMPUTE_STEPS) -> float:
    """A calibration's compute figure for ``job``, measured now in a running launch (every rank
    calls it at once): the slowest rank's median seconds per step of the runtime's program, or
    with a Horovod ``baseline`` key (``horovod``, ``sparse_as_dense``) that baseline's program,
    the runtime's where the model has no sparse gradient (as :func:`measure_on_rank` times them).
    Benchmarks time it beside a run, to tell a prediction's compute from the machine's drift
    between the calibration and the run."""
    from ..job import Job, load_job
    from .context import barrier, horovod

    hvd = horovod()
    job = job if isinstance(job, Job) else load_job(job)
    program = baseline if baseline is not None and _has_sparse_gradient(job) else None
    seconds, _ = _program_steps(job, program, hvd, barrier, warmup_steps, compute_steps, None)
    return max(hvd.allgather_object(statistics.median(seconds)))


def _has_sparse_gradient(job) -> bool:
    from ..types import Kind
    from .reference import variable_kinds

    return Kind.SPARSE in variable_kinds(job, job.build_model()).values()


def _program_steps(job, baseline: str | None, hvd, barrier, warmup_steps: int, compute_steps: int,
                   interface: str | None) -> tuple[list[float], dict | None]:
    """:func:`_timed_steps` of one program on a fresh model (each starts from unwritten tables):
    the runtime's (``baseline`` None: its ``Embedding`` layers read as the runtime reads them),
    plain Horovod's (its ``IndexedSlices`` applied as they come) or ``sparse_as_dense``'s."""
    from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE
    from .reference import single_device_step
    from .sharded import route_embedding_layers

    model = job.build_model()
    if baseline is None:
        route_embedding_layers(model)   # as the runtime's model reads its tables (module docstring)
    options = {None: {}, PLAIN_HOROVOD: dict(deduplicate_sparse=False),
               SPARSE_AS_DENSE: dict(densify_sparse=True)}[baseline]
    step = single_device_step(job, model, job.make_optimizer(), **options)
    return _timed_steps(step, job, hvd, barrier, warmup_steps, compute_steps, interface,
                        "calibrate_compute" + (f"_{baseline}" if baseline else ""))


def _timed_steps(step, job, hvd, barrier, warmup_steps: int, compute_steps: int, interface: str | None,
                 tag: str) -> tuple[list[float], dict | None]:
    """Seconds of each timed step of ``step`` on this rank's shard, every rank at once after a
    barrier (``warmup_steps`` untimed first), each with the taking of its batch from the job's
    data, and the link read around them: at least ``compute_steps`` steps, and as many more as
    last :data:`COMPUTE_MIN_S` (at most :data:`COMPUTE_MAX_STEPS`)."""
    from ..failures import report_progress

    report_progress(f"timing the job's compute ({tag}: tracing, warm-up, timed steps)")
    batches = iter(job.dataset(hvd.rank(), hvd.size()))
    for _ in range(warmup_steps):
        x, y = next(batches)
        float(step(x, y))
    barrier(tag)
    link = _LinkReading(hvd, interface)
    times, elapsed = [], 0.0
    while len(times) < compute_steps or (elapsed < COMPUTE_MIN_S and len(times) < COMPUTE_MAX_STEPS):
        start = time.perf_counter()
        x, y = next(batches)   # as a training loop takes it (module docstring, step 2)
        float(step(x, y))
        times.append(time.perf_counter() - start)
        elapsed += times[-1]
    return times, link.done()


#: the interface that carries the traffic between ranks of one host: read as one link per rank
LOOPBACK_INTERFACE = "lo"


class _LinkReading:
    """This machine's link counters from now to :meth:`done` (local rank 0 only, else None).

    :data:`LOOPBACK_INTERFACE` is read as each rank's own link, the ranks of one host taken as
    machines of one rank each (``workers_per_machine=1`` on one emulated machine): it counts
    every byte between them once as sent and once as received, so its bytes and packets
    divided by the host's ranks are what one rank sent plus received, as a link per rank would
    count them."""

    def __init__(self, hvd, interface: str | None):
        self.interface = interface if interface and hvd.local_rank() == 0 else None
        self.sharing = hvd.local_size() if interface == LOOPBACK_INTERFACE else 1
        if self.interface:
            from .accounting import interface_totals

            self.start = time.perf_counter()
            self.bytes, self.packets = interface_totals(self.interface)

    def done(self):
        """``{"bytes", "packets", "seconds"}`` since the start, or None without a link to read."""
        if not self.interface:
            return None
        from .accounting import interface_totals

        bytes1, packets1 = interface_totals(self.interface)
        return {"bytes": (bytes1 - self.bytes) / self.sharing, "packets": (packets1 - self.packets) / self.sharing,
                "seconds": time.perf_counter() - self.start}


def _busy_link(hvd, barrier, interface: str | None, seconds: float):
    """Without a job: the link's bytes while every rank multiplies 256 x 256 matrices for
    ``seconds`` (the cores busy as in a step's compute)."""
    import tensorflow as tf

    a = tf.random.stateless_normal([256, 256], seed=[0, hvd.rank()])
    barrier("calibrate_busy")
    link = _LinkReading(hvd, interface)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = tf.linalg.matmul(a, a) / 256.0
    float(tf.reduce_sum(a))
    return link.done()


def _idle_link(hvd, interface: str | None, idle_s: float):
    """Bytes and packets this machine's link carried in ``idle_s`` s of idle Horovod (local rank 0 only)."""
    link = _LinkReading(hvd, interface)
    time.sleep(idle_s)
    return link.done()


def _chained(call, chain: int):
    """A ``tf.function`` of a ``[None]`` float32 input running ``call(x, i)`` ``chain`` times,
    each on the previous output; returns one element (the last call must have finished)."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)], autograph=False)
    def run(x):
        for i in range(chain):
            x = call(x, i)
        return tf.reduce_sum(x[:1])

    return run


def _collective_calls(hvd, hierarchy) -> dict:
    """``{"op/scope": call(x, i)}`` over all ranks and, with a hierarchy, within a machine and
    across machines as the runtime's local-aggregation steps issue them (:func:`_chained`
    chains them)."""
    import tensorflow as tf

    W = hvd.size()

    def equal_splits(x, parts: int):
        return tf.fill([parts], tf.shape(x)[0] // parts)

    calls = {
        "allreduce/all": lambda x, i: hvd.allreduce(x, op=hvd.Sum, name=f"px_cal_ar_all_{i}"),
        "allgather/all": lambda x, i: allgather_own(hvd.allgather(x, name=f"px_cal_ag_all_{i}"), x),
        "alltoall/all": lambda x, i: hvd.alltoall(x, splits=equal_splits(x, W), name=f"px_cal_a2a_all_{i}")[0],
    }
    if hierarchy is not None:
        h = hierarchy
        machine_set = h.machine_set
        calls.update({
            "allreduce/machine": lambda x, i: hvd.allreduce(x, op=hvd.Sum, process_set=machine_set,
                                                            name=f"px_cal_ar_machine_{i}"),
            "allgather/machine": lambda x, i: allgather_own(
                hvd.allgather(x, process_set=machine_set, name=f"px_cal_ag_machine_{i}"), x),
            "alltoall/machine": lambda x, i: h.alltoall(
                x, h.local_splits(tf.shape(x)[0] // h.G), f"px_cal_a2a_machine_{i}")[0],
            "alltoall/cross": lambda x, i: h.alltoall(
                x, h.splits(h.cross_peers, [tf.shape(x)[0] // h.N] * h.N), f"px_cal_a2a_cross_{i}")[0],
        })
    return calls


def allgather_own(gathered, x):
    """This rank's slice back out of an allgather (the next call of a chain hands it again)."""
    import tensorflow as tf

    return gathered[:tf.shape(x)[0]]


def _time_sizes(fn, long_fn, hvd, barrier, key: str, sizes_bytes, chain: int, long_chain: int, repeats: int,
                stride_below: int, interface: str | None = None) -> tuple[list, list, list | None]:
    """Of one collective at every size: [(bytes per call, median seconds per call of a chain of
    ``chain``)]; below ``stride_below`` bytes [(bytes per call, seconds one more call adds)]
    from ``repeats`` chains of ``long_fn`` (``long_chain`` calls) too (module docstring, step
    4); and on local rank 0 with a link to read, [(bytes per call, link bytes per call, link
    packets per call)] (None elsewhere): the link's counters around each timed chain (after its
    barrier), the median over the chains, per call, at the smallest size around the long chains."""
    import tensorflow as tf

    from ..failures import report_progress

    # every call hands a whole number of float32 elements per participant (at most W)
    quantum = 4 * hvd.size()
    points, stride_points, link_points = [], [], []
    tag = key.replace('/', '_')

    def timed_chains(run, label: str, x) -> tuple[float, list]:
        report_progress(f"timing {key} at {label} B a rank, untimed chain")
        float(run(x))  # untimed: traces on the first size, warms the buffers on every size
        seconds, links = [], []
        for r in range(repeats):
            report_progress(f"timing {key} at {label} B a rank, chain {r + 1} of {repeats}")
            barrier(f"cal_{tag}_{label}_{r}")
            link = _LinkReading(hvd, interface)
            start = time.perf_counter()
            float(run(x))
            seconds.append(time.perf_counter() - start)
            links.append(link.done())
        return statistics.median(seconds), links

    for size in sizes_bytes:
        elements = max(quantum, size // quantum * quantum) // 4
        x = tf.zeros([elements], tf.float32)
        short_s, link_per_chain = timed_chains(fn, f"{size}", x)
        points.append((4 * elements, short_s / chain))
        calls_per_reading = chain
        links_from_long = bool(interface) and size == min(sizes_bytes)
        if size < stride_below or links_from_long:   # on every rank: they are collectives
            long_s, long_links = timed_chains(long_fn, f"{size}_long", x)
            if size < stride_below:
                stride_points.append((4 * elements, (long_s - short_s) / (long_chain - chain)))
            if links_from_long:
                link_per_chain, calls_per_reading = long_links, long_chain
        if link_per_chain[0] is not None:
            link_points.append((4 * elements, statistics.median(r["bytes"] for r in link_per_chain) / calls_per_reading,
                                statistics.median(r["packets"] for r in link_per_chain) / calls_per_reading))
    return points, stride_points, (link_points if link_points else None)


def host_id() -> str:
    """Which host this process runs on, as its cores go: the kernel's boot id (the ranks of
    emulated machines, each in its own network namespace and maybe under its own hostname,
    share it), or the hostname where it cannot be read."""
    import socket

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()
