"""Which optimizers asynchronous training accepts (issue 16): plain SGD at a constant learning
rate, applied by the owners; everything else is refused naming what is supported. No MPI."""
from __future__ import annotations

import pytest

from parallax_nb.errors import JobError


def _keras():
    import keras

    return keras


def test_plain_sgd_gives_its_learning_rate():
    from parallax_nb.runtime.trainer import async_learning_rate

    assert async_learning_rate(_keras().optimizers.SGD(0.25)) == 0.25


@pytest.mark.parametrize("make, named", [
    (lambda k: k.optimizers.Adam(1e-3), "Adam"),
    (lambda k: k.optimizers.SGD(0.1, momentum=0.9), "momentum"),
    (lambda k: k.optimizers.SGD(0.1, clipnorm=1.0), "clipnorm"),
    (lambda k: k.optimizers.SGD(0.1, weight_decay=1e-4), "weight_decay"),
    (lambda k: k.optimizers.SGD(k.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)), "ExponentialDecay"),
])
def test_other_optimizers_are_refused_naming_the_supported_one(make, named):
    from parallax_nb.runtime.trainer import async_learning_rate

    with pytest.raises(JobError) as err:
        async_learning_rate(make(_keras()))
    assert named in err.value.message
    assert "keras.optimizers.SGD" in err.value.hint and "sync=True" in err.value.hint
