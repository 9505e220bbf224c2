"""RunView: a live view of one distributed run (a :class:`parallax_nb.cluster.Run`).

Progress bar (steps done of steps asked), status line, a Stop button wired to
``run.stop()``, charts of loss, throughput (examples/s over all ranks) and bytes per step
(measured on rank 0, sent + received, next to the cost model's prediction for this run), and a
per-variable table of predicted vs measured bytes per step.

The Run is the model: the dispatcher's thread feeds it and the view subscribes with
``run.observe``. Cheap widgets (progress, status) update on every change; the PNG charts are
redrawn at most every ``redraw_s`` seconds and once more when the run finishes. Tests drive
a Run by hand (``run.add_records``, ``run.finish``) and read this view's state: the
``progress`` widget, ``chart_data()``, ``bytes_rows()``, ``stop_button``.
"""
from __future__ import annotations

import threading
import time

import ipywidgets as widgets

from ..types import format_bytes
from . import style

_STATUS_COLORS = {"starting": "#6a737d", "running": style.AR_COLOR, "stopping": style.PS_COLOR,
                  "done": "#1a7f37", "stopped": style.PS_COLOR, "failed": style.ERROR_FG}
_BAR_STYLES = {"done": "success", "stopped": "warning", "failed": "danger"}


def chart_series(run) -> dict:
    """The data the charts plot: lists per series (steps on the x axis)."""
    records = run.records
    predicted = run.predicted_bytes_by_variable()
    return {
        "step": [r["step"] for r in records],
        "loss": [r.get("loss") for r in records],
        "examples_per_s": [r.get("examples_per_s") for r in records],
        "bytes_per_step": [r["bytes_per_step"] for r in records],
        "predicted_bytes_per_step": sum(predicted.values()) if predicted else None,
    }


def bytes_rows(run) -> list[dict]:
    """Per variable: method, predicted and measured mean bytes per step (None when unknown)."""
    predicted = run.predicted_bytes_by_variable()
    measured = run.measured_bytes_by_variable()
    methods = {}
    if run.plan is not None and hasattr(run.plan, "variables"):
        methods = {v.name: v.method.value for v in run.plan.variables}
    names = list(methods) + [n for n in list(predicted) + list(measured) if n not in methods]
    seen, rows = set(), []
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        rows.append({"name": name, "method": methods.get(name), "predicted_bytes_per_step": predicted.get(name),
                     "measured_bytes_per_step": measured.get(name)})
    return rows


def render_charts(series: dict) -> bytes:
    """Three small charts side by side: loss, examples/s, bytes/step (measured vs predicted)."""
    fig = style.new_figure(10.5, 2.6)
    axes = fig.subplots(1, 3)
    steps = series["step"]
    panels = ((axes[0], "loss", "loss", "#1f2328"), (axes[1], "examples_per_s", "examples / s", style.SPARSE_COLOR),
              (axes[2], "bytes_per_step", "bytes / step (rank 0)", style.AR_COLOR))
    for ax, key, title, color in panels:
        values = [v if v is not None else float("nan") for v in series[key]]
        ax.plot(steps, values, color=color, linewidth=1.4, label="measured")
        ax.set_title(title, fontsize=9, color="#3c4048", loc="left")
        ax.set_xlabel("step", fontsize=8.5)
        style.style_axes(ax)
    predicted = series.get("predicted_bytes_per_step")
    if predicted is not None:
        axes[2].axhline(predicted, color=style.PS_COLOR, linestyle="--", linewidth=1.2, label="predicted")
    axes[2].yaxis.set_major_formatter(_bytes_formatter())
    if predicted is not None or steps:
        axes[2].legend(fontsize=7.5, frameon=False)
    fig.tight_layout()
    return style.figure_png(fig)


def _bytes_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: style.short_bytes(x))


def render_bytes_table(rows: list[dict]) -> str:
    if not rows:
        return '<div style="color:#6a737d; font-size:12px">no per-variable bytes yet</div>'

    def fmt(x):
        return format_bytes(x) if x is not None else "-"

    def ratio(row):
        p, m = row["predicted_bytes_per_step"], row["measured_bytes_per_step"]
        return f"{m / p:.2f}" if p and m is not None else "-"

    body = [[f"<code>{style.esc(r['name'])}</code>",
             style.badge(r["method"], style.METHOD_COLORS.get(r["method"], style.DENSE_COLOR)) if r["method"] else "-",
             fmt(r["predicted_bytes_per_step"]), fmt(r["measured_bytes_per_step"]), ratio(r)] for r in rows]
    return style.html_table(["variable", "method", "predicted / step", "measured / step", "measured / predicted"],
                            body)


class RunView(widgets.VBox):
    """Live progress of a Run, with a Stop button. ``RunView(run)``; display it in a notebook."""

    def __init__(self, run, redraw_s: float = 0.5, **kwargs):
        self.run = run
        self.redraw_s = float(redraw_s)
        self._last_draw = 0.0
        self._drawn_steps = -1
        self._draw_lock = threading.Lock()
        architecture = getattr(getattr(run.plan, "architecture", None), "value", run.architecture)
        self.title = widgets.HTML(style.heading(
            f"Run on {run.engines} MPI engines",
            f"{run.steps} steps" + (f", {architecture} plan" if architecture else ", no plan")))
        self.progress = widgets.IntProgress(value=0, min=0, max=max(run.steps, 1), description="steps",
                                            layout=widgets.Layout(width="60%"))
        self.status = widgets.HTML()
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="danger",
                                          tooltip="stop every engine after its current step")
        self.stop_button.on_click(self._on_stop_clicked)
        self.charts = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.bytes_table = widgets.HTML()
        self.error = widgets.HTML()
        super().__init__([self.title, widgets.HBox([self.progress, self.stop_button]), self.status,
                          self.charts, self.bytes_table, self.error], **kwargs)
        self.add_class("parallax-run-view")
        run.observe(self._on_change)
        self.refresh(force=True)

    # ----- model -> widgets ------------------------------------------------------------------------
    def _on_change(self, run, what: str) -> None:
        self._update_cheap()
        if run.done:
            self.refresh(force=True)
        elif time.monotonic() - self._last_draw >= self.redraw_s:
            self.refresh()

    def _update_cheap(self) -> None:
        run = self.run
        self.progress.max = max(run.steps, 1)
        self.progress.value = min(run.steps_done, self.progress.max)
        if run.status in _BAR_STYLES:
            self.progress.bar_style = _BAR_STYLES[run.status]
        self.status.value = self.status_html()
        self.stop_button.disabled = run.done or run.status == "stopping"
        if run.error is not None:
            self.error.value = self.error_html()

    def status_text(self) -> str:
        """One line: status, steps, last loss, throughput, bytes/step, elapsed time."""
        run = self.run
        parts = [run.status, f"{run.steps_done}/{run.steps} steps"]
        records = run.records
        if records:
            last = records[-1]
            if last.get("loss") is not None:
                parts.append(f"loss {last['loss']:.4f}")
            if last.get("examples_per_s") is not None:
                parts.append(f"{last['examples_per_s']:.0f} examples/s")
            parts.append(f"{format_bytes(last['bytes_per_step'])}/step")
        parts.append(f"{run.elapsed_s:.1f} s")
        if run.message and run.message != run.status:
            parts.append(run.message)
        return " | ".join(parts)

    def status_html(self) -> str:
        color = _STATUS_COLORS.get(self.run.status, "#1f2328")
        return (f'<div class="parallax-run-status" style="{style.FONT} font-size: 12.5px; color: {color}">'
                f'{style.esc(self.status_text())}</div>')

    def error_html(self) -> str:
        err = self.run.error
        tb = getattr(err, "remote_traceback", "") or ""
        details = (f'<details><summary>traceback of rank {style.esc(getattr(err, "rank", "?"))}</summary>'
                   f'<pre style="font-size: 11px; white-space: pre-wrap">{style.esc(tb)}</pre></details>') if tb else ""
        return (f'<div class="parallax-error" style="{style.FONT} background: {style.ERROR_BG}; '
                f'color: {style.ERROR_FG}; border: 1px solid #f5c2c0; border-radius: 6px; padding: 8px 12px; '
                f'font-size: 12.5px"><b>Run failed:</b> {style.esc(err.message)}'
                + (f'<div style="margin-top: 3px">&rarr; {style.esc(err.hint)}</div>' if err.hint else "")
                + details + "</div>")

    def chart_data(self) -> dict:
        """What the charts show now (see :func:`chart_series`)."""
        return chart_series(self.run)

    def bytes_rows(self) -> list[dict]:
        return bytes_rows(self.run)

    def refresh(self, force: bool = False) -> None:
        """Update every widget; redraw the charts if new steps arrived (or ``force``)."""
        self._update_cheap()
        with self._draw_lock:
            steps_done = self.run.steps_done
            if not force and steps_done == self._drawn_steps:
                return
            self._drawn_steps = steps_done
            self._last_draw = time.monotonic()
            self.charts.value = render_charts(self.chart_data())
            self.bytes_table.value = render_bytes_table(self.bytes_rows())

    # ----- widgets -> model ------------------------------------------------------------------------
    def _on_stop_clicked(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.run.stop(wait=False)
