"""Code that tests/test_reliability.py runs on MPI ranks (ipyparallel engines or mpirun ranks).

Faults are injected from inside real training (``parallax_nb.runtime.train``), never by
replacing TensorFlow, Horovod or MPI:

* :func:`faulty_train` has ``runtime.train``'s signature (``px.run(..., train_fn=...)``) and
  wraps the real trainer: it can slow every step down (so the test can kill an engine
  mid-run), make one rank sleep for ever after a step (a rank that hangs: the other ranks
  then block in the next collective), or SIGKILL rank 0 *inside* the write of a checkpoint
  (after some of its arrays are on disk).
* Data functions with bad input: shapes that differ between ranks, float ids, ids out of
  range, too few examples for the ranks.
"""
from __future__ import annotations

import functools
import os
import signal
import time

HANG_S = 3600.0

# Open MPI's warning as mpirun printed it when a calibration between emulated machines hung
# (2026-11-29); ranks print it in the tests, as the real failure cannot be brought about on demand.
CONNECT_WARNING = """--------------------------------------------------------------------------
WARNING: Open MPI failed to TCP connect to a peer MPI process.  This
should not happen.

Your Open MPI job may now hang or fail.

  Local host: pxnbd9cbm0
  PID:        28199
  Message:    connect() to 10.213.1.3:1024 failed
  Error:      Operation now in progress (115)
--------------------------------------------------------------------------
"""


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _kill_inside_checkpoint_write(at_step: int, after_arrays: int, marker_dir: str | None) -> None:
    """Make this process SIGKILL itself while the checkpoint of ``at_step`` is being written,
    after ``after_arrays`` of its array files were saved (the temporary directory then holds
    a half-written checkpoint)."""
    import numpy as np

    original = np.save
    saved = {"n": 0}
    tag = f"ckpt-{at_step:08d}"

    def save(file, arr, *args, **kwargs):
        if tag in os.fspath(file):
            if saved["n"] >= after_arrays:
                if marker_dir:
                    _write(os.path.join(marker_dir, "killed_in_write_at"), repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            saved["n"] += 1
        return original(file, arr, *args, **kwargs)

    np.save = save


def faulty_train(job, plan, steps, *, step_delay_s: float = 0.0, hang_rank: int | None = None,
                 hang_after_step: int | None = None, kill_in_checkpoint_at: int | None = None,
                 marker_dir: str | None = None, **kwargs):
    """``parallax_nb.runtime.train`` with injected faults (see module docstring).

    ``marker_dir``: every rank writes ``pid-<rank>`` there, and the time of an injected hang
    or kill, so the test can measure how long the failure took to surface.
    """
    from parallax_nb.runtime.trainer import train

    rank = _rank()
    if marker_dir:
        _write(os.path.join(marker_dir, f"pid-{rank}"), str(os.getpid()))
    on_step = kwargs.pop("on_step", None)
    if kill_in_checkpoint_at is not None and rank == 0:
        _kill_inside_checkpoint_write(kill_in_checkpoint_at, after_arrays=2, marker_dir=marker_dir)

    def wrapped(record):
        if on_step is not None:
            on_step(record)
        if hang_rank == rank and record.step == hang_after_step:
            if marker_dir:
                _write(os.path.join(marker_dir, "hang_at"), repr(time.time()))
            time.sleep(HANG_S)          # never returns in time: the others block in a collective
        if step_delay_s:
            time.sleep(step_delay_s)

    return train(job, plan, steps, on_step=wrapped, **kwargs)


def hang_on_ranks(job_bytes: bytes, plan_json: str, hang_rank: int, hang_after_step: int, step_timeout_s: float,
                  marker_dir: str) -> dict:
    """For ``launch.run_on_ranks``: train with ``hang_rank`` sleeping for ever after a step.

    Also records the permission bits of the launcher's private work folder (argv[3]), where
    payloads and results are pickled: only this user may write there.
    """
    import sys

    from parallax_nb.job import Job
    from parallax_nb.plan import Plan

    if _rank() == 0 and len(sys.argv) > 3:
        _write(os.path.join(marker_dir, "workdir_mode"), oct(os.stat(sys.argv[3]).st_mode & 0o777))
    job = Job.from_bytes(job_bytes)
    faulty_train(job, Plan.from_json(plan_json), 1000, hang_rank=hang_rank, hang_after_step=hang_after_step,
                 marker_dir=marker_dir, step_timeout_s=step_timeout_s)
    return {"rank": _rank()}


# ----------------------------------------------------------------------------- bad data
def _lm_config():
    from parallax_nb.workloads.lm import LMConfig

    return LMConfig.of_size("tiny", num_examples=256)


def _features(corpus):
    import tensorflow as tf

    features = {"tokens": corpus[:, :-1], "targets": corpus[:, 1:]}
    return tf.data.Dataset.from_tensor_slices((features, corpus[:, 1:]))


def shapes_differ_between_ranks(shard_index: int, num_shards: int):
    """Shard 0 yields sequences of 8 tokens, the other shards sequences of 6."""
    from parallax_nb.workloads.data import shard_rows
    from parallax_nb.workloads.lm import lm_corpus

    corpus = shard_rows(lm_corpus(_lm_config()), shard_index, num_shards)
    if shard_index != 0:
        corpus = corpus[:, :7]
    return _features(corpus)


def float_ids(shard_index: int, num_shards: int):
    """Token ids as float32 (3.7 would silently become row 3)."""
    from parallax_nb.workloads.data import shard_rows
    from parallax_nb.workloads.lm import lm_corpus

    corpus = shard_rows(lm_corpus(_lm_config()), shard_index, num_shards).astype("float32") + 0.5
    import tensorflow as tf

    features = {"tokens": corpus[:, :-1], "targets": corpus[:, 1:].astype("int32")}
    return tf.data.Dataset.from_tensor_slices((features, corpus[:, 1:]))


def ids_out_of_range(shard_index: int, num_shards: int, bad_id: int = 5000):
    """One token id per sequence is ``bad_id`` (the tiny vocabulary has 1003 rows)."""
    from parallax_nb.workloads.data import shard_rows
    from parallax_nb.workloads.lm import lm_corpus

    corpus = shard_rows(lm_corpus(_lm_config()), shard_index, num_shards).copy()
    corpus[:, 3] = bad_id
    return _features(corpus)


def too_few_examples(shard_index: int, num_shards: int):
    """One example in total: shard 1 of 2 is empty."""
    from parallax_nb.workloads.lm import lm_corpus

    corpus = lm_corpus(_lm_config())[:1][shard_index::num_shards]
    return _features(corpus)


def lm_job_with_data(data, name: str, batch_size: int = 4):
    """The tiny LM with another data function."""
    from parallax_nb.workloads import lm_job

    return lm_job("tiny", batch_size=batch_size, num_examples=256).replace(data=data, name=name)


negative_ids = functools.partial(ids_out_of_range, bad_id=-3)


# ----------------------------------------------------------------------------- security
def touch(path: str) -> bool:
    """Create ``path``: proof that an engine executed the message carrying this call."""
    with open(path, "w") as f:
        f.write("executed")
    return True


def _create_marker(path: str) -> str:
    with open(path, "w") as f:
        f.write("unpickled")
    return path


class Unpickler:
    """Pickles to a call of :func:`_create_marker`: whoever unpickles it creates ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (_create_marker, (self.marker,))


# ----------------------------------------------------------------------------- issue 19: silent wrong outcomes
# Jobs the CLI loads by name (``python -m parallax_nb run reliability_cases:<name>``) and jobs
# the grouped launch :func:`guard_cases` trains. Faults come from the data or the optimizer,
# never from replacing TensorFlow, Horovod or MPI.
KILL_AT_EXAMPLE = 12     # shard 1 SIGKILLs itself when training reads this example (step 4 of batch 4)
LATE_BAD_STEP = 9        # ids out of range from this step on (the first batch is clean)


def _recommender_config():
    from parallax_nb.workloads.recommender import RecommenderConfig

    return RecommenderConfig.of_size("tiny", num_examples=256)


def recommender_with(data=None, loss=None, name="recommender-bad", learning_rate=None, batch_size=8):
    """The tiny recommender with another data function, loss or learning rate."""
    from parallax_nb.workloads import recommender_job

    job = recommender_job("tiny", batch_size=batch_size, learning_rate=learning_rate, num_examples=256)
    changes = {"name": name}
    if data is not None:
        changes["data"] = data
    if loss is not None:
        changes["loss"] = loss
    return job.replace(**changes)


def _recommender_arrays(shard_index: int, num_shards: int):
    from parallax_nb.workloads.data import shard_rows
    from parallax_nb.workloads.recommender import recommender_examples

    cats, dense, labels = recommender_examples(_recommender_config())
    features = {f"cat_{i}": shard_rows(c, shard_index, num_shards).copy() for i, c in enumerate(cats)}
    features["dense"] = shard_rows(dense, shard_index, num_shards).copy()
    return features, shard_rows(labels, shard_index, num_shards).copy()


def inf_on_rank_1_at_step_3(shard_index: int, num_shards: int, batch_size: int = 8):
    """Shard 1's dense features of step 3 hold +inf: that rank's loss is NaN/inf in step 3 only."""
    import numpy as np
    import tensorflow as tf

    features, labels = _recommender_arrays(shard_index, num_shards)
    if shard_index == 1:
        features["dense"][2 * batch_size:3 * batch_size, 0] = np.inf
    return tf.data.Dataset.from_tensor_slices((features, labels))


def labels_of_width_7(shard_index: int, num_shards: int):
    """Labels of shape (7,) per example against the model's (1,) output."""
    import numpy as np
    import tensorflow as tf

    features, labels = _recommender_arrays(shard_index, num_shards)
    return tf.data.Dataset.from_tensor_slices((features, np.repeat(labels, 7, axis=1)))


def scalar_labels(shard_index: int, num_shards: int):
    """Labels of shape () per example against the model's (1,) output."""
    import tensorflow as tf

    features, labels = _recommender_arrays(shard_index, num_shards)
    return tf.data.Dataset.from_tensor_slices((features, labels[:, 0]))


def squared_error(y_true, y_pred):
    """A plain loss function without Keras's squeeze: (b,) labels - (b, 1) outputs is (b, b)."""
    import tensorflow as tf

    return tf.square(tf.cast(y_true, tf.float32) - y_pred)


def mean_squared_error(y_true, y_pred):
    """Keras's mean squared error: it squeezes a trailing 1, then broadcasts whatever else differs."""
    import keras

    return keras.losses.mean_squared_error(y_true, y_pred)


def features_only(shard_index: int, num_shards: int):
    """A dataset of features without labels."""
    import tensorflow as tf

    features, _ = _recommender_arrays(shard_index, num_shards)
    return tf.data.Dataset.from_tensor_slices(features)


def _lm_corpus_shard(shard_index: int, num_shards: int):
    from parallax_nb.workloads.data import shard_rows
    from parallax_nb.workloads.lm import lm_corpus

    return shard_rows(lm_corpus(_lm_config()), shard_index, num_shards).copy()


def late_bad_ids(shard_index: int, num_shards: int, batch_size: int = 4, bad_id: int = 5000):
    """Shard 1's token ids are ``bad_id`` from step LATE_BAD_STEP on; the first batches are clean."""
    corpus = _lm_corpus_shard(shard_index, num_shards)
    if shard_index == 1:
        corpus[(LATE_BAD_STEP - 1) * batch_size:, 3] = bad_id
    return _features(corpus)


_PASSES = {"n": 0}


def _generated(corpus, before_example):
    """The LM examples of ``corpus`` through a Python generator that calls
    ``before_example(i, pass_number)`` before yielding example i (pass_number counts the
    passes over the data in this process: the trainer's first-batch check makes two, so
    training reads in pass 3)."""
    import tensorflow as tf

    T = corpus.shape[1] - 1

    def generate():
        _PASSES["n"] += 1
        passes = _PASSES["n"]
        for i, row in enumerate(corpus):
            before_example(i, passes)
            yield {"tokens": row[:-1], "targets": row[1:]}, row[1:]

    spec = tf.TensorSpec((T,), tf.as_dtype(corpus.dtype))
    return tf.data.Dataset.from_generator(generate, output_signature=({"tokens": spec, "targets": spec}, spec))


def hang_in_first_batch(shard_index: int, num_shards: int):
    """Shard 1's data never yields its first example (its reader hangs)."""
    def before(i, _):
        if shard_index == 1:
            _mark("hang_at")
            time.sleep(HANG_S)

    return _generated(_lm_corpus_shard(shard_index, num_shards), before)


def hang_in_step_1(shard_index: int, num_shards: int):
    """Shard 1's data passes the first-batch check, then hangs when training reads step 1."""
    def before(i, passes):
        if shard_index == 1 and passes > 2:
            _mark("hang_at")
            time.sleep(HANG_S)

    return _generated(_lm_corpus_shard(shard_index, num_shards), before)


def connect_warning_then_hang(shard_index: int, num_shards: int):
    """Shard 1 prints Open MPI's failed-connection warning (:data:`CONNECT_WARNING`), then its
    reader hangs before its first example."""
    def before(i, _):
        if shard_index == 1:
            _mark("hang_at")
            print(CONNECT_WARNING, flush=True)
            time.sleep(HANG_S)

    return _generated(_lm_corpus_shard(shard_index, num_shards), before)


def killed_at_step_4(shard_index: int, num_shards: int):
    """Shard 1 SIGKILLs its own process when training reads example KILL_AT_EXAMPLE."""
    def before(i, passes):
        if shard_index == 1 and passes > 2 and i == KILL_AT_EXAMPLE:
            _mark("killed_at")
            os.kill(os.getpid(), signal.SIGKILL)

    return _generated(_lm_corpus_shard(shard_index, num_shards), before)


def _mark(name: str) -> None:
    folder = os.environ.get("PX_TEST_MARKERS")
    if folder:
        _write(os.path.join(folder, name), repr(time.time()))


def _lm(data, name, **kwargs):
    return lm_job_with_data(data, name=name, **kwargs)


# jobs by name for the CLI (functions of no arguments that return the Job)
def _lm_with_lr(lr: float, name: str):
    from parallax_nb.workloads import lm_job

    return lm_job("tiny", batch_size=4, num_examples=256, learning_rate=lr).replace(name=name)


def nan_lm_job():
    """SGD at learning rate 1e30: the weights overflow after step 1, the loss is NaN from step 2."""
    return _lm_with_lr(1e30, "lm-lr-1e30")


def good_lm_job():
    return _lm_with_lr(0.5, "lm-good")


def late_bad_ids_job():
    return _lm(late_bad_ids, "lm-late-bad-ids")


def hang_in_first_batch_job():
    return _lm(hang_in_first_batch, "lm-hang-first-batch")


def hang_in_step_1_job():
    return _lm(hang_in_step_1, "lm-hang-step-1")


def connect_warning_then_hang_job():
    return _lm(connect_warning_then_hang, "lm-connect-warning")


def killed_at_step_4_job():
    return _lm(killed_at_step_4, "lm-killed")


def bad_layer_name_job():
    """A Dense layer named 'my layer!': fine eagerly, refused as a name scope in tf.function."""
    import functools

    return recommender_with(name="recommender-bad-layer-name").replace(
        model=functools.partial(_model_with_bad_layer_name, _recommender_config()))


def _model_with_bad_layer_name(config):
    import keras

    from parallax_nb.workloads.recommender import build_recommender_model

    base = build_recommender_model(config)
    out = keras.layers.Dense(1, name="my layer!")(base.output)
    return keras.Model(base.input, out)


ZERO_ROW = 14   # owned by rank 0 of 2 (row r of P = 2 partitions lives on rank r % 2)


def _zero_row_table(shape, dtype=None):
    """The table's initial values: uniform, but row ZERO_ROW all zeros."""
    import numpy as np

    values = np.random.default_rng(0).uniform(-1.0, 1.0, shape).astype("float32")
    values[ZERO_ROW] = 0.0
    return values


def _row_norm_model():
    """ids (2 per example) -> a table of 16 rows of 4 -> the sum of sqrt(row ** 2): finite at a
    zero row, whose gradient there is 0 * inf = NaN. The table is the only variable."""
    import keras
    import tensorflow as tf

    ids = keras.Input(shape=(2,), dtype="int32", name="ids")
    rows = keras.layers.Embedding(16, 4, embeddings_initializer=_zero_row_table, name="table")(ids)
    out = keras.layers.Lambda(lambda e: tf.reduce_sum(tf.sqrt(tf.square(e)), axis=[1, 2])[:, None],
                              name="row_norm")(rows)
    return keras.Model(ids, out)


def _zero_row_on_rank_1_at_step_3(shard_index: int, num_shards: int, batch_size: int = 8):
    """ids below ZERO_ROW, but shard 1's batch of step 3 looks ZERO_ROW up (shard 0's when it
    is the only one)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(shard_index)
    ids = rng.integers(0, ZERO_ROW, size=(64, 2)).astype("int32")
    if shard_index == min(1, num_shards - 1):
        ids[2 * batch_size, 0] = ZERO_ROW
    labels = rng.normal(size=(64, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((ids, labels))


def nan_row_gradient_job():
    """A finite loss whose gradient is NaN in one row of a PS table, made by rank 1's batch of
    step 3 only, for a row rank 0 owns."""
    import keras

    from parallax_nb.job import Job

    return Job(model=_row_norm_model, loss=keras.losses.mean_squared_error,
               optimizer=lambda: keras.optimizers.SGD(0.1), data=_zero_row_on_rank_1_at_step_3, batch_size=8,
               name="nan_row_gradient_rank_1")


# ----------------------------------------------------------------------------- the grouped launch
GUARD_CASES = ("nan_lr_ar", "nan_lr_hybrid", "nan_lr_ps", "inf_data_rank_1", "nan_row_gradient_rank_1",
               "nan_row_gradient_rank_1_ar",
               "labels_width_7",
               "labels_plain_loss_broadcast", "features_only", "checkpoint_fallback", "all_checkpoints_corrupt",
               "stale_temporary_removed", "layer_name")


def _guard_job(case: str):
    if case.startswith("nan_lr"):
        return recommender_with(learning_rate=1e30, name=f"recommender-{case}")
    return {"inf_data_rank_1": lambda: recommender_with(inf_on_rank_1_at_step_3, name=case),
            "nan_row_gradient_rank_1": nan_row_gradient_job,
            "nan_row_gradient_rank_1_ar": nan_row_gradient_job,
            "nan_row_gradient_one_rank": nan_row_gradient_job,   # for a launch of one rank
            "labels_width_7": lambda: recommender_with(labels_of_width_7, loss=mean_squared_error, name=case),
            "labels_plain_loss_broadcast": lambda: recommender_with(scalar_labels, loss=squared_error, name=case),
            "features_only": lambda: recommender_with(features_only, name=case),
            "layer_name": bad_layer_name_job}.get(case, lambda: recommender_with(name=case))()


def _guard_arch(case: str) -> str:
    return {"nan_lr_ar": "ar", "nan_lr_ps": "ps", "nan_row_gradient_rank_1_ar": "ar"}.get(case, "hybrid")


def guard_cases(workdir: str, cases=GUARD_CASES) -> dict:
    """Run every case of GUARD_CASES on these ranks, one after the other; for each, what
    happened: the error's class and message (every rank raises the same one together, so
    the ranks stay in step for the next case), the steps done, the checkpoints left and
    whether every array in them is finite."""
    import numpy as np

    from parallax_nb.errors import ParallaxError
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.checkpoint import checkpoint_folders, load
    from parallax_nb.runtime.reference import variable_kinds
    from parallax_nb.runtime.trainer import train

    out = {}
    for case in cases:
        job = _guard_job(case)
        clean = recommender_with()   # the plan comes from the job's model with good data and loss
        clean = job if case.startswith("nan_row_gradient") else job.replace(data=clean.data, loss=clean.loss)
        plan = plan_for_kinds(variable_kinds(clean), _guard_arch(case), model_name=job.name)
        folder = os.path.join(workdir, case)
        steps, kwargs = 6, dict(checkpoint_dir=folder, checkpoint_every=1, step_timeout_s=120)
        if case in ("checkpoint_fallback", "all_checkpoints_corrupt", "stale_temporary_removed"):
            train(job, plan, 4, checkpoint_dir=folder, checkpoint_every=2)
            if _rank() == 0:
                _prepare_checkpoints(case, folder)
            from parallax_nb.runtime.context import barrier

            barrier(f"prepared_{case}")
            kwargs.update(resume=True)
        record = {"error": None, "message": None, "steps_done": None}
        try:
            result = train(job, plan, steps, **kwargs)
            record.update(steps_done=result.steps_done, first_step=result.history[0].step if result.history else None)
        except ParallaxError as e:
            record.update(error=type(e).__name__, message=str(e))
        saved = {}
        for path in checkpoint_folders(folder):
            try:
                ckpt = load(path, verify=True)
                saved[os.path.basename(path)] = bool(all(np.isfinite(np.asarray(ckpt.weight(n))).all()
                                                         for n in ckpt.weight_names))
            except ParallaxError as e:
                saved[os.path.basename(path)] = f"unreadable: {e.message}"
        record["checkpoints"] = saved
        record["temporaries"] = sorted(n for n in os.listdir(folder) if n.startswith(".tmp")) \
            if os.path.isdir(folder) else []
        out[case] = record
    return out


def _prepare_checkpoints(case: str, folder: str) -> None:
    """Damage the checkpoints of a finished 4-step run as ``case`` needs (rank 0)."""
    import json

    if case == "stale_temporary_removed":
        os.makedirs(os.path.join(folder, ".tmp-ckpt-00000006-999999", "arrays"))
        return
    names = ["ckpt-00000004"] if case == "checkpoint_fallback" else ["ckpt-00000004", "ckpt-00000002"]
    for name in names:
        meta = json.load(open(os.path.join(folder, name, "meta.json")))
        array = os.path.join(folder, name, sorted(meta["weights"].values())[0])
        with open(array, "r+b") as f:   # 60 bytes of 0xFF inside the data: NaNs if it were trusted
            f.seek(os.path.getsize(array) - 60)
            f.write(b"\xff" * 60)
