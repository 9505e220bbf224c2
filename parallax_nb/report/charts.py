"""The report's two charts, drawn with matplotlib's Agg/SVG backends into SVG text.

Charts are drawn from the report's plain data (the same dict the JSON holds), so a report
loaded back from JSON redraws the same pictures. They are embedded as ``data:`` URIs in
``<img>`` elements: an image cannot run script or fetch anything, whatever text it holds.
Text is rendered as paths (``svg.fonttype = "path"``) so the picture needs no font, and
``text.parse_math`` is off so a ``$`` in a variable name is drawn as a dollar sign, not
read as TeX.
"""
from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, no GUI toolkit, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

from .. import labels  # noqa: E402
from ..plan import RECORDED_COSTS  # noqa: E402
from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, format_bytes  # noqa: E402

MAX_BARS = 40  # the bar chart shows the largest variables; the table always lists all
ARCH_LINESTYLES = {SPARSE_AS_DENSE: "--", PLAIN_HOROVOD: ":", TF_PS: "-."}

_STYLE = {
    "svg.fonttype": "path",
    "svg.hashsalt": "parallax_nb.report",  # stable element ids: same data, same SVG
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e2e8f0",
    "grid.linewidth": 0.6,
    "axes.edgecolor": "#a0aec0",
    "axes.axisbelow": True,
}


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buffer.getvalue()


def svg_data_uri(svg: str) -> str:
    """``data:image/svg+xml;base64,...`` for an ``<img src>``: no file beside the HTML."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _bytes_axis(value, _pos) -> str:
    return format_bytes(value).replace(".0 ", " ") if value > 0 else "0"


def bytes_per_variable_svg(variables: list[dict]) -> str:
    """Grouped horizontal bars: bytes per machine per step of each variable under PS, AR and
    sparse-as-dense AR (the largest ``MAX_BARS`` variables by size).

    The x axis is logarithmic when the values span more than two decades, because a sparse
    table's PS bytes and its sparse-as-dense bytes often differ by orders of magnitude.
    The method the plan chose is marked with a black edge.
    """
    shown = sorted(variables, key=lambda v: -v["size_bytes"])[:MAX_BARS]
    shown.reverse()  # largest at the top of a horizontal bar chart
    series = [(key, labels.text(key), f"{key}_bytes_per_step") for key in RECORDED_COSTS]
    values = [v[key] for v in shown for _, _, key in series]
    positive = [x for x in values if x > 0]
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(8.0, 1.2 + 0.42 * max(len(shown), 1)))
        height = 0.26
        for i, (method, label, key) in enumerate(series):
            ys = [row + (1 - i) * height for row in range(len(shown))]
            xs = [v[key] for v in shown]
            edges = ["#1a202c" if v["method"] == method else "none" for v in shown]
            ax.barh(ys, xs, height=height * 0.95, color=labels.colour(method), label=label,
                    edgecolor=edges, linewidth=1.2)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels([_short(v["name"]) for v in shown])
        if positive and max(positive) / min(positive) > 100:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=4))  # powers of 4 are round binary sizes: 1 KiB, 4 KiB...
            ax.set_xlim(left=min(positive) / 2)
        ax.xaxis.set_major_formatter(FuncFormatter(_bytes_axis))
        ax.set_xlabel("bytes sent + received per machine per step (black edge: the plan's method)")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)   # above the bars, off the data
        return _svg(fig)


def step_time_curve_svg(curve: dict, current_machines: int | None = None) -> str:
    """Estimated step time (ms) against the number of machines, one line per architecture.

    ``curve`` is ``{"machines": [1, ...], "step_time_s": {architecture: [seconds, ...]}}``;
    a dotted vertical line marks the planned cluster's machine count.
    """
    machines = curve["machines"]
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(8.0, 3.6))
        for arch, times in curve["step_time_s"].items():
            # HYBRID and AUTO often coincide: HYBRID is drawn wide and pale beneath AUTO.
            wide = arch == "hybrid"
            ax.plot(machines, [t * 1e3 for t in times], label=labels.text(arch),
                    color=labels.colour(arch), linewidth=4.0 if wide else 1.6, alpha=0.45 if wide else 1.0,
                    linestyle=ARCH_LINESTYLES.get(arch, "-"), zorder=2 if wide else 3)
        if current_machines is not None:
            ax.axvline(current_machines, color="#4a5568", linestyle=":", linewidth=1)
            ax.annotate(f"planned: {current_machines}", (current_machines, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -10), textcoords="offset points", fontsize=8, color="#4a5568")
        if machines and machines[-1] / max(machines[0], 1) >= 16:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
        ax.set_xlabel("machines")
        ax.set_ylabel("estimated step time (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(frameon=False, ncol=min(len(curve["step_time_s"]), 6), loc="upper left",
                  bbox_to_anchor=(0, -0.18))
        return _svg(fig)


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]
