"""Batch normalisation over the global batch: statistics allreduced across ranks.

On N ranks a Keras ``BatchNormalization`` layer normalises with its own rank's batch: per-rank
BatchNorm, which is not the single-device run on the global batch of N x b examples (its
weights and moving statistics drift from it). With ``Job(sync_batch_norm=True)``, the
default, every such layer computes, in training calls, per channel over the global batch
(w = the mask, or 1; sums over the layer's reduction axes and over the ranks):

    n = sum w,    mean = sum w x / n,    variance = sum w (x - mean)^2 / n

with two allreduces (sum) per call, of C + 1 and C numbers (C channels), the same two-pass
formula as ``tf.nn.moments`` on one device (the masked form divides by n + epsilon, as
Keras does). The moving statistics are then updated from global moments, identical on
every rank. Gradients flow back through the allreduces (the gradient of a sum over ranks
is the sum of the gradients over ranks), so the step's gradient is that of the
global-batch loss. This is what Horovod's ``SyncBatchNormalization`` does (it uses the
one-pass E[x^2] - mean^2).

``Job(sync_batch_norm=False)`` keeps per-rank statistics (no collective, as plain Horovod
does by default); the run summary says which (``batch_norm``).
"""
from __future__ import annotations

import tensorflow as tf


def batch_norm_layers(model) -> list:
    import keras

    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.BatchNormalization)]


def describe(model, synchronised: bool, ranks: int) -> dict:
    """What the run summary says about BatchNorm: its layers and whose statistics they use."""
    layers = [layer.name for layer in batch_norm_layers(model)]
    if not layers:
        statistics = "none"
    elif synchronised or ranks == 1:
        statistics = "global batch"
    else:
        statistics = "per rank"
    return {"layers": layers, "statistics": statistics}


class SyncBatchNorm:
    """Points every ``BatchNormalization`` layer of ``model`` at global-batch moments."""

    def __init__(self, model):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.layers = batch_norm_layers(model)
        for index, layer in enumerate(self.layers):
            layer._moments = lambda inputs, mask, _layer=layer, _index=index: self.moments(_layer, _index, inputs, mask)
        self.reset()

    def reset(self) -> None:
        """Start a new trace: calls are numbered per layer from 0 again (collective names)."""
        self._calls: dict[int, int] = {}

    def moments(self, layer, index: int, inputs, mask):
        """(mean, variance) of ``inputs`` over the global batch, shaped as Keras' ``_moments``."""
        call = self._calls.get(index, 0)
        self._calls[index] = call + 1
        tag = f"px_bn{index}_{call}"
        axes = list(layer._reduction_axes)
        if mask is None:
            local_sum = tf.reduce_sum(inputs, axes, keepdims=True)
            local_count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)), inputs.dtype)
            local_sum = tf.reduce_sum(inputs * weights, axes, keepdims=True)
            local_count = tf.reduce_sum(weights, axes, keepdims=True)
        channels = tf.shape(local_sum)
        flat_sum = tf.reshape(local_sum, [-1])
        flat_count = tf.reshape(local_count, [-1])
        total = self._allreduce(tf.concat([flat_sum, flat_count], 0), f"{tag}_mean")
        size = tf.size(flat_sum)
        count = tf.reshape(total[size:], tf.shape(local_count))
        if mask is None:
            mean = tf.reshape(total[:size], channels) / count
            squares = tf.square(inputs - tf.stop_gradient(mean))
        else:
            import keras

            count = count + keras.backend.epsilon()
            mean = tf.reshape(total[:size], channels) / count
            squares = tf.square(inputs - mean) * weights
        variance = self._allreduce(tf.reduce_sum(squares, axes, keepdims=True), f"{tag}_variance") / count
        return tf.squeeze(mean, axes), tf.squeeze(variance, axes)

    def _allreduce(self, local, name: str):
        """Sum over ranks, with the sum over ranks of the gradients as its gradient (both named)."""
        hvd = self.hvd

        @tf.custom_gradient
        def reduce(x):
            y = hvd.allreduce(x, op=hvd.Sum, name=name, ignore_name_scope=True)

            def grad(dy):
                return hvd.allreduce(tf.convert_to_tensor(dy), op=hvd.Sum, name=f"{name}_grad",
                                     ignore_name_scope=True)

            return y, grad

        return reduce(local)
