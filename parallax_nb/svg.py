"""Small vector charts as SVG text: horizontal grouped bars, columns, lines.

Why not matplotlib PNGs: a PNG shrinks with the window until its text is a few pixels high,
and its colours are fixed at draw time, so a dark JupyterLab theme shows a white block. These
charts are inline ``<svg>`` with a ``viewBox``: they scale to the notebook's width and stay
crisp, and every text, axis and grid line is drawn in ``currentColor``, so they take the
colour of the text around them (the theme's). Series colours come from :mod:`parallax_nb.labels`.

Axes follow the data: byte axes tick at round binary sizes (``1 KiB, 4 KiB, 16 KiB`` on a
log scale; ``0, 8 KiB, 16 KiB`` on a linear one), a log axis draws a zero as no bar with a
"0 B" label (a log scale has no zero; drawing it as 1 B would be a lie), and a chart without
data says so instead of drawing axes around nothing.
"""
from __future__ import annotations

import html
import math

FONT = "font-family: -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def short_bytes(n: float) -> str:
    """``65536 -> "64 KiB"``, ``1.5 * 2**20 -> "1.5 MiB"``, ``0 -> "0 B"``: 3 significant digits."""
    if n == 0:
        return "0 B"
    i = 0
    while abs(n) >= 1024 and i < len(UNITS) - 1:
        n /= 1024
        i += 1
    return f"{n:.3g} {UNITS[i]}"


def log_domain(lo: float, hi: float) -> tuple[int, int]:
    """The powers of two (k0, k1) a log axis spans to hold ``lo`` .. ``hi`` (both > 0)."""
    k0, k1 = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    return k0, max(k1, k0 + 2)


def log_byte_ticks(lo: float, hi: float) -> list[float]:
    """Powers of two of the axis holding ``lo`` .. ``hi``, every s-th one with s the smallest of
    1, 2, 4, 10, 20 that keeps at most 6 ticks (so labels never collide): 1 KiB, 4 KiB, 16 KiB."""
    k0, k1 = log_domain(lo, hi)
    for s in (1, 2, 4, 10, 20):
        ticks = [2.0 ** k for k in range(k0, k1 + 1) if k % s == 0]
        if 2 <= len(ticks) <= 6:
            return ticks
    return [2.0 ** k0, 2.0 ** k1]


def nice_step(span: float, count: int = 5) -> float:
    """The 1, 2, 2.5 or 5 x 10^k step that splits ``span`` into about ``count`` parts."""
    if span <= 0:
        return 1.0
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def linear_ticks(hi: float, unit: float = 1.0) -> tuple[list[float], float]:
    """Ticks 0, s, 2s, ... covering ``hi`` with a nice step in multiples of ``unit`` (1024**k
    for bytes: the ticks are round in the unit they are labelled in); returns (ticks, top)."""
    step = nice_step(hi / unit if hi > 0 else 1.0) * unit
    top = step * max(1, math.ceil(hi / step - 1e-9))
    return [i * step for i in range(int(round(top / step)) + 1)], top


def byte_unit(hi: float) -> float:
    unit = 1.0
    while hi >= 1024 * unit and unit < 1024 ** 5:
        unit *= 1024
    return unit


def _text(x, y, s, anchor="start", size=11, weight="normal", extra="") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="currentColor" '
            f'font-weight="{weight}" {extra}>{esc(s)}</text>')


def _svg(width: int, height: int, body: list[str], title: str, css_class: str) -> str:
    return (f'<svg class="parallax-chart {css_class}" viewBox="0 0 {width} {height}" width="100%" '
            f'style="max-width: {width}px; height: auto; display: block; color: inherit; {FONT}" '
            f'role="img" aria-label="{esc(title)}" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{esc(title)}</title>{"".join(body)}</svg>')


def empty_chart(title: str, message: str, width: int = 320, height: int = 60, css_class: str = "") -> str:
    """A chart that has no data yet: its title and a sentence, no axes."""
    return _svg(width, height, [_text(0, 14, title, weight="600"), _text(0, 38, message, size=11.5)],
                f"{title}: {message}", css_class + " parallax-chart-empty")


def legend(items: list[tuple[str, str, float]], x: float, y: float) -> tuple[list[str], float]:
    """Swatches and names in one row above the plot (never on the data); returns (svg, width)."""
    out, cx = [], x
    for name, colour, opacity in items:
        out.append(f'<rect x="{cx:.1f}" y="{y - 9:.1f}" width="11" height="11" rx="2" fill="{colour}" '
                   f'fill-opacity="{opacity}"/>')
        out.append(_text(cx + 15, y, name, size=11))
        cx += 15 + 6.3 * len(name) + 14
    return out, cx - x


def hbars(rows: list[str], series: list[dict], title: str, css_class: str = "", note: str = "") -> str:
    """Grouped horizontal bars on a log byte axis, one group per row.

    ``series``: ``{"name", "colour", "values": [bytes per row]}``, optionally ``"opacity"`` and
    ``"colours"`` (one per row).
    Zero values draw no bar and a "0 B" label at the axis start.
    """
    if not rows:
        return empty_chart(title, "no variables", css_class=css_class)
    label_w = min(max(len(r) for r in rows) * 6.6 + 12, 260)
    width, plot_w = int(label_w + 470), 450
    group_h, bar_h = 8 + 11 * len(series), 10
    top = 44
    height = int(top + group_h * len(rows) + 34 + (14 if note else 0))
    positive = [v for s in series for v in s["values"] if v and v > 0]
    lo, hi = (min(positive), max(positive)) if positive else (1.0, 1024.0)
    ticks = log_byte_ticks(lo, hi)
    a, b = log_domain(lo, hi)

    def x_of(v):
        return label_w + plot_w * (math.log2(v) - a) / max(b - a, 1e-9)

    body = [_text(0, 14, title, weight="600")]
    items, _ = legend([(s["name"], s["colour"], 1.0) for s in series], 0, 34)
    body += items
    axis_y = top + group_h * len(rows)
    for t in ticks:
        x = x_of(t)
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" stroke="currentColor" '
                    f'stroke-opacity="0.15"/>')
        body.append(_text(x, axis_y + 15, short_bytes(t), anchor="middle", size=10.5))
    for i, row in enumerate(rows):
        y0 = top + i * group_h + 4
        body.append(_text(label_w - 8, y0 + group_h / 2 + 1, _shorten(row), anchor="end", size=11,
                          extra='style="white-space: pre"'))
        for j, s in enumerate(series):
            v = s["values"][i]
            y = y0 + j * 11
            opacity = (s.get("opacity") or [1.0] * len(rows))[i]
            if v and v > 0:
                w = max(x_of(v) - label_w, 1.0)
                body.append(f'<rect x="{label_w:.1f}" y="{y:.1f}" width="{w:.1f}" height="{bar_h}" '
                            f'fill="{(s.get("colours") or [s["colour"]] * len(rows))[i]}" '
                            f'fill-opacity="{opacity}"><title>{esc(s["name"])} '
                            f'{esc(row)}: {esc(short_bytes(v))}</title></rect>')
            else:
                body.append(_text(label_w + 3, y + 9, "0 B", size=9.5))
    body.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="currentColor" '
                f'stroke-opacity="0.5"/>')
    if note:
        body.append(_text(label_w, axis_y + 31, note, size=10.5))
    return _svg(width, height, body, title, css_class)


def columns(labels: list[str], stacks: list[dict], title: str, unit: str = "ms", css_class: str = "",
            highlight: int | None = None) -> str:
    """Stacked columns (e.g. compute + communication per architecture).

    ``stacks``: ``{"name", "colour", "values"}`` bottom first. A column more than 3x the
    second tallest would squash the others: the axis stops at 1.6x the second tallest and
    that column is drawn broken (a zig-zag at the top) with its total written above it.
    """
    totals = [sum(s["values"][i] for s in stacks) for i in range(len(labels))]
    if not labels or max(totals, default=0) <= 0:
        return empty_chart(title, "nothing to compare", css_class=css_class)
    ordered = sorted(totals, reverse=True)
    cap = ordered[0]
    if len(ordered) > 1 and ordered[1] > 0 and ordered[0] > 3 * ordered[1]:
        cap = 1.6 * ordered[1]
    ticks, top_value = linear_ticks(cap)
    col_w, gap, left, top, plot_h = 46, 16, 46, 62, 150
    width = int(left + len(labels) * (col_w + gap) + 10)
    width = max(width, 330)
    height = top + plot_h + 44

    def y_of(v):
        return top + plot_h * (1 - min(v, top_value) / top_value)

    body = [_text(0, 14, title, weight="600")]
    items, _ = legend([(s["name"], s["colour"], 1.0) for s in stacks], 0, 34)
    body += items
    for t in ticks:
        y = y_of(t)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width}" y2="{y:.1f}" stroke="currentColor" '
                    f'stroke-opacity="0.15"/>')
        body.append(_text(left - 6, y + 4, f"{t:g}", anchor="end", size=10.5))
    for i, name in enumerate(labels):
        x = left + gap / 2 + i * (col_w + gap)
        base = 0.0
        for s in stacks:
            v = s["values"][i]
            y1, y2 = y_of(base + v), y_of(base)
            if y2 - y1 > 0:
                body.append(f'<rect x="{x:.1f}" y="{y1:.1f}" width="{col_w}" height="{y2 - y1:.1f}" '
                            f'fill="{s["colour"]}"><title>{esc(name)} {esc(s["name"])}: {v:.3g} {unit}</title></rect>')
            base += v
        if totals[i] > top_value:   # broken column: zig-zag and its real total
            zy = top + 6
            body.append(f'<path d="M{x:.1f},{zy + 4} l{col_w / 4:.1f},-6 l{col_w / 4:.1f},6 l{col_w / 4:.1f},-6 '
                        f'l{col_w / 4:.1f},6" stroke="var(--jp-layout-color1, #fff)" stroke-width="3" fill="none"/>')
        body.append(_text(x + col_w / 2, min(y_of(totals[i]), y_of(top_value)) - 4, f"{totals[i]:.3g}",
                          anchor="middle", size=10, weight="600" if i == highlight else "normal"))
        for k, part in enumerate(name.split("\n")):
            body.append(_text(x + col_w / 2, top + plot_h + 15 + 12 * k, part, anchor="middle", size=10.5,
                              weight="700" if i == highlight else "normal"))
    body.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width}" y2="{top + plot_h}" stroke="currentColor" '
                f'stroke-opacity="0.5"/>')
    body.insert(1, _text(width, 14, unit, anchor="end", size=10.5))
    return _svg(width, height, body, title, css_class)


def smooth(values: list[float], weight: float = 0.8) -> list[float]:
    """Exponential moving average (TensorBoard's smoothing): s_i = w * s_(i-1) + (1 - w) * v_i,
    debiased by 1 - w^(i+1) so the first points are not pulled to zero."""
    out, s = [], 0.0
    for i, v in enumerate(values):
        s = weight * s + (1 - weight) * v
        out.append(s / (1 - weight ** (i + 1)))
    return out


def lines(title: str, xs: list[float], series: list[dict], y_format=None, byte_axis: bool = False,
          css_class: str = "", empty_message: str = "waiting for the first step") -> str:
    """A line chart; ``series``: ``{"name", "colour", "values", "opacity" (default 1),
    "dash" (optional), "width" (default 1.8)}``; a value None leaves a gap; a series of one
    value and no xs (a prediction) is drawn as a horizontal line. The y axis starts at 0."""
    points = [v for s in series for v in s["values"] if v is not None and math.isfinite(v)]
    if not xs or not points:
        return empty_chart(title, empty_message, css_class=css_class)
    width, height, left, top, right, bottom = 330, 200, 52, 44, 10, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    hi = max(max(points), 1e-12)
    unit = byte_unit(hi) if byte_axis else 1.0
    ticks, top_value = linear_ticks(hi, unit)
    fmt = y_format or (short_bytes if byte_axis else (lambda v: f"{v:g}"))
    x0, x1 = min(xs), max(xs)

    def px(x):
        return left + plot_w * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def py(v):
        return top + plot_h * (1 - v / top_value)

    body = [_text(0, 14, title, weight="600")]
    items, _ = legend([(s["name"], s["colour"], s.get("opacity", 1.0)) for s in series if s.get("legend", True)], 0, 34)
    body += items
    for t in ticks:
        y = py(t)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="currentColor" '
                    f'stroke-opacity="0.15"/>')
        body.append(_text(left - 5, y + 4, fmt(t), anchor="end", size=10))
    for x in sorted({x0, x1}):
        body.append(_text(px(x), height - 8, f"{x:g}", anchor="middle", size=10))
    body.append(_text(left + plot_w / 2, height - 8, "step", anchor="middle", size=10))
    for s in series:
        values = s["values"]
        dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
        style = (f'fill="none" stroke="{s["colour"]}" stroke-width="{s.get("width", 1.8)}" '
                 f'stroke-opacity="{s.get("opacity", 1.0)}" stroke-linejoin="round"{dash}')
        if len(values) == 1 and len(xs) != 1:     # a constant (the prediction)
            y = py(values[0])
            body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" {style}/>')
            continue
        segment: list[str] = []
        for x, v in list(zip(xs, values)) + [(None, None)]:
            if v is None or not math.isfinite(v):
                if len(segment) == 1:
                    segment.append(segment[0].replace("M", "L"))
                if segment:
                    body.append(f'<path d="{" ".join(segment)}" {style}/>')
                segment = []
                continue
            segment.append(f'{"M" if not segment else "L"}{px(x):.1f},{py(v):.1f}')
    body.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" '
                f'stroke="currentColor" stroke-opacity="0.5"/>')
    return _svg(width, height, body, title, css_class)


def _shorten(name: str, width: int = 38) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]
