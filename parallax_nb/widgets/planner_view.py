"""PlannerView: the controls, cost table and charts of a :class:`~parallax_nb.widgets.Planner`.

Thin by design. A control's change calls ``planner.set(...)``; every recomputation of the
planner (from this view, another view, or code) calls :meth:`PlannerView.refresh`, which copies
the planner's inputs back into the controls and redraws the figures. Sliders report only when
released and the bandwidth box only on Enter or leaving it (``continuous_update=False``): that
is the debounce, one recomputation per deliberate change.
"""
from __future__ import annotations

import contextlib

import ipywidgets as widgets

from ..types import SPARSE_AS_DENSE, Architecture, format_bandwidth, format_bytes
from . import style
from .planner import Planner, describe_inputs

ARCHITECTURE_OPTIONS = [("AR", "ar"), ("PS", "ps"), ("HYBRID", "hybrid"), ("AUTO", "auto")]
METHOD_OPTIONS = [("as planned", ""), ("AR", "ar"), ("PS", "ps")]
CHART_VARIABLES = 25   # a chart of hundreds of bars says nothing; the table lists every variable

BASELINES = ((Architecture.AR, "AR"), (Architecture.PS, "PS"), (Architecture.HYBRID, "HYBRID"),
             (Architecture.AUTO, "AUTO"), (SPARSE_AS_DENSE, "AR as\ndense"))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _speedup_color(x: float) -> str:
    return "#1a7f37" if x > 1.005 else ("#a4262c" if x < 0.995 else "#1f2328")


def render_summary(planner: Planner) -> str:
    est = planner.estimate
    return style.cards([
        style.card("communication", _ms(planner.comm_time_s), "estimated per step", css_class="parallax-comm"),
        style.card("step time", _ms(planner.step_time_s),
                   f"compute {_ms(max(planner.step_time_s - planner.comm_time_s, 0.0))} + communication"),
        style.card("traffic", format_bytes(est.bytes_per_machine_per_step), "per machine per step"),
        style.card("speedup vs AR", f"{planner.speedup_vs_ar:.2f}x", "all variables allreduced",
                   color=_speedup_color(planner.speedup_vs_ar), css_class="parallax-speedup-ar"),
        style.card("speedup vs PS", f"{planner.speedup_vs_ps:.2f}x", "all variables on servers",
                   color=_speedup_color(planner.speedup_vs_ps), css_class="parallax-speedup-ps"),
    ])


def render_table(planner: Planner) -> str:
    """PS vs AR bytes per machine per step for every variable; the chosen method's cell is
    tinted in its colour and bold, the other is muted."""
    rows = []
    for name, r in planner.table.iterrows():
        chosen = r["method"]

        def cell(method: str, value: float) -> str:
            text = style.esc(format_bytes(value))
            if method == chosen:
                color = style.METHOD_COLORS[method]
                return (f'<span style="font-weight:700; color:{color}; background:{color}1f; padding:1px 6px; '
                        f'border-radius:4px">{text}</span>')
            return f'<span style="color:#8a8f98">{text}</span>'

        override = " *" if name in planner.methods else ""
        rows.append([
            f"<code>{style.esc(name)}</code>",
            style.badge(r["kind"], style.KIND_COLORS.get(r["kind"], style.DENSE_COLOR)),
            style.esc(format_bytes(r["size_bytes"])),
            style.esc(f"{r['alpha']:.4g}"),
            cell("ps", r["ps_bytes_per_step"]),
            cell("ar", r["ar_bytes_per_step"]),
            style.badge(chosen.upper() + override, style.METHOD_COLORS[chosen]),
            style.esc(r["partitions"]),
        ])
    header = ["variable", "kind", "size", "&alpha;", "PS bytes / step", "AR bytes / step", "method", "partitions"]
    note = ('<div style="font-size:11px; color:#6a737d; margin-top:4px; ' + style.FONT + '">'
            "Bytes sent + received per machine per step under each method; the plan's choice is highlighted"
            " (* = set by hand).</div>")
    return style.html_table(header, rows, left_columns=2) + note


def largest(table, limit: int):
    """The ``limit`` rows with the most bytes under either method, in their original order."""
    if len(table) <= limit:
        return table
    peak = table[["ps_bytes_per_step", "ar_bytes_per_step"]].max(axis=1)
    return table[table.index.isin(set(peak.nlargest(limit).index))]


def render_chart(planner: Planner) -> bytes:
    """Left: PS and AR bytes per variable (chosen method solid, the other faint), log scale.
    Right: estimated step time of each whole-model architecture and of this plan,
    compute + communication."""
    table = largest(planner.table, CHART_VARIABLES)
    n = len(table)
    margin = style.label_margin_in(table.index)
    width, height = 7.8 + margin, min(max(2.8, 1.1 + 0.27 * n), 8.0)
    fig = style.new_figure(width, height)
    grid = fig.add_gridspec(1, 2, width_ratios=[1.6, 1.0], wspace=0.3, left=margin / width, right=0.98,
                            top=1 - 0.35 / height, bottom=0.6 / height)
    ax = fig.add_subplot(grid[0, 0])
    ys = list(range(n))
    for offset, method in ((-0.19, "ps"), (0.19, "ar")):
        values = [max(v, 1.0) for v in table[f"{method}_bytes_per_step"]]
        alphas = [1.0 if m == method else 0.25 for m in table["method"]]
        for y, value, a in zip(ys, values, alphas):
            ax.barh(y + offset, value, height=0.36, color=style.METHOD_COLORS[method], alpha=a)
    ax.set_yticks(ys, list(table.index), fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xscale("log")
    style.log_bytes_axis(ax.xaxis)
    style.style_axes(ax)
    ax.set_title("bytes per machine per step (orange PS, blue AR; solid = chosen)", fontsize=9,
                 color="#3c4048", loc="left")
    if n < len(planner.table):
        ax.set_xlabel(f"the {n} largest of {len(planner.table)} variables (the table lists all)", fontsize=8.5,
                      color="#6a737d")

    ax2 = fig.add_subplot(grid[0, 1])
    labels, compute, comm = [], [], []
    for arch, label in BASELINES:
        est = planner.estimates[arch]
        labels.append(label)
        comm.append(est.comm_time_s * 1e3)
        compute.append(max(est.step_time_s - est.comm_time_s, 0.0) * 1e3)
    labels.append("this\nplan")
    comm.append(planner.comm_time_s * 1e3)
    compute.append(max(planner.step_time_s - planner.comm_time_s, 0.0) * 1e3)
    xs = list(range(len(labels)))
    ax2.bar(xs, compute, color="#c9ced6", label="compute")
    ax2.bar(xs, comm, bottom=compute, color=["#6f7784"] * (len(xs) - 1) + ["#1a7f37"], label="communication")
    ax2.set_xticks(xs, labels, fontsize=8)
    ax2.set_ylabel("ms / step", fontsize=8.5, color="#3c4048")
    style.style_axes(ax2)
    ax2.grid(axis="y", color="#eceef2", linewidth=0.8)
    ax2.grid(axis="x", visible=False)
    ax2.set_ylim(0, 1.3 * max(c + m for c, m in zip(compute, comm)) or 1.0)   # room for the legend
    ax2.legend(fontsize=8, frameon=False, loc="upper right", ncol=2)
    ax2.set_title("estimated step time", fontsize=9, color="#3c4048", loc="left")
    return style.figure_png(fig)


def chart_key(planner: Planner) -> tuple:
    """Everything :func:`render_chart` draws; equal keys mean an identical chart."""
    baselines = tuple((str(arch), planner.estimates[arch].comm_time_s, planner.estimates[arch].step_time_s)
                      for arch, _label in BASELINES)
    return (tuple(planner.table.itertuples()), baselines, planner.comm_time_s, planner.step_time_s)


def _label(text: str) -> widgets.HTML:
    return widgets.HTML(f'<span style="{style.FONT} font-size: 12.5px; color: #3c4048">{text}</span>',
                        layout=widgets.Layout(width="150px"))


def _row(label: str, control: widgets.Widget) -> widgets.HBox:
    return widgets.HBox([_label(label), control], layout=widgets.Layout(align_items="center"))


class PlannerView(widgets.VBox):
    """Controls over a :class:`Planner` and its recomputed costs. ``PlannerView(planner)``;
    displaying a Planner shows one. Controls: machines, workers per machine, bandwidth (text
    with units), latency, architecture, local aggregation, and a per-variable method and
    partition override. Outputs: summary cards, the per-variable table, the charts."""

    def __init__(self, planner: Planner, **kwargs):
        self.planner = planner
        self._syncing = False
        self._chart_key = None
        names = planner.profile.names
        slider = dict(continuous_update=False, layout=widgets.Layout(width="300px"))
        self.machines = widgets.IntSlider(min=1, max=max(64, _int_or(planner.machines, 1)), **slider)
        self.workers_per_machine = widgets.IntSlider(min=1, max=max(16, _int_or(planner.workers_per_machine, 1)),
                                                     **slider)
        self.bandwidth = widgets.Text(placeholder="e.g. 10Gbit/s, 100Gbps, 1.25GB/s", continuous_update=False,
                                      layout=widgets.Layout(width="180px"))
        self.latency_us = widgets.FloatText(step=5.0, layout=widgets.Layout(width="120px"))
        self.architecture = widgets.ToggleButtons(options=ARCHITECTURE_OPTIONS,
                                                  tooltips=["every variable AllReduce", "every variable on PS",
                                                            "AR dense, PS sparse (Parallax)",
                                                            "per variable, the cheaper of PS and AR"],
                                                  style={"button_width": "72px"})
        self.local_aggregation = widgets.Checkbox(description="combine a machine's gradients first", indent=False)
        self.variable = widgets.Dropdown(options=names, layout=widgets.Layout(width="260px"))
        self.method = widgets.ToggleButtons(options=METHOD_OPTIONS, style={"button_width": "84px"})
        self.partitions = widgets.IntSlider(min=1, max=64, **slider)
        self.summary = widgets.HTML()
        self.error = widgets.HTML()
        self.table = widgets.HTML(layout=widgets.Layout(overflow="auto", max_height="480px"))
        self.chart = widgets.Image(format="png", layout=widgets.Layout(max_width="980px"))

        title = widgets.HTML(style.heading(
            f"Parallax planner: {planner.profile.model_name}",
            "Per-variable PS vs AR transfer volume and the estimated step time; every change recomputes."))
        cluster_box = widgets.VBox(layout=widgets.Layout(margin="0 28px 0 0"), children=[
            _row("machines", self.machines),
            _row("workers per machine", self.workers_per_machine),
            _row("bandwidth", self.bandwidth),
            _row("latency (&micro;s)", self.latency_us),
            _row("local aggregation", self.local_aggregation),
        ])
        plan_box = widgets.VBox([
            _row("architecture", self.architecture),
            _row("variable", self.variable),
            _row("its method", self.method),
            _row("its partitions", self.partitions),
        ])
        controls = widgets.HBox([cluster_box, plan_box], layout=widgets.Layout(
            padding="10px 12px", margin="0 0 8px 0", border="1px solid #e1e4e8", flex_flow="row wrap"))
        for output in (self.error, self.summary, self.table):
            output.layout.margin = "0 0 8px 0"
        super().__init__([title, controls, self.error, self.summary, self.table, self.chart], **kwargs)
        self.add_class("parallax-planner-view")

        for name in ("machines", "workers_per_machine", "bandwidth", "architecture", "local_aggregation"):
            getattr(self, name).observe(self._control_changed(name), names="value")
        self.latency_us.observe(self._latency_changed, names="value")
        self.variable.observe(lambda _change: self._sync_override_controls(), names="value")
        self.method.observe(self._method_changed, names="value")
        self.partitions.observe(self._partitions_changed, names="value")
        planner.observe(self.refresh)
        self.refresh(planner)

    # ----------------------------------------------------------------- controls -> model
    @contextlib.contextmanager
    def _sync(self):
        self._syncing, before = True, self._syncing
        try:
            yield
        finally:
            self._syncing = before

    def _control_changed(self, name: str):
        def handler(change):
            if not self._syncing:
                self.planner.set(**{name: change["new"]})
        return handler

    def _latency_changed(self, change):
        if not self._syncing:
            self.planner.set(latency_s=change["new"] * 1e-6)

    def _method_changed(self, change):
        if not self._syncing and self.variable.value is not None:
            self.planner.set_method(self.variable.value, change["new"] or None)

    def _partitions_changed(self, change):
        if not self._syncing and self.variable.value is not None:
            self.planner.set_partitions(self.variable.value, change["new"])

    # ----------------------------------------------------------------- model -> widgets
    def refresh(self, planner: Planner | None = None) -> None:
        """Copy the planner's inputs into the controls and redraw the outputs."""
        p = self.planner
        inputs = p.inputs
        with self._sync():
            _set_if_in_range(self.machines, inputs.machines)
            _set_if_in_range(self.workers_per_machine, inputs.workers_per_machine)
            self.bandwidth.value = _bandwidth_text(inputs.bandwidth)
            if isinstance(inputs.latency_s, (int, float)) and not isinstance(inputs.latency_s, bool):
                self.latency_us.value = float(inputs.latency_s) * 1e6
            arch = getattr(inputs.architecture, "value", str(inputs.architecture).lower())
            if arch in dict((v, k) for k, v in ARCHITECTURE_OPTIONS):
                self.architecture.value = arch
            self.local_aggregation.value = bool(inputs.local_aggregation)
        self._sync_override_controls()
        if p.error is None:
            self.error.value = ""
            self.error.layout.display = "none"
        else:
            self.error.value = style.error_box(
                p.error.message, p.error.hint,
                f"Showing the last valid plan ({describe_inputs(p.result.inputs)}); the inputs you asked for: "
                f"{describe_inputs(inputs)}.")
            self.error.layout.display = None
        self.summary.value = render_summary(p)
        self.table.value = render_table(p)
        key = chart_key(p)
        if key != self._chart_key:     # an invalid input keeps the last plan: no redraw
            self.chart.value = render_chart(p)
            self._chart_key = key

    def _sync_override_controls(self) -> None:
        name = self.variable.value
        if name is None:
            return
        with self._sync():
            self.method.value = getattr(self.planner.methods.get(name), "value", self.planner.methods.get(name)) or ""
            planned = self.planner.partitions.get(name, _plan_partitions(self.planner, name))
            _set_if_in_range(self.partitions, planned)

    def close(self):
        self.planner.unobserve(self.refresh)
        super().close()


def _bandwidth_text(bandwidth) -> str:
    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool) and bandwidth > 0:
        return format_bandwidth(bandwidth)
    return str(bandwidth)


def _plan_partitions(planner: Planner, name: str) -> int:
    for v in planner.plan.variables:
        if v.name == name:
            return v.partitions
    return 1


def _int_or(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _set_if_in_range(slider: widgets.IntSlider, value) -> None:
    """Show ``value`` on the slider when it can; an out-of-range input (0 machines) is left to
    the error box rather than silently clamped into a valid one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return
    value = int(value)
    if value > slider.max:
        slider.max = value
    if value >= slider.min:
        slider.value = value
