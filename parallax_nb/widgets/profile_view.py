"""ProfileView: what a profile measured, per variable: kind, shape, size, alpha, gradient bytes.

The chart puts each variable's full size next to the bytes its gradient occupies per step
(``grad_bytes_per_step``: values plus indices for a sparse variable, the whole tensor for
a dense one), on a log scale: the gap between the two bars of a sparse variable is what PS
saves over sending it as a dense tensor.
"""
from __future__ import annotations

import ipywidgets as widgets

from .. import labels, svg
from ..types import Profile, format_bytes, largest_in_order
from . import style
from .snapshot import SnapshotDisplay

CHART_VARIABLES = 25   # the chart the largest variables
TABLE_VARIABLES = style.TABLE_ROWS   # the table lists at most these, the largest


def _largest(profile: Profile, limit: int) -> list:
    """The ``limit`` largest variables of ``profile``, in model order."""
    variables = profile.variables
    return [variables[i] for i in largest_in_order([v.size_bytes for v in variables], limit)]


def profile_rows(profile: Profile, limit: int | None = None) -> list[dict]:
    """The rows the view shows, as plain values (tests compare them with the profile): of the
    ``limit`` largest variables (None: every one)."""
    variables = profile.variables if limit is None else _largest(profile, limit)
    return [{
        "name": v.name, "kind": v.kind.value, "shape": "x".join(map(str, v.shape)) or "scalar",
        "size_bytes": v.size_bytes, "alpha_mean": v.alpha_mean, "alpha_p95": v.alpha_p95,
        "grad_bytes_per_step": v.grad_bytes_per_step,
    } for v in variables]


def _alpha_text(alpha: float) -> str:
    if alpha >= 0.9995:
        return "1"
    return f"{alpha:.4f}" if alpha >= 1e-3 else f"{alpha:.2e}"


def render_chart(profile: Profile) -> str:
    """Horizontal bars per variable: size and gradient bytes per step, log byte axis (SVG)."""
    variables = _largest(profile, CHART_VARIABLES)
    listed = "the table lists all" if len(profile.variables) <= TABLE_VARIABLES else "profile.dataframe() lists all"
    note = (f"the {len(variables)} largest of {len(profile.variables)} variables ({listed})"
            if len(variables) < len(profile.variables) else "")
    kind_colours = [labels.colour(v.kind) for v in variables]
    return svg.hbars([v.name for v in variables], [
        {"name": "variable size", "colour": "#8a94a3", "values": [v.size_bytes for v in variables]},
        {"name": "gradient bytes / step (bar colour: sparse or dense)", "colour": labels.colour("sparse"),
         "values": [v.grad_bytes_per_step for v in variables], "colours": kind_colours},
    ], "bytes per variable", css_class="parallax-profile-chart", note=note)


def render_table(profile: Profile) -> str:
    """A row per variable; of more than :data:`TABLE_VARIABLES`, the largest, in model order."""
    rows = []
    for r in profile_rows(profile, TABLE_VARIABLES):
        rows.append([
            style.name_cell(r["name"]),
            style.label_badge(r["kind"]),
            style.esc(r["shape"]),
            style.esc(format_bytes(r["size_bytes"])),
            style.esc(_alpha_text(r["alpha_mean"])),
            style.esc(_alpha_text(r["alpha_p95"])),
            style.esc(format_bytes(r["grad_bytes_per_step"])),
        ])
    header = ["variable", "kind", "shape", "size", "&alpha; mean", "&alpha; p95", "gradient / step"]
    some = (style.caption(f"The {len(rows)} largest of {len(profile.variables)} variables (every one: "
                          f"profile.dataframe()).") if len(rows) < len(profile.variables) else "")
    return some + style.html_table(header, rows, left_columns=2, max_height=style.TABLE_HEIGHT)


def subtitle(profile: Profile) -> str:
    n_sparse = sum(v.is_sparse for v in profile.variables)
    memory = (format_bytes(profile.peak_memory_bytes) if profile.peak_memory_bytes
              else "not measured (TensorFlow reported none)")
    return (f"{len(profile.variables)} variables ({n_sparse} sparse), {format_bytes(profile.total_bytes)} "
            f"({100 * profile.sparse_bytes / max(profile.total_bytes, 1):.1f}% in sparse variables); "
            f"batch {profile.batch_size}, {profile.steps} steps, compute {profile.step_time_s * 1e3:.1f} ms/step, "
            f"peak memory {memory}")


class ProfileView(SnapshotDisplay, widgets.VBox):
    """A profile's summary line, per-variable table and bytes chart. ``ProfileView(prof)``."""

    def __init__(self, profile: Profile, **kwargs):
        if not isinstance(profile, Profile):
            from ..errors import ConfigError

            raise ConfigError(f"ProfileView needs a Profile, got {type(profile).__name__}")
        self.profile = profile
        self.header = widgets.HTML(style.heading(f"Profile of {profile.model_name}", subtitle(profile)))
        self.table = widgets.HTML(render_table(profile))
        self.chart = widgets.HTML(render_chart(profile), layout=widgets.Layout(max_width="100%"))
        super().__init__([self.header, self.table, self.chart], **kwargs)
        self.add_class("parallax-profile-view")

    @property
    def rows(self) -> list[dict]:
        """The rows the table lists (:data:`TABLE_VARIABLES` at most, the largest)."""
        return profile_rows(self.profile, TABLE_VARIABLES)

    def summary_line(self) -> str:
        return f"Profile of {self.profile.model_name}: {subtitle(self.profile)}"

    def snapshot_html(self) -> str:
        return style.snapshot("parallax-profile-snapshot", [self.header.value, self.table.value, self.chart.value])
