"""The user's Keras optimizer with one-device semantics while its variables are sharded.

Keras clips and decays inside ``apply_gradients``, over the (gradient, variable) pairs it is
given. On a rank those are the replicated variables (AR: every rank holds the global-batch
gradient) and this rank's partitions of the PS variables. Left to Keras, each rank would
clip its own share on its own norm (the replicas drift apart, PS partitions get other
factors than on one device) and match ``exclude_from_weight_decay`` patterns against the
partitions' names. So the runtime takes clipping out of the optimizer and applies it to the
exchanged gradients itself, with g a variable's gradient and c the user's setting:

* ``clipnorm``: per variable, ``g *= c / max(||g||, c)`` with
  ``||g||^2 = sum over its pieces on every rank of ||piece||^2``;
* ``global_clipnorm``: ``g *= c * min(1 / ||G||, 1 / c)`` for every variable, ``||G||^2 =
  sum over variables of ||g||^2`` (Keras' formula, NaN when the norm is not finite);
* ``clipvalue``: ``clip(g, -c, c)`` elementwise (no state across pieces).

The squared norms of the PS pieces are allgathered (one number per PS variable and rank) and
summed in rank order, so every rank computes bit-identical factors and the replicas stay
identical. Sparse gradients arrive deduplicated (one entry per row), so norms are those of
the true, dense-equivalent gradient; Keras on one device takes them over the entries of the
``IndexedSlices`` instead (a row seen k times counts k entries).

Weight decay stays in Keras (it is elementwise), but whether a partition is decayed is
decided on the model variable it belongs to, with the tensor name Keras uses on one device
(``exclude_from_weight_decay(var_names=...)`` patterns match ``embeddings:0``, never
``px_shard__...``).

Options whose state spans the variables or the steps in ways the runtime does not carry
across ranks are refused with a :class:`~parallax_nb.errors.JobError` naming the option.
"""
from __future__ import annotations

import tensorflow as tf

from ..errors import JobError
from .tensor_ops import live

#: option -> why it is refused (the optimizer attribute named as the user wrote it)
REFUSED_OPTIONS = {
    "gradient_accumulation_steps": "its accumulators would clip the accumulated gradient inside Keras, per rank",
    "use_ema": "the trained weights would not be the moving averages (parallax_nb never finalises them)",
    "loss_scale_factor": "the runtime differentiates the unscaled loss, so Keras would divide unscaled gradients",
}


def check_supported(optimizer) -> None:
    """Refuse optimizer options the distributed step cannot give one-device semantics."""
    import keras

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise JobError("the optimizer is a keras.optimizers.LossScaleOptimizer: loss scaling for mixed precision "
                       "is not supported by the distributed step",
                       hint="train in float32 (no mixed_float16 policy) and return the inner optimizer")
    for option, why in REFUSED_OPTIONS.items():
        value = getattr(optimizer, option, None)
        if value:
            raise JobError(f"optimizer option {option}={value!r} is not supported: {why}",
                           hint=f"leave {option} unset in the optimizer factory")


class ShardedClipping:
    """The user's clipping, taken out of ``optimizer`` and applied across ranks (module docstring).

    ``owners``: optimizer variable -> (index of its model variable, sharded over ranks?).
    """

    def __init__(self, optimizer, syncs, ranks: int):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.ranks = ranks
        self.clipnorm, self.global_clipnorm, self.clipvalue = (
            value if value and value > 0 else None
            for value in (optimizer.clipnorm, optimizer.global_clipnorm, optimizer.clipvalue))
        optimizer.clipnorm = optimizer.global_clipnorm = optimizer.clipvalue = None
        self.names = [s.name for s in syncs]
        self.sharded = [s.shard is not None for s in syncs]
        self.owner = {id(v): i for i, s in enumerate(syncs) for v in s.optimizer_variables}

    @property
    def active(self) -> bool:
        return any(c is not None for c in (self.clipnorm, self.global_clipnorm, self.clipvalue))

    def clip(self, pairs: list[tuple]) -> tuple[list[tuple], list]:
        """The (gradient, variable) pairs with the user's clipping applied (Keras' precedence:
        clipnorm, else global_clipnorm, else clipvalue), and the tensors of the collective it
        issued: the step must depend on them, for a rank that updates nothing (it owns no
        partition) still has to join the other ranks' norm exchange, and an unused result would
        be pruned from the traced step."""
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if not self._clips_norms:
            return list(zip(self._value_clipped(grads), variables)), []
        squares = self._squared_norms(pairs)
        clipped = self._norm_clipped(grads, [self.owner[id(v)] for v in variables], squares)
        return list(zip(clipped, variables)), [squares]

    def clip_pushes(self, names: list[str], grads: list) -> list:
        """An asynchronous worker's own gradients (one per variable ``names[i]``, its rows
        unique), clipped as one device clips its step's gradient, before they are pushed: the
        formulas of :meth:`clip`, with the norms of this worker's gradient alone (there is no
        collective; the owners apply what arrives)."""
        if not self._clips_norms:
            return self._value_clipped(grads)
        index = [self.names.index(name) for name in names]
        squares = [tf.constant(0.0)] * len(self.names)
        for i, g in zip(index, grads):
            squares[i] = squares[i] + tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))
        return self._norm_clipped(grads, index, tf.stack(squares))

    @property
    def _clips_norms(self) -> bool:
        return self.clipnorm is not None or self.global_clipnorm is not None

    def _norm_clipped(self, grads: list, index: list[int], squares: tf.Tensor) -> list:
        """``grads`` (``index[i]``: the variable of ``grads[i]``) scaled by the module docstring's
        clipnorm factor of their variable, else by the global_clipnorm factor; ``squares``: every
        variable's squared norm."""
        if self.clipnorm is not None:
            factors = self.clipnorm / tf.maximum(tf.sqrt(squares), self.clipnorm)
            return [_scale(g, factors[i]) for g, i in zip(grads, index)]
        norm = tf.sqrt(tf.reduce_sum(squares))
        c = self.global_clipnorm
        factor = c * tf.minimum(1.0 / norm, 1.0 / c) + (norm - norm)
        return [_scale(g, factor) for g in grads]

    def _value_clipped(self, grads: list) -> list:
        if self.clipvalue is None:
            return grads
        return [_clip_values(g, self.clipvalue) for g in grads]

    def _squared_norms(self, pairs: list[tuple]) -> tf.Tensor:
        """Squared L2 norm of every model variable's whole gradient (float32, one per variable,
        zero for a variable without gradient), identical on every rank."""
        replicated = [tf.constant(0.0)] * len(self.names)
        sharded = [tf.constant(0.0)] * len(self.names)
        for g, v in pairs:
            i = self.owner[id(v)]
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            square = tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))
            if self.sharded[i]:
                sharded[i] = sharded[i] + square
            else:
                replicated[i] = replicated[i] + square
        local = tf.stack(sharded)
        if self.ranks > 1 and any(self.sharded):
            # constant on a rank that owns no partition
            everyone = self.hvd.allgather(live(local)[None], name="px_clip_norms", ignore_name_scope=True)
            local = tf.reduce_sum(everyone, 0)
        return tf.stack(replicated) + local


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _clip_values(grad, limit):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.clip_by_value(grad.values, -limit, limit), grad.indices, grad.dense_shape)
    return tf.clip_by_value(grad, -limit, limit)


def keep_weight_decay_choices(optimizer, syncs) -> None:
    """Decide weight decay of every optimizer variable on the model variable it belongs to.

    Keras asks ``optimizer._use_weight_decay(tf_variable)`` per updated variable; the
    partitions of a PS variable answer with their model variable's tensor (same name as
    on one device: :func:`~.sharded.release_storage` keeps it)."""
    if optimizer.weight_decay is None:
        return
    decide = optimizer._use_weight_decay
    model_tensor = {optimizer._var_key(v): s.variable.value for s in syncs for v in s.optimizer_variables}
    optimizer._use_weight_decay = lambda variable: decide(model_tensor.get(optimizer._var_key(variable), variable))


def take_over(optimizer, syncs, ranks: int) -> ShardedClipping:
    """Check ``optimizer``'s options, keep its weight-decay choices per model variable, and
    take its clipping over (apply the returned clipping to the exchanged pairs each step)."""
    check_supported(optimizer)
    keep_weight_decay_choices(optimizer, syncs)
    return ShardedClipping(optimizer, syncs, ranks)
