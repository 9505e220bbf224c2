"""Single-device training, the yardstick of the distributed runtime (DESIGN.md §7).

``train_single_device(job, steps, batch_size=N * b)`` runs the user's model exactly as written
(no routing, no sharding) on one device; N-rank training with per-rank batch b must end with
the same parameters, since the N shards of a step together are this step's batch.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..job import Job
from .tensor_ops import deduplicate


def train_single_device(job: Job, steps: int, batch_size: int | None = None, return_model: bool = False,
                        deduplicate_sparse: bool = True):
    """Weights (path -> array, incl. non-trainable) and losses after ``steps`` steps of ``batch_size``.

    ``deduplicate_sparse``: sum the repeated rows of ``IndexedSlices`` gradients before the
    optimizer, i.e. apply the true (dense-equivalent) gradient, as the distributed runtime
    does. Keras 3 on TensorFlow otherwise squares per-occurrence entries in Adam/Adagrad/
    RMSprop (a row seen k times in a batch gets a smaller second moment than its gradient's
    square); SGD is the same either way.
    """
    model = job.build_model()
    optimizer = job.make_optimizer()
    step = single_device_step(job, model, optimizer, deduplicate_sparse)
    losses = []
    for x, y in job.dataset(0, 1, batch_size=batch_size).take(steps):
        losses.append(float(step(x, y)))
    weights = {v.path: np.array(v.numpy()) for v in model.variables}
    if return_model:
        return weights, losses, model, optimizer
    return weights, losses


def single_device_step(job: Job, model, optimizer, deduplicate_sparse: bool = True, densify_sparse: bool = False):
    """``step(x, y) -> loss``: one single-device training step of ``model`` (forward, backward,
    optimizer update; no communication) as a ``tf.function``. The optimizer is built here.
    ``densify_sparse``: ``IndexedSlices`` gradients become dense tensors before the optimizer
    (as Horovod's ``sparse_as_dense`` hands them to it); otherwise ``deduplicate_sparse`` says
    whether their repeated rows are summed first (the runtime) or applied as they come (plain
    Horovod)."""
    variables = list(model.trainable_variables)
    optimizer.build(variables)

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = job.loss_value(model, x, y, training=True)
        grads = tape.gradient(loss, variables)
        if densify_sparse:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        elif deduplicate_sparse:
            grads = [deduplicate(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return loss

    return step


def variable_kinds(job: Job, model=None) -> dict:
    """``{path: Kind}`` of the trainable variables of ``model`` (default: a new one of the job)
    from one single-device gradient: sparse when the gradient is a ``tf.IndexedSlices`` (rows
    gathered), dense otherwise. Used to plan without a profile
    (``parallax_nb.plan.plan_for_kinds``) and by a calibration."""
    from ..types import Kind

    model = job.build_model() if model is None else model
    x, y = next(iter(job.dataset(0, 1).take(1)))
    with tf.GradientTape() as tape:
        loss = job.loss_value(model, x, y, training=False)
    grads = tape.gradient(loss, model.trainable_variables)
    return {v.path: (Kind.SPARSE if isinstance(g, tf.IndexedSlices) else Kind.DENSE)
            for v, g in zip(model.trainable_variables, grads)}


def default_plan(job: Job, architecture: str = "hybrid", ranks: int | None = None):
    """A plan without a profile: ``architecture`` applied to the job's variable kinds; PS
    variables get one partition per rank when the ``ranks`` it will run on are known (else 1,
    every variable whole on rank 0)."""
    from ..plan import plan_for_kinds

    return plan_for_kinds(variable_kinds(job), architecture, partitions=ranks or 1, model_name=job.name)
