"""The owners' optimizers of asynchronous training (issue 16, :mod:`parallax_nb.runtime.owner_optimizers`):
each rule, applied to a variable's partitions push by push, gives the values Keras' own
optimizer gives on one device for the same gradients, to the bit, slots included; optimizers
without a rule are refused naming those with one. No MPI."""
from __future__ import annotations

import numpy as np
import pytest

from parallax_nb.errors import JobError

ROWS, DIM, PARTITIONS = 12, 3, 2


def _keras():
    import keras

    return keras


def _optimizers(k):
    o = k.optimizers
    return {
        "sgd": lambda: o.SGD(0.3),
        "sgd_decay": lambda: o.SGD(0.3, weight_decay=0.05),
        "sgd_momentum": lambda: o.SGD(0.3, momentum=0.9),
        "sgd_nesterov_decay": lambda: o.SGD(0.3, momentum=0.5, nesterov=True, weight_decay=0.05),
        "adam": lambda: o.Adam(0.05),
        "adam_amsgrad_schedule": lambda: o.Adam(o.schedules.ExponentialDecay(0.05, 2, 0.5), amsgrad=True),
        "adamw": lambda: o.AdamW(0.05, weight_decay=0.2),
        "adagrad": lambda: o.Adagrad(0.2, initial_accumulator_value=0.3),
        "rmsprop": lambda: o.RMSprop(0.02),
        "rmsprop_centered_momentum": lambda: o.RMSprop(0.02, momentum=0.5, centered=True),
        "sgd_piecewise": lambda: o.SGD(o.schedules.PiecewiseConstantDecay([1, 3], [0.5, 0.1, 0.02])),
    }


def _pushes():
    """(rows, gradient of those rows) per push: some rows twice, some never, one whole push."""
    rng = np.random.default_rng(3)
    pushes = []
    for rows in ([0, 3, 4], [1, 3, 11], None, [5], [0, 2, 4, 6, 8, 10]):
        rows = np.arange(ROWS) if rows is None else np.array(rows)
        pushes.append((rows, rng.normal(size=(len(rows), DIM)).astype(np.float32)))
    return pushes


@pytest.mark.parametrize("name", list(_optimizers(_keras())))
def test_owner_rule_gives_keras_values_to_the_bit(name):
    """One Keras optimizer on the whole variable, eager, one ``apply_gradients`` per push
    (``IndexedSlices`` of the pushed rows); against it the rule on the variable's two
    partitions (rows p, p + 2, ...), each push split by partition as the owners get it."""
    import tensorflow as tf

    from parallax_nb.runtime.owner_optimizers import owner_rule

    k = _keras()
    make = _optimizers(k)[name]
    initial = np.random.default_rng(1).normal(size=(ROWS, DIM)).astype(np.float32)
    variable = k.Variable(initial, name="table")
    keras_optimizer = make()
    keras_optimizer.build([variable])
    rule = owner_rule(make(), decayed=["table"])
    parts = {p: initial[p::PARTITIONS].copy() for p in range(PARTITIONS)}
    slots = {p: rule.initial_slots(parts[p]) for p in parts}
    for step, (rows, grads) in enumerate(_pushes()):
        keras_optimizer.apply_gradients([(tf.IndexedSlices(tf.constant(grads), tf.constant(rows), (ROWS, DIM)),
                                          variable)])
        for p in parts:
            mine = rows % PARTITIONS == p
            rule("table", parts[p], rows[mine] // PARTITIONS, grads[mine], slots[p], step)
    expected = variable.numpy()
    assert not np.array_equal(expected, initial)
    for p in parts:
        assert np.array_equal(parts[p], expected[p::PARTITIONS]), (name, p, np.abs(parts[p] - expected[p::PARTITIONS]).max())
    keras_slots = {v.name[len("table_"):]: v.numpy() for v in keras_optimizer.variables if v.name.startswith("table_")}
    assert sorted(keras_slots) == sorted(rule.slots), (keras_slots.keys(), rule.slots)
    for slot, value in keras_slots.items():
        for p in parts:
            assert np.array_equal(slots[p][slot], value[p::PARTITIONS]), (name, slot, p)


def test_weight_decay_only_for_the_variables_keras_decays():
    from parallax_nb.runtime.owner_optimizers import owner_rule

    rule = owner_rule(_keras().optimizers.SGD(0.5, weight_decay=0.1), decayed=["kernel"])
    kernel, bias = np.ones((2, 2), np.float32), np.ones((2,), np.float32)
    rule("kernel", kernel, slice(None), np.zeros_like(kernel), {}, 0)
    rule("bias", bias, slice(None), np.zeros_like(bias), {}, 0)
    assert np.all(kernel == np.float32(1) - np.float32(1) * np.float32(0.1) * np.float32(0.5))
    assert np.all(bias == 1.0)


@pytest.mark.parametrize("make, named", [
    (lambda k: k.optimizers.Nadam(1e-3), "Nadam"),
    (lambda k: k.optimizers.Lion(1e-3), "Lion"),
    (lambda k: k.optimizers.Adamax(1e-3), "Adamax"),
    (lambda k: k.optimizers.SGD(lambda: 0.1), "callable"),
])
def test_optimizers_without_an_owner_rule_are_refused_naming_those_with_one(make, named):
    from parallax_nb.runtime.owner_optimizers import owner_rule

    with pytest.raises(JobError) as err:
        owner_rule(make(_keras()))
    assert named in err.value.message
    assert all(name in err.value.hint for name in ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop"))
    assert "sync=True" in err.value.hint
