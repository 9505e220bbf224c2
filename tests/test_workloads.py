"""Each reference workload trains on one device, and exactly its row-gathered variables
(Keras Embedding tables, the LM's sampled-softmax weights) get tf.IndexedSlices gradients.

Checked with a plain GradientTape, independently of the profiler."""
import math

import numpy as np
import pytest

from parallax_nb.workloads import LMConfig, RecommenderConfig, cnn_job, lm_job, recommender_job

WORKLOADS = {"lm": lm_job, "recommender": recommender_job, "cnn": cnn_job}


def _gathered_variables(model) -> set[str]:
    """Variables read by row gathers, from the model's structure: every Keras Embedding's table
    and the weights of the LM's SampledSoftmax layer."""
    import keras

    from parallax_nb.workloads.lm import sampled_softmax_class

    names = set()
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (keras.layers.Embedding, sampled_softmax_class())):
            names.update(v.path for v in layer.trainable_variables)
    return names


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_trains_five_steps_with_sparse_embeddings_only(name):
    import tensorflow as tf

    job = WORKLOADS[name]("tiny")
    model, optimizer = job.build_model(), job.make_optimizer()
    variables = model.trainable_variables
    kinds = {}

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = job.loss_value(model, x, y)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            kinds[v.path] = type(g).__name__
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    before = [v.numpy().copy() for v in variables]
    losses = [float(step(x, y)) for x, y in job.dataset(0, 1).take(5)]
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses), losses
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))  # it trained

    sparse = {n for n, kind in kinds.items() if kind == "IndexedSlices"}
    assert sparse == _gathered_variables(model)
    assert all(kinds[n] in ("EagerTensor", "Tensor", "SymbolicTensor") for n in kinds if n not in sparse), kinds
    if name == "cnn":
        assert sparse == set()
    elif name == "lm":
        assert sparse == {"embedding/embeddings", "softmax/softmax_w", "softmax/softmax_b"}
    else:
        assert sparse == {f"table_{i}/embeddings" for i in range(len(RecommenderConfig.of_size("tiny").table_sizes))}


def test_lm_realistic_has_a_large_vocabulary():
    config = LMConfig.of_size("realistic")
    assert config.vocab_size >= 100_000
    job = lm_job("realistic")
    assert job.metadata["vocab_size"] == config.vocab_size
