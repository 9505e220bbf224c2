"""One vocabulary and one palette for methods, architectures and variable kinds.

Every view (widgets, the HTML report, the command line, the notebooks) names and colours a
method or an architecture from this table, so "PS" is the same word and the same orange
everywhere and sparse-as-dense has one name. Keys are the values the rest of the package
uses: ``Method.value`` ("ps", "ar"), ``Architecture.value`` ("ar", "ps", "hybrid", "auto"),
the baseline keys ``types.BASELINE_KEYS``, ``Kind.value`` ("sparse", "dense").
Badges are capitals everywhere: PS, AR, HYBRID, AUTO, SPARSE, DENSE.

Colours carry white badge text at a contrast of at least 4.5:1 (WCAG AA), so a badge reads
the same on a light and a dark page; text on the page itself uses the theme's colours.
"""
from __future__ import annotations

from dataclasses import dataclass

from .types import PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS


@dataclass(frozen=True)
class Label:
    """How one method, architecture or kind is shown: ``text`` (short, in badges, legends and
    table cells), ``colour`` (hex, white text on it reads at >= 4.5:1) and ``description``
    (a tooltip sentence)."""

    text: str
    colour: str
    description: str


SPARSE_AS_DENSE_TEXT = "sparse-as-dense AR"   # the one name of Horovod with sparse_as_dense=True
PLAIN_HOROVOD_TEXT = "plain Horovod (defaults)"

LABELS: dict[str, Label] = {
    "ps": Label("PS", "#b35900", "parameter servers: each rank owns a slice of the variable; only touched rows move"),
    "ar": Label("AR", "#2f6bb3", "allreduce: every rank averages whole gradients (sparse ones are allgathered)"),
    "hybrid": Label("HYBRID", "#247a3d", "AR for dense variables, PS for sparse ones (Parallax)"),
    "auto": Label("AUTO", "#6f42c1",
                  "per variable (and local aggregation), whatever the estimated step time calls faster"),
    SPARSE_AS_DENSE: Label(SPARSE_AS_DENSE_TEXT, "#5f6b7a",
                           "Horovod with sparse_as_dense=True: sparse gradients densified, then allreduced"),
    PLAIN_HOROVOD: Label(PLAIN_HOROVOD_TEXT, "#3d4451",
                         "Horovod's defaults: sparse gradients allgathered among all ranks with their duplicate rows"),
    TF_PS: Label("TF parameter servers", "#7a4a14",
                 "TensorFlow's parameter servers: every variable on servers, each worker pushes and pulls on its own"),
    "sparse": Label("SPARSE", "#1f7a70", "a step touches only some rows (the gradient is tf.IndexedSlices)"),
    "dense": Label("DENSE", "#5f6b7a", "every step produces a full gradient"),
}


def label(key) -> Label:
    """The :class:`Label` of a method, architecture or kind (an enum or its value)."""
    value = str(getattr(key, "value", key)).lower()
    try:
        return LABELS[value]
    except KeyError:
        return Label(str(getattr(key, "value", key)), "#5f6b7a", "")


def text(key) -> str:
    """``text("ps") == "PS"``, ``text("sparse_as_dense") == "sparse-as-dense AR"``."""
    return label(key).text


def colour(key) -> str:
    return label(key).colour
