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
