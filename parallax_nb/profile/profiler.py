"""Profile a Job on one device: what every trainable variable would cost to synchronise.

The profiler trains the user's own model on the user's own data for ``warmup + steps``
single-device steps inside one ``tf.function``. Besides applying the optimizer, the step
returns, for each variable whose gradient is a ``tf.IndexedSlices``, the unique row ids of
that gradient and the length of its index vector. That is the whole definition of *sparse*:
the same variables the runtime can serve from parameter servers, because the workloads gather
rows through :func:`parallax_nb.ops.embedding_lookup` or Keras ``Embedding`` (both
``tf.gather``). Everything else is dense.

Order of the data: warm-up steps read batches ``0 .. warmup-1`` of ``job.dataset(0, 1)``,
profiled step ``s`` reads batch ``warmup + s``. No extra steps are run: the step time is the
median wall time of the profiled steps themselves (training step plus the device-side
``tf.unique`` of the sparse ids and their copy to the host, a few percent of a step).

Local aggregation needs the rows of G workers' batches *at one step*: they share its state
(an LM's sampled candidates are drawn from a step counter, so all workers of a step draw the
same ones). With sparse variables, before each profiled step the rows of the next profiled
batches (up to ``max_workers - 1``) are evaluated at that step's state, without updating
anything and outside the timed step, by a graph pruned to the gradient ids; only when a step
changes a non-trainable variable (else the consecutive steps are those windows). Measured on
this project's 2-core machine: ~4 ms a pass for the benchmarks' 100,000-word LM against its
30 ms step, plus one trace of ~0.45 s (``environment["window_rows_wall_s"]``).
"""
from __future__ import annotations

import math
import platform
import socket
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import progress
from ..devices import DevicePlacement, place_process
from ..errors import JobError, ParallaxError, ProfileError
from ..job import Job
from ..types import MAX_LOCAL_WORKERS, Profile
from .. import job_checks as checks
from .memory import PeakMemoryMeter
from .stats import dense_variable_profile, sparse_variable_profile


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ProfileError(f"{name} must be a whole number >= {minimum}, got {value!r}",
                           hint="profile_job(job, steps=20, warmup=2) profiles 20 steps after 2 warm-up steps")
    return int(value)


class _SharedLookups:
    """A lookup router that serves nothing (every lookup stays a local ``tf.gather``) and
    records, per variable, the first other variable looked up at the same ids and dtype in one
    :func:`parallax_nb.ops.embedding_lookups` call (``VariableProfile.lookup_shared_with``)."""

    def __init__(self):
        self.shared_with: dict[str, str] = {}

    def lookup(self, params, ids):
        return None

    def lookup_many(self, pairs):
        from ..ops import variable_path

        first: dict[tuple, str] = {}
        for params, ids in pairs:
            name = variable_path(params)
            leader = first.setdefault((id(ids), str(getattr(params, "dtype", ""))), name)
            if leader != name:
                self.shared_with.setdefault(name, leader)
        return [None] * len(pairs)


def _make_train_step(job: Job, model, optimizer, variables, names, kinds: dict, shared: _SharedLookups,
                     index_bytes: dict):
    """A ``tf.function`` training step returning ``(loss, {name: (unique_rows, index_count)})``.

    ``kinds`` is filled while tracing (once): ``"sparse"`` for an ``IndexedSlices`` gradient,
    ``"dense"`` for a tensor, ``"none"`` for a variable the loss does not depend on;
    ``index_bytes`` the width of each ``IndexedSlices``' indices (4 for int32 ids, 8 for int64);
    and ``shared`` records the lookups made together.
    """
    import tensorflow as tf

    from ..ops import route_lookups

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape, route_lookups(shared):
            loss = job.loss_value(model, x, y)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        touched = {}
        for name, grad in zip(names, grads):
            if isinstance(grad, tf.IndexedSlices):
                kinds[name] = "sparse"
                index_bytes[name] = grad.indices.dtype.size
                ids = tf.reshape(grad.indices, [-1])
                touched[name] = (tf.unique(ids)[0], tf.size(ids))
            else:
                kinds[name] = "dense" if grad is not None else "none"
        return loss, touched

    return train_step


def _make_rows_at_this_state(job: Job, model, variables, names, sparse_names, example):
    """``(x, y) -> {name: unique rows}``: the rows the batch's gradient would touch at the
    model's current state, with no update, so every batch evaluated before a step sees the
    state the step's own batch sees, as the workers of one distributed step do.

    The gradient is traced once into a graph (``wrap_function``, shapes of ``example``) that is
    pruned to what its ids need (``prune``): the gather indices and what they are computed
    from (a step counter's current value, the batch), not the layers' arithmetic nor the
    gradient values, nor any assignment (a step counter's increment is not on the ids' path).
    A model TensorFlow cannot wrap that way gets a ``tf.function`` that computes the whole
    gradient and puts the non-trainable variables back."""
    import tensorflow as tf

    def rows(x, y):
        with tf.GradientTape() as tape:
            loss = job.loss_value(model, x, y)
        grads = tape.gradient(loss, variables)
        return {name: tf.unique(tf.reshape(grad.indices, [-1]))[0] for name, grad in zip(names, grads)
                if name in sparse_names and isinstance(grad, tf.IndexedSlices)}

    spec = [tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), part) for part in example]
    try:
        wrapped = tf.compat.v1.wrap_function(rows, spec)
        pruned = wrapped.prune(feeds=wrapped.inputs, fetches=wrapped.structured_outputs)
        return lambda x, y: pruned(*tf.nest.flatten((x, y)))
    except Exception:  # noqa: BLE001 - any model the v1 wrapper cannot trace: the whole gradient instead
        pass
    state = list(model.non_trainable_variables)

    @tf.function(autograph=False)
    def rows_at_this_state(x, y):
        saved = [tf.identity(v.value) for v in state]
        out = rows(x, y)
        with tf.control_dependencies(list(out.values())):
            for variable, value in zip(state, saved):
                variable.assign(value)
        return out

    return rows_at_this_state


class _Batches:
    """The job's batches in order, with a look-ahead: ``ahead(n)`` peeks at the next n.
    ``next`` also says how long taking that batch from the data took (None for the first,
    taken before the trace)."""

    def __init__(self, iterator, job: Job, first):
        self.iterator, self.job, self.buffer = iterator, job, [(first, None)]

    def _take(self, step: int) -> None:
        start = time.perf_counter()
        batch = _next_batch(self.iterator, step, self.job)
        self.buffer.append((batch, time.perf_counter() - start))

    def next(self, step: int) -> tuple:
        if not self.buffer:
            self._take(step)
        return self.buffer.pop(0)

    def ahead(self, n: int, step: int) -> list:
        while len(self.buffer) < n:
            self._take(step)
        return [batch for batch, _ in self.buffer[:n]]


def _next_batch(iterator, step: int, job: Job):
    import tensorflow as tf

    try:
        return next(iterator)
    except (StopIteration, tf.errors.OutOfRangeError):
        raise ProfileError(f"the data function of {job.name!r} yields no examples (the dataset ended at step {step} "
                           f"although the profiler repeats it)",
                           hint="check the data function: it must yield at least one (x, y) example") from None
    except tf.errors.OpError as e:
        raise ProfileError(f"the data function of {job.name!r} failed at step {step}: {checks._first_line(e)}") from None


def _environment(memory_method: str, warmup: int, steps: int, steps_wall_s: float, no_gradient: list[str],
                 placement: DevicePlacement) -> dict:
    import keras
    import tensorflow as tf

    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": platform.python_version(),
        "device": placement.label if placement.gpu else f"CPU ({platform.processor() or platform.machine()})",
        "memory_measure": memory_method,
        "step_time_measure": "median wall time of the profiled steps (train step + unique sparse ids to host) "
                             "+ median time to take a batch from the job's data",
        "warmup_steps": warmup,
        "profiled_batches": f"{warmup}..{warmup + steps - 1} of job.dataset(0, 1)",
        "profiled_steps_wall_s": steps_wall_s,
        "variables_without_gradient": no_gradient,
    }


def _prepare(job: Job):
    """Model, optimizer, data iterator and first batch, checked: ``(model, optimizer, iterator, batch)``."""
    model = job.build_model()
    optimizer = job.make_optimizer()
    dataset = job.dataset(0, 1)
    x_spec, _ = checks.check_pairs(dataset.element_spec)
    checks.check_inputs_fit(model, x_spec)
    iterator = iter(dataset)
    first = _next_batch(iterator, 0, job)
    if not model.trainable_variables:
        raise ProfileError(f"model {model.name!r} of job {job.name!r} has no trainable variables: nothing to "
                           "synchronise or profile", hint="check that the layers are not frozen (trainable=False)")
    names = [v.path for v in model.trainable_variables]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ProfileError(f"model {model.name!r} has several trainable variables named {duplicates}",
                           hint="give every layer a unique name")
    return model, optimizer, iterator, first


@dataclass
class _Recording:
    """What the profiled steps produced, per sparse variable and per step."""

    kinds: dict = field(default_factory=dict)             # name -> "sparse" | "dense" | "none"
    index_bytes: dict = field(default_factory=dict)       # name -> width of a sparse gradient's indices
    unique_rows: dict = field(default_factory=dict)       # name -> [sorted unique row ids per step]
    index_counts: dict = field(default_factory=dict)      # name -> [gradient index length per step]
    windows: dict = field(default_factory=dict)           # name -> per step: [own rows, next batches' rows at its state]
    shared: _SharedLookups = field(default_factory=_SharedLookups)   # lookups made together
    step_times_s: list = field(default_factory=list)
    batch_take_s: list = field(default_factory=list)      # taking each profiled step's batch from the data
    steps_cpu_s: float = 0.0                              # process CPU time of the profiled steps
    window_rows_wall_s: float = 0.0                       # the untimed passes of the windows, their trace included


def _run_steps(job: Job, model, optimizer, iterator, first, steps: int, warmup: int,
               max_workers: int = 1) -> _Recording:
    """Trace once, then run ``warmup + steps`` steps, recording the profiled ones.

    Before each profiled step, with sparse variables, ``max_workers`` > 1 and a first step
    that changed a non-trainable variable, the rows of the next profiled batches (up to
    ``max_workers - 1``) are read at the step's state, untimed (:func:`_make_rows_at_this_state`;
    windows of :func:`.stats.union_rows_by_workers`); a bad batch among them is left to its
    own step, which names it. A step that leaves the state alone gives each batch at step i's
    state the rows of its own step: the windows are the consecutive steps, with no pass."""
    import tensorflow as tf

    variables = list(model.trainable_variables)
    names = [v.path for v in variables]
    rows_by_name = {n: (int(v.shape[0]) if len(v.shape) else 1) for n, v in zip(names, variables)}
    rec = _Recording()
    progress.phase("profile", "tracing the training step", done=0, total=warmup + steps)
    train_step = _make_train_step(job, model, optimizer, variables, names, rec.kinds, rec.shared,
                                  rec.index_bytes)
    try:  # trace before timing anything: structure errors surface here, with their cause
        train_step = train_step.get_concrete_function(*first)
    except ParallaxError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, tf.errors.OpError) as e:
        raise checks.step_error(e, model, first[0], 0) from None
    sparse_names = {n for n, kind in rec.kinds.items() if kind == "sparse"}
    rows_at_this_state = None
    # the windows need passes only when a step changes the model's non-trainable state (a step
    # counter, moving statistics): otherwise step i's state gives every batch the rows of its own step
    state_before = ([v.numpy().copy() for v in model.non_trainable_variables]
                    if sparse_names and max_workers > 1 and steps > 1 else None)
    def window_passes():
        start = time.perf_counter()
        made = _make_rows_at_this_state(job, model, variables, names, sparse_names, first)
        rec.window_rows_wall_s += time.perf_counter() - start
        return made

    if state_before is not None and warmup == 0:   # step 0 is profiled before it shows whether state changes
        rows_at_this_state = window_passes()
    batches = _Batches(iterator, job, first)
    for step in range(warmup + steps):
        progress.phase("profile", f"warm-up step {step + 1} of {warmup}" if step < warmup else
                       f"step {step - warmup + 1} of {steps}", done=step, total=warmup + steps)
        (x, y), take_s = batches.next(step)
        checks.check_no_negative_ids(x, step)
        others = []
        if rows_at_this_state is not None and step >= warmup:
            ahead = batches.ahead(min(max_workers - 1, warmup + steps - 1 - step), step + 1)
            window_start = time.perf_counter()
            try:
                for j, batch in enumerate(ahead):
                    checks.check_no_negative_ids(batch[0], step + 1 + j)
                others = [rows_at_this_state(*batch) for batch in ahead]
            except (ParallaxError, ValueError, TypeError, KeyError, IndexError, tf.errors.OpError):
                others = []   # bad data in a later batch: its own step names it below
            others = [{n: ids.numpy() for n, ids in rows.items()} for rows in others]
            rec.window_rows_wall_s += time.perf_counter() - window_start
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            loss, touched = train_step(x, y)
            loss_value = float(loss)
            touched = {n: (ids.numpy().astype(np.int64), int(count)) for n, (ids, count) in touched.items()}
        except ParallaxError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, tf.errors.OpError) as e:
            raise checks.step_error(e, model, x, step) from None
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if step == 0 and state_before is not None:
            changed = any(not np.array_equal(before, v.numpy())
                          for before, v in zip(state_before, model.non_trainable_variables))
            if not changed:
                rows_at_this_state = None
            elif rows_at_this_state is None:
                rows_at_this_state = window_passes()
        for name, (ids, _) in touched.items():
            checks.check_sparse_rows(name, ids, rows_by_name[name], step)
        if step < warmup:
            continue
        if not math.isfinite(loss_value):
            raise ProfileError(f"the loss of job {job.name!r} is {loss_value} at step {step}",
                               hint="lower the learning rate or check the loss function and the labels")
        rec.step_times_s.append(elapsed)
        if take_s is not None:
            rec.batch_take_s.append(take_s)
        rec.steps_cpu_s += cpu
        for name, (ids, count) in touched.items():
            rec.unique_rows.setdefault(name, []).append(ids)
            rec.index_counts.setdefault(name, []).append(count)
            rec.windows.setdefault(name, []).append(
                [ids] + [np.sort(rows[name].astype(np.int64)) for rows in others])
    if state_before is not None and rows_at_this_state is None:   # no state changes: consecutive steps
        rec.windows = {name: [rows[i:i + max_workers] for i in range(len(rows))]
                       for name, rows in rec.unique_rows.items()}
    return rec


def profile_job(job: Job, steps: int = 20, warmup: int = 2, max_workers: int = MAX_LOCAL_WORKERS) -> Profile:
    """Train ``job`` for ``warmup + steps`` steps on one device and measure every trainable variable.

    Returns a :class:`parallax_nb.types.Profile` (one :class:`VariableProfile` per trainable
    variable, named by its Keras ``path``; statistics as defined in :mod:`.stats`), the median
    step time in seconds (the train step, plus the median time to take a batch from the job's
    data, as every training loop pays it) and the peak memory growth in bytes (``environment["memory_measure"]``
    says which meter). Raises :class:`JobError`/:class:`ProfileError` naming the problem for a
    model builder that returns no Keras model, a model without trainable variables, data that
    is not ``(x, y)`` pairs or does not fit the model, ids outside an embedding's rows, and
    ``steps < 1``.

    It measures on the GPU a rank trains on (local rank 0's GPU, or this rank's own GPU when
    called on a rank; :mod:`parallax_nb.devices`), or the CPU on a CPU host, and names it in
    ``environment["device"]`` (the report shows it).
    """
    if not isinstance(job, Job):
        raise JobError(f"profile_job needs a parallax_nb.Job, got {type(job).__name__}",
                       hint="px.Job(model=..., loss=..., optimizer=..., data=..., batch_size=...)")
    steps = _check_count("steps", steps, 1)
    warmup = _check_count("warmup", warmup, 0)
    max_workers = _check_count("max_workers", max_workers, 1)
    with progress.task("profile", f"profiling {job.name}"):
        return _profile(job, steps, warmup, max_workers)


def _profile(job: Job, steps: int, warmup: int, max_workers: int) -> Profile:
    progress.phase("profile", "loading TensorFlow")
    import tensorflow as tf

    # the GPU local rank 0 trains on (or the one this rank already uses), before any TensorFlow op
    placement = place_process(0, 1, socket.gethostname())
    with PeakMemoryMeter() as meter:
        progress.phase("profile", "building the model, reading the first batch")
        model, optimizer, iterator, first = _prepare(job)
        rec = _run_steps(job, model, optimizer, iterator, first, steps, warmup, max_workers)

    progress.phase("profile", "per-variable statistics", done=warmup + steps, total=warmup + steps)
    stats_start = time.perf_counter()
    profiles = []
    for var in model.trainable_variables:
        name, shape, dtype = var.path, tuple(int(d) for d in var.shape), tf.as_dtype(var.dtype)
        if rec.kinds.get(name) == "sparse":
            profiles.append(sparse_variable_profile(name, shape, dtype.name, dtype.size, rec.unique_rows[name],
                                                    rec.index_counts[name], max_workers, rec.windows[name],
                                                    rec.index_bytes[name]))
        else:
            profiles.append(dense_variable_profile(name, shape, dtype.name, dtype.size, steps, max_workers))
    sparse = {p.name for p in profiles if p.is_sparse}
    profiles = [replace(p, lookup_shared_with=rec.shared.shared_with[p.name])
                if p.name in sparse and rec.shared.shared_with.get(p.name) in sparse else p for p in profiles]
    no_gradient = [n for n, kind in rec.kinds.items() if kind == "none"]
    environment = _environment(meter.method, warmup, steps, float(sum(rec.step_times_s)), no_gradient, placement)
    environment["profiled_steps_cpu_s"] = rec.steps_cpu_s
    environment["window_rows_wall_s"] = rec.window_rows_wall_s
    environment["statistics_wall_s"] = time.perf_counter() - stats_start
    # a training loop takes every step's batch from the data: the step time counts it, as the
    # calibration's compute does (parallax_nb.runtime.calibrate)
    take_s = float(np.median(rec.batch_take_s)) if rec.batch_take_s else 0.0
    environment["batch_take_s"] = take_s
    return Profile(model_name=job.name, batch_size=job.batch_size, steps=steps,
                   step_time_s=float(np.median(rec.step_times_s)) + take_s, peak_memory_bytes=meter.peak_bytes,
                   variables=tuple(profiles), environment=environment)
