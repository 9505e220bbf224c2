"""Job: the user's single-device training recipe.

A Job holds no distribution code: a model builder, a loss, an optimizer factory, a data
function and the per-worker batch size. The runtime rebuilds everything from it on each
engine, so every field must survive cloudpickle (module-level functions and
``functools.partial`` of them travel by reference; lambdas and closures by value).
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ConfigError, JobError


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ConfigError(f"batch_size must be a whole number, got {batch_size!r}")
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be positive, got {batch_size}",
                          hint="batch_size is the number of examples each worker takes per step")
    return batch_size


def _data_arity(fn: Callable) -> int:
    """0 for ``data()``, 2 for ``data(shard_index, num_shards)``."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        return 0
    if len(params) not in (0, 2):
        raise JobError(f"data function {getattr(fn, '__name__', fn)!r} takes {len(params)} required "
                       "arguments", hint="write it as data() or data(shard_index, num_shards)")
    return len(params)


def _reason(error: Exception) -> str:
    """The first paragraph of an error that says what went wrong (Keras wraps a call's error in
    "Exception encountered when calling ..." and "Arguments received by ..." paragraphs)."""
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Keras' bold
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    told = [p for p in paragraphs if not p.startswith(("Exception encountered", "Arguments received"))]
    return (told or paragraphs or [type(error).__name__])[0]


def _describe_specs(structure) -> str:
    """``{left: int32[6]}``: dtype and shape of every leaf of a nest of tensor specs."""
    import tensorflow as tf

    def leaf(spec):
        return f"{spec.dtype.name}[{', '.join('None' if d is None else str(d) for d in spec.shape.as_list())}]"

    return str(tf.nest.map_structure(leaf, structure)).replace("'", "")


@contextlib.contextmanager
def fresh_keras_names():
    """Build with Keras' auto-name counters reset, then restore them.

    Keras names unnamed layers ``dense``, ``dense_1``, ... from a process-wide counter, so the
    same builder gives other variable paths in a notebook kernel that has built models
    before than on a fresh MPI engine. Plans and checkpoints are keyed by variable path, so
    every build of a Job must name its variables the same in every process.
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # a Keras without this private module: names stay process-dependent
        yield
        return
    saved = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", saved)


@dataclass(frozen=True)
class Job:
    """A single-device training recipe.

    model:      ``() -> keras.Model``, built fresh on each call.
    loss:       ``(y_true, y_pred) -> tensor``; per-example values are averaged over the batch.
    optimizer:  ``() -> keras.optimizers.Optimizer``.
    data:       ``(shard_index, num_shards) -> tf.data.Dataset`` of *unbatched* ``(x, y)``
                examples, the shards disjoint and interleaved (example i belongs to shard
                i % num_shards), or ``() -> tf.data.Dataset``, which is then sharded that way.
    batch_size: examples per worker per step; the global batch is workers x batch_size.
    sync_batch_norm: on several ranks, ``BatchNormalization`` layers normalise with the
                statistics of the global batch (allreduced, as on one device with the
                global batch); False keeps each rank's own batch statistics (faster, as
                plain Horovod does). See :mod:`parallax_nb.runtime.batchnorm`.
    """

    model: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    data: Callable[..., Any]
    batch_size: int
    name: str = "job"
    metadata: dict = field(default_factory=dict)
    sync_batch_norm: bool = True

    def __post_init__(self):
        for name in ("model", "loss", "optimizer", "data"):
            if not callable(getattr(self, name)):
                raise JobError(f"Job.{name} must be callable, got {type(getattr(self, name)).__name__}",
                               hint=f"pass a function that returns the {name}, not the {name} itself"
                               if name in ("model", "optimizer", "data") else None)
        _check_batch_size(self.batch_size)
        _data_arity(self.data)
        if not isinstance(self.sync_batch_norm, bool):
            raise ConfigError(f"sync_batch_norm must be True or False, got {self.sync_batch_norm!r}")

    def replace(self, **changes) -> "Job":
        values = dict(model=self.model, loss=self.loss, optimizer=self.optimizer, data=self.data,
                      batch_size=self.batch_size, name=self.name, metadata=self.metadata,
                      sync_batch_norm=self.sync_batch_norm)
        values.update(changes)
        return Job(**values)

    def build_model(self):
        """Call the model builder and return the model with all its variables created.

        A ``Sequential`` without ``keras.Input`` and a subclassed ``keras.Model`` create their
        variables on their first call: such a model is called once on zeros shaped like one
        example of the data (batch of 1, unknown dimensions 1), under the same fresh Keras
        names, so that every build of this Job, in the profiler, on every rank and in a
        checkpoint, has the same variables under the same paths.
        """
        import keras

        with fresh_keras_names():
            model = self.model()
            if not isinstance(model, keras.Model):
                raise JobError(f"Job.model must return a keras.Model, got {type(model).__name__}",
                               hint="wrap your layers in keras.Model(inputs, outputs) or keras.Sequential")
            if not model.built:
                self._build_on_zeros(model)
        return model

    def _build_on_zeros(self, model) -> None:
        """Create a lazily built model's variables: one inference call on a zero example."""
        import tensorflow as tf

        spec = self.examples(0, 1).element_spec
        x_spec = spec[0] if isinstance(spec, tuple) and len(spec) == 2 else spec

        def zeros(leaf):
            shape = [1] + [1 if d is None else d for d in leaf.shape.as_list()]
            return tf.zeros(shape, leaf.dtype)

        try:
            model(tf.nest.map_structure(zeros, x_spec), training=False)
        except Exception as e:  # noqa: BLE001 - any failure of the user's call, in the user's terms
            raise JobError(f"model {model.name!r} is built on its first call, and calling it on one zero example "
                           f"of the data ({_describe_specs(x_spec)}) failed: {type(e).__name__}: {_reason(e)}",
                           hint="check that the data's x matches what the model's call() takes, or give the model "
                                "a keras.Input") from None

    def make_optimizer(self):
        import keras

        opt = self.optimizer()
        if not isinstance(opt, keras.optimizers.Optimizer):
            raise JobError(f"Job.optimizer must return a keras.optimizers.Optimizer, got {type(opt).__name__}",
                           hint="pass a factory, e.g. optimizer=lambda: keras.optimizers.Adam(1e-3)")
        return opt

    def examples(self, shard_index: int = 0, num_shards: int = 1):
        """The unbatched examples of one shard (example i is in shard i % num_shards)."""
        import tensorflow as tf

        if not (isinstance(num_shards, int) and num_shards >= 1 and 0 <= shard_index < num_shards):
            raise ConfigError(f"shard {shard_index!r} of {num_shards!r} is out of range")
        if _data_arity(self.data) == 2:
            ds = self.data(shard_index, num_shards)
        else:
            ds = self.data()
            if isinstance(ds, tf.data.Dataset) and num_shards > 1:
                ds = ds.shard(num_shards, shard_index)
        if not isinstance(ds, tf.data.Dataset):
            raise JobError(f"Job.data must return a tf.data.Dataset, got {type(ds).__name__}")
        return ds

    def dataset(self, shard_index: int = 0, num_shards: int = 1, batch_size: int | None = None):
        """Batched, endlessly repeated examples of one shard: step s of shard r reads examples
        ``r + num_shards * (s * batch + j)``, so the shards of one step together are exactly the
        single-device batch of ``num_shards * batch`` examples at that step."""
        batch = _check_batch_size(self.batch_size if batch_size is None else batch_size)
        return self.examples(shard_index, num_shards).repeat().batch(batch, drop_remainder=True)

    def loss_value(self, model, x, y, training: bool = True):
        """Mean loss of ``model`` on one batch."""
        import tensorflow as tf

        value = self.loss(y, model(x, training=training))
        return tf.reduce_mean(tf.cast(value, tf.float32))

    def to_bytes(self) -> bytes:
        import cloudpickle

        return cloudpickle.dumps(self)

    @staticmethod
    def from_bytes(data: bytes) -> "Job":
        import cloudpickle

        job = cloudpickle.loads(data)
        if not isinstance(job, Job):
            raise JobError(f"expected a pickled Job, got {type(job).__name__}")
        return job


def load_job(spec: str) -> Job:
    """Import ``module:attr`` (e.g. ``my_models:job``) and return the Job it names.

    ``attr`` may also be a function of no arguments that returns a Job.
    """
    import importlib
    import os
    import sys

    if ":" not in spec:
        raise ConfigError(f"job spec {spec!r} is not of the form module:name",
                          hint="e.g. parallax_nb.workloads:lm_tiny or my_models:job")
    module_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r} for job {spec!r}: {e}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, Job):
        obj = obj()
    if not isinstance(obj, Job):
        raise ConfigError(f"{spec} is a {type(obj).__name__}, not a parallax_nb.Job")
    return obj
