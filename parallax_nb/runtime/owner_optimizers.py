"""The user's Keras optimizer as the owners of an asynchronous run apply it (issue 16).

An owner applies each push to its partitions as it arrives (:class:`.async_ps.AsyncPS`), on
numpy arrays, outside TensorFlow: the partitions and the optimizer's slots live in the
serving thread's arrays, and the worker's step never touches them. Each rule below is the
update of one Keras optimizer, the same float32 operations in the same order as its
``update_step`` (and ``_apply_weight_decay``), so one worker trains to the bit what the
synchronous runtime trains (``tests/test_async_optimizers.py``). The scalars Keras computes
with ``ops.power`` (Adam's bias correction) are computed with TensorFlow too: libm's and
numpy's float32 ``pow`` differ from it in the last bit for some steps.

What a push means for the optimizer:

* **One push is one optimizer step of its owner**, as on TensorFlow's asynchronous parameter
  servers: W workers make W updates where synchronous training makes one of their mean.
* **Its step is the pushing worker's**: the push carries how many steps the worker had
  finished, which is the optimizer's ``iterations`` for the learning-rate schedule and for
  Adam's bias correction. One worker therefore counts as synchronous training does, and a
  resumed run continues the count from the checkpoint.
* **Rows a push does not touch** change as Keras changes them for an ``IndexedSlices``
  gradient: not at all for plain SGD and Adagrad (their update of a zero gradient is zero),
  and with the slots' decay for momentum, Adam and RMSprop, which Keras applies to the whole
  variable (:attr:`OwnerRule.dense`): such an owner updates its whole partition for every
  push, as the synchronous PS updates its whole partition every step.
* **Weight decay** (``variable -= variable * weight_decay * lr``) acts on the whole partition
  before the update, for the variables Keras decays on one device (decided on the model
  variable's name, :func:`.optimizer.keep_weight_decay_choices`).
* **Clipping** belongs to the worker: it clips its own step's gradient before pushing it
  (:meth:`.optimizer.ShardedClipping.clip_pushes`), as one device clips its step's gradient.

Slots are named as Keras names them (``momentum``, ``velocity``, ``velocity_hat``,
``accumulator``, ``average_gradient``), so snapshots, checkpoints and a resume carry them in
the single-device layout (:mod:`.checkpoint`).
"""
from __future__ import annotations

import collections

import numpy as np

from ..errors import JobError

#: how many steps' scalars (learning rate, bias correction) an owner keeps computed
_SCALARS_KEPT = 64


class OwnerRule:
    """One Keras optimizer's update of a partition (subclasses), with its learning rate
    (a number or a Keras schedule of the step) and weight decay.

    ``slots``: the Keras slot names this rule keeps per partition, with their initial value.
    ``dense``: whether rows without gradient change too (then a push updates the whole partition).
    ``decayed``: the variables weight decay applies to.
    """

    slots: dict[str, float] = {}
    dense = False

    def __init__(self, learning_rate, weight_decay: float | None = None, decayed=()):
        self._learning_rate = learning_rate
        self.weight_decay = None if not weight_decay else np.float32(weight_decay)
        self.decayed = frozenset(decayed)
        self._scalars: collections.OrderedDict = collections.OrderedDict()

    def __call__(self, name: str, part: np.ndarray, rows, grads: np.ndarray, slots: dict[str, np.ndarray],
                 step: int) -> None:
        """Apply one push's gradient ``grads`` of ``part``'s local rows ``rows`` (unique, or
        ``slice(None)`` for the whole partition) of variable ``name``, pushed by a worker that
        had finished ``step`` steps; ``slots``: this partition's slot arrays (updated in place)."""
        scalars = self.scalars(step)
        if self.weight_decay is not None and name in self.decayed:
            part -= part * self.weight_decay * scalars[0]
        if self.dense and not isinstance(rows, slice):
            whole = np.zeros_like(part)
            whole[rows] = grads
            rows, grads = slice(None), whole
        self.update(part, rows, np.asarray(grads, part.dtype), slots, *scalars)

    def update(self, part, rows, grads, slots, learning_rate, *scalars) -> None:
        raise NotImplementedError

    def scalars(self, step: int) -> tuple:
        """The learning rate at ``step`` (and what else the rule computes once per step),
        float32 as Keras computes them, kept for the last steps (every worker's push of one
        step asks for the same)."""
        found = self._scalars.get(step)
        if found is None:
            found = self._compute_scalars(step)
            self._scalars[step] = found
            if len(self._scalars) > _SCALARS_KEPT:
                self._scalars.popitem(last=False)
        return found

    def _compute_scalars(self, step: int) -> tuple:
        return (self.learning_rate(step),)

    def learning_rate(self, step: int) -> np.float32:
        """The learning rate Keras uses at ``iterations == step``: the schedule's value there,
        or the constant (rounded to float32, as Keras keeps it in a float32 variable)."""
        if callable(self._learning_rate):
            import tensorflow as tf

            return np.float32(self._learning_rate(tf.constant(step, tf.int64)))
        return np.float32(self._learning_rate)

    def initial_slots(self, part: np.ndarray) -> dict[str, np.ndarray]:
        return {slot: np.full_like(part, value) for slot, value in self.slots.items()}


class SGD(OwnerRule):
    """``keras.optimizers.SGD``: ``w -= g * lr``; with momentum ``m = m * mu - g * lr`` and
    ``w += m`` (Nesterov: ``w += m * mu - g * lr``)."""

    def __init__(self, learning_rate, momentum: float = 0.0, nesterov: bool = False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.momentum = np.float32(momentum)
        self.nesterov = bool(nesterov)
        if momentum:
            self.slots, self.dense = {"momentum": 0.0}, True

    def update(self, part, rows, grads, slots, lr) -> None:
        if not self.momentum:
            part[rows] -= grads * lr
            return
        m = slots["momentum"]
        m[...] = m * self.momentum - grads * lr
        part += m * self.momentum - grads * lr if self.nesterov else m


class Adam(OwnerRule):
    """``keras.optimizers.Adam`` (and ``AdamW``, which is Adam with weight decay)."""

    dense = True

    def __init__(self, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.beta_1, self.beta_2, self.amsgrad = beta_1, beta_2, bool(amsgrad)
        self.one_minus_beta_1, self.one_minus_beta_2 = np.float32(1 - beta_1), np.float32(1 - beta_2)
        self.epsilon = np.float32(epsilon)
        self.slots = {"momentum": 0.0, "velocity": 0.0, **({"velocity_hat": 0.0} if amsgrad else {})}

    def _compute_scalars(self, step: int) -> tuple:
        """(lr, alpha): Keras' ``lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)``, t = step + 1."""
        import tensorflow as tf

        lr = self.learning_rate(step)
        t = tf.cast(tf.constant(step, tf.int64) + 1, tf.float32)
        beta_1_power = tf.pow(tf.cast(self.beta_1, tf.float32), t)
        beta_2_power = tf.pow(tf.cast(self.beta_2, tf.float32), t)
        alpha = tf.constant(lr) * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        return lr, np.float32(alpha)

    def update(self, part, rows, grads, slots, lr, alpha) -> None:
        m, v = slots["momentum"], slots["velocity"]
        m += (grads - m) * self.one_minus_beta_1
        v += (np.square(grads) - v) * self.one_minus_beta_2
        if self.amsgrad:
            v_hat = slots["velocity_hat"]
            np.maximum(v_hat, v, out=v_hat)
            v = v_hat
        part -= (m * alpha) / (np.sqrt(v) + self.epsilon)


class Adagrad(OwnerRule):
    """``keras.optimizers.Adagrad``: ``a += g ** 2``, ``w -= lr * g / sqrt(a + eps)``; rows
    without gradient do not change, so only the pushed rows are touched."""

    def __init__(self, learning_rate, initial_accumulator_value=0.1, epsilon=1e-7, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.epsilon = np.float32(epsilon)
        self.slots = {"accumulator": float(initial_accumulator_value)}

    def update(self, part, rows, grads, slots, lr) -> None:
        accumulator = slots["accumulator"]
        accumulator[rows] += np.square(grads)
        part[rows] -= (lr * grads) / np.sqrt(accumulator[rows] + self.epsilon)


class RMSprop(OwnerRule):
    """``keras.optimizers.RMSprop`` (momentum and centered included)."""

    dense = True

    def __init__(self, learning_rate, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.rho, self.one_minus_rho = np.float32(rho), np.float32(1 - rho)
        self.momentum, self.epsilon, self.centered = np.float32(momentum), np.float32(epsilon), bool(centered)
        self.slots = {"velocity": 0.0, **({"momentum": 0.0} if momentum > 0 else {}),
                      **({"average_gradient": 0.0} if centered else {})}

    def update(self, part, rows, grads, slots, lr) -> None:
        velocity = slots["velocity"]
        velocity[...] = self.rho * velocity + self.one_minus_rho * np.square(grads)
        if self.centered:
            average = slots["average_gradient"]
            average[...] = self.rho * average + self.one_minus_rho * grads
            denominator = velocity - np.square(average) + self.epsilon
        else:
            denominator = velocity + self.epsilon
        increment = (lr * grads) / np.sqrt(denominator)
        if self.momentum > 0:
            momentum = slots["momentum"]
            momentum[...] = self.momentum * momentum + increment
            part -= momentum
        else:
            part -= increment


def _rules():
    import keras

    o = keras.optimizers

    def adam(opt, **kw):   # AdamW is Adam with weight decay
        return Adam(beta_1=opt.beta_1, beta_2=opt.beta_2, epsilon=opt.epsilon, amsgrad=opt.amsgrad, **kw)

    return {
        o.SGD: lambda opt, **kw: SGD(momentum=opt.momentum, nesterov=opt.nesterov, **kw),
        o.Adam: adam,
        o.AdamW: adam,
        o.Adagrad: lambda opt, **kw: Adagrad(initial_accumulator_value=opt.initial_accumulator_value,
                                             epsilon=opt.epsilon, **kw),
        o.RMSprop: lambda opt, **kw: RMSprop(rho=opt.rho, momentum=opt.momentum, epsilon=opt.epsilon,
                                             centered=opt.centered, **kw),
    }


SUPPORTED = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop")


def owner_rule(optimizer, decayed=()) -> OwnerRule:
    """The rule the owners apply for the user's Keras ``optimizer`` (its learning rate or
    schedule, weight decay for the variables named in ``decayed``). Optimizers without one are
    refused naming those that have one."""
    import keras

    hint = (f"asynchronous training supports keras.optimizers {', '.join(SUPPORTED)}; "
            "use one of them, or train synchronously (sync=True) with this optimizer")
    make = _rules().get(type(optimizer))
    if make is None:
        raise JobError(f"asynchronous training applies the optimizer on the owners, and has no owner rule for "
                       f"{type(optimizer).__name__}", hint=hint)
    schedule = optimizer._learning_rate
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        learning_rate = schedule
    elif callable(schedule):
        raise JobError("asynchronous training takes a number or a keras.optimizers.schedules.LearningRateSchedule "
                       f"as the learning rate, got the callable {schedule!r}", hint=hint)
    else:
        learning_rate = float(np.asarray(optimizer.learning_rate))
    return make(optimizer, learning_rate=learning_rate, weight_decay=optimizer.weight_decay, decayed=decayed)
