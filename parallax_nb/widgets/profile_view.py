"""ProfileView: what a profile measured, per variable: kind, shape, size, alpha, gradient bytes.

The chart puts each variable's full size next to the bytes its gradient occupies per step
(``grad_bytes_per_step``: values plus int64 indices for a sparse variable, the whole tensor for
a dense one), on a log scale: the gap between the two bars of a sparse variable is what PS
saves over sending it as a dense tensor.
"""
from __future__ import annotations

import ipywidgets as widgets

from ..types import Profile, format_bytes
from . import style


CHART_VARIABLES = 25   # the table lists every variable; the chart the largest


def profile_rows(profile: Profile) -> list[dict]:
    """The rows the view shows, as plain values (tests compare them with the profile)."""
    return [{
        "name": v.name, "kind": v.kind.value, "shape": "x".join(map(str, v.shape)) or "scalar",
        "size_bytes": v.size_bytes, "alpha_mean": v.alpha_mean, "alpha_p95": v.alpha_p95,
        "grad_bytes_per_step": v.grad_bytes_per_step,
    } for v in profile.variables]


def _alpha_text(alpha: float) -> str:
    if alpha >= 0.9995:
        return "1"
    return f"{alpha:.4f}" if alpha >= 1e-3 else f"{alpha:.2e}"


def render_chart(profile: Profile) -> bytes:
    """Horizontal bars per variable: size (light) and gradient bytes per step (dark), log scale."""
    variables = list(profile.variables)
    if len(variables) > CHART_VARIABLES:
        keep = {v.name for v in sorted(variables, key=lambda v: v.size_bytes, reverse=True)[:CHART_VARIABLES]}
        variables = [v for v in variables if v.name in keep]
    names = [v.name for v in variables]
    height = min(1.0 + 0.3 * max(len(variables), 1), 8.0)
    width = 4.6 + style.label_margin_in(names)
    fig = style.new_figure(width, height)
    fig.subplots_adjust(left=style.label_margin_in(names) / width, right=0.97, top=1 - 0.35 / height,
                        bottom=0.45 / height)
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(variables)))
    colors = [style.KIND_COLORS[v.kind.value] for v in variables]
    ax.barh([y - 0.19 for y in ys], [max(v.size_bytes, 1) for v in variables], height=0.36,
            color=colors, alpha=0.35, label="variable size")
    ax.barh([y + 0.19 for y in ys], [max(v.grad_bytes_per_step, 1) for v in variables], height=0.36,
            color=colors, label="gradient bytes / step")
    ax.set_yticks(ys, names, fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xscale("log")
    style.log_bytes_axis(ax.xaxis)
    style.style_axes(ax)
    if len(variables) < len(profile.variables):
        ax.set_xlabel(f"the {len(variables)} largest of {len(profile.variables)} variables (the table lists all)",
                      fontsize=8.5, color="#6a737d")
    ax.set_title("bytes per variable (teal: sparse, grey: dense; light: size, dark: gradient per step)",
                 fontsize=9, color="#3c4048", loc="right")
    return style.figure_png(fig)


def render_table(profile: Profile) -> str:
    rows = []
    for r in profile_rows(profile):
        rows.append([
            f"<code>{style.esc(r['name'])}</code>",
            style.badge(r["kind"], style.KIND_COLORS[r["kind"]]),
            style.esc(r["shape"]),
            style.esc(format_bytes(r["size_bytes"])),
            style.esc(_alpha_text(r["alpha_mean"])),
            style.esc(_alpha_text(r["alpha_p95"])),
            style.esc(format_bytes(r["grad_bytes_per_step"])),
        ])
    header = ["variable", "kind", "shape", "size", "&alpha; mean", "&alpha; p95", "gradient / step"]
    return style.html_table(header, rows, left_columns=2)


class ProfileView(widgets.VBox):
    """A profile's summary line, per-variable table and bytes chart. ``ProfileView(prof)``."""

    def __init__(self, profile: Profile, **kwargs):
        if not isinstance(profile, Profile):
            from ..errors import ConfigError

            raise ConfigError(f"ProfileView needs a Profile, got {type(profile).__name__}")
        self.profile = profile
        n_sparse = sum(v.is_sparse for v in profile.variables)
        subtitle = (f"{len(profile.variables)} variables ({n_sparse} sparse), {format_bytes(profile.total_bytes)} "
                    f"({100 * profile.sparse_bytes / max(profile.total_bytes, 1):.1f}% in sparse variables); "
                    f"batch {profile.batch_size}, {profile.steps} steps, compute {profile.step_time_s * 1e3:.1f} ms/step, "
                    f"peak memory {format_bytes(profile.peak_memory_bytes)}")
        self.header = widgets.HTML(style.heading(f"Profile of {profile.model_name}", subtitle))
        self.table = widgets.HTML(render_table(profile), layout=widgets.Layout(overflow="auto", max_height="480px"))
        self.chart = widgets.Image(value=render_chart(profile), format="png",
                                   layout=widgets.Layout(max_width="760px"))
        super().__init__([self.header, self.table, self.chart], **kwargs)
        self.add_class("parallax-profile-view")

    @property
    def rows(self) -> list[dict]:
        return profile_rows(self.profile)
