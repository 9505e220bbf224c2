"""Checks that turn a user's mistake into a :class:`ProfileError` naming the problem and the value.

Three moments: before the first step (the data yields ``(x, y)`` pairs, integer model inputs
get integer data), when a step raises (say what the model expected and what the data gave,
or, for ids out of range, which variable, which id and which range), and after every step
(row ids of sparse gradients lie in ``[0, rows)``; on GPUs ``tf.gather`` does not raise).
"""
from __future__ import annotations

import re

import numpy as np

from .errors import ProfileError

_OUT_OF_RANGE = re.compile(r"indices\[[^\]]*\]\s*=\s*(-?\d+)\s+is not in \[0,\s*(\d+)\)")
_NODE = re.compile(r"node\s+([^\s}\]]+)")


def describe(structure) -> str:
    """``{'tokens': int32[None, 8], ...}``: dtype and shape of every leaf of a nest of tensors/specs."""
    import tensorflow as tf

    def leaf(t):
        dtype = getattr(t, "dtype", None)
        dtype = getattr(dtype, "name", dtype)
        shape = getattr(t, "shape", None)
        dims = "?" if shape is None else ", ".join("None" if d is None else str(d) for d in tuple(shape))
        return f"{dtype}[{dims}]"

    try:
        described = tf.nest.map_structure(leaf, structure)
    except (TypeError, ValueError):
        return repr(structure)
    return str(described).replace("'", "").replace('"', "")


def check_pairs(element_spec) -> tuple:
    """The dataset must yield ``(x, y)``: return ``(x_spec, y_spec)`` or raise naming what it yields."""
    if not (isinstance(element_spec, tuple) and len(element_spec) == 2):
        raise ProfileError(
            f"the data function must yield (x, y) pairs, but its batches look like {describe(element_spec)}",
            hint="return tf.data.Dataset.from_tensor_slices((features, labels)) of unbatched examples")
    return element_spec


def model_inputs(model):
    """The model's declared input structure (KerasTensors), or None for a model built lazily."""
    try:
        return model.input
    except (AttributeError, ValueError):
        return None


def check_inputs_fit(model, x_spec) -> None:
    """Before tracing: every named model input has data, and integer inputs (ids) get integer data.

    Keras silently casts float data to an integer input (3.7 becomes 3), which would profile
    the wrong rows, so a float tensor for an integer input is an error here.
    """
    import tensorflow as tf

    expected = model_inputs(model)
    if expected is None:
        return
    if isinstance(expected, dict) and isinstance(x_spec, dict):
        missing = sorted(set(expected) - set(x_spec))
        if missing:
            raise ProfileError(
                f"the data has no features for model inputs {missing}: the model takes {describe(expected)}, "
                f"the data gives {describe(x_spec)}",
                hint="make the data function yield x as a dict keyed by the model's input names")
        pairs = [(name, expected[name], x_spec[name]) for name in sorted(expected)]
    else:
        flat_expected, flat_seen = tf.nest.flatten(expected), tf.nest.flatten(x_spec)
        if len(flat_expected) != len(flat_seen):
            return  # let the first step report it with Keras's own reason
        pairs = [(getattr(e, "name", str(i)), e, s) for i, (e, s) in enumerate(zip(flat_expected, flat_seen))]
    for name, want, seen in pairs:
        want_dtype = tf.as_dtype(getattr(want, "dtype", "float32"))
        seen_dtype = tf.as_dtype(seen.dtype)
        if want_dtype.is_integer and not seen_dtype.is_integer:
            raise ProfileError(
                f"model input {name!r} takes integer ids ({want_dtype.name}) but the data gives {seen_dtype.name}: "
                "non-integer embedding ids",
                hint=f"cast the ids to int32 in the data function, e.g. tf.cast(x[{name!r}], tf.int32)")


def out_of_range_error(error: Exception, model, step: int) -> ProfileError | None:
    """A ProfileError naming the variable, the bad id and the valid range, if ``error`` is tf.gather's
    "indices[...] = v is not in [0, rows)"; None for any other error.

    The variable is found from the failing node's layer (``model/<layer>/Gather``) among the
    trainable variables with that many rows; if several match, all are named.
    """
    text = str(error)
    m = _OUT_OF_RANGE.search(text)
    if not m:
        return None
    value, rows = int(m.group(1)), int(m.group(2))
    candidates = [v for v in model.trainable_variables if len(v.shape) and int(v.shape[0]) == rows]
    node = _NODE.search(text)
    if node:
        parts = [re.sub(r"_\d+$", "", p) for p in node.group(1).split("/")]
        in_layer = [v for v in candidates if v.path.split("/")[0] in parts]
        candidates = in_layer or candidates
    names = " or ".join(repr(v.path) for v in candidates) or f"a variable of {rows} rows"
    return ProfileError(
        f"embedding id {value} is out of range for {names}: valid ids are 0..{rows - 1} ({rows} rows); "
        f"seen in the batch of step {step}",
        hint="ids must be integers in [0, vocabulary size); check the data function or enlarge the table")


def check_no_negative_ids(x, step: int) -> None:
    """Integer features are ids, and ids are never negative: Keras ``Embedding`` would silently wrap
    -3 around to row ``rows - 3`` (numpy's ``take``), profiling and training the wrong rows."""
    import tensorflow as tf

    if isinstance(x, dict):
        leaves = sorted(x.items())
    else:
        leaves = [(str(i), t) for i, t in enumerate(tf.nest.flatten(x))]
    for name, tensor in leaves:
        if tensor.dtype.is_integer:
            values = tensor.numpy()  # host copy of a batch of ids: cheaper than an eager reduction
            smallest = int(values.min()) if values.size else 0
            if smallest < 0:
                raise ProfileError(
                    f"embedding id {smallest} in input {name!r} is out of range: ids must be >= 0; "
                    f"seen in the batch of step {step}",
                    hint="ids index rows of an embedding table: integers in [0, vocabulary size)")


def check_sparse_rows(name: str, unique_rows: np.ndarray, rows: int, step: int) -> None:
    """Row ids of a sparse gradient must lie in [0, rows) (GPUs gather zeros instead of raising)."""
    if unique_rows.size and (unique_rows.min() < 0 or unique_rows.max() >= rows):
        bad = int(unique_rows.min()) if unique_rows.min() < 0 else int(unique_rows.max())
        raise ProfileError(
            f"embedding id {bad} is out of range for {name!r}: valid ids are 0..{rows - 1} ({rows} rows); "
            f"seen in the batch of step {step}",
            hint="ids must be integers in [0, vocabulary size); check the data function or enlarge the table")


_SCOPE_NAME = re.compile(r"'([^']*)' is not a valid (?:root )?scope name")


def layer_name_error(error: Exception) -> ProfileError | None:
    """TensorFlow refuses some layer names as name scopes inside ``tf.function`` (spaces,
    most punctuation); that is a naming problem, not a data problem."""
    m = _SCOPE_NAME.search(str(error))
    if not m:
        return None
    return ProfileError(f"the layer name {m.group(1)!r} cannot be used inside tf.function: TensorFlow name scopes "
                        "take letters, digits and . _ - / only, and start with a letter, digit or .",
                        hint="rename the layer, e.g. name=" + repr(re.sub(r"[^A-Za-z0-9_.\-/]", "_", m.group(1))))


def step_error(error: Exception, model, x, step: int) -> ProfileError:
    """Why the step failed, in the user's terms: what the model expects versus what the data gave."""
    found = out_of_range_error(error, model, step) or layer_name_error(error)
    if found is not None:
        return found
    reason = _first_line(error)
    if not reason.startswith(type(error).__name__):
        reason = f"{type(error).__name__}: {reason}"
    expected = model_inputs(model)
    return ProfileError(
        f"the model could not train on the data at step {step}: the model takes "
        f"{describe(expected) if expected is not None else 'inputs it declares when first called'}, "
        f"the data gives x = {describe(x)} ({reason})",
        hint="make the data function yield (x, y) with x shaped like the model's inputs")


def _first_line(error: Exception) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    for ln in lines:
        if "Error:" in ln or ln.startswith(("Layer", "Input", "Missing")):
            return ln[:300]
    return lines[-1][:300] if lines else type(error).__name__
