"""Shared look of the parallax_nb views: colours, HTML tables and cards, matplotlib to PNG.

Charts are rendered with matplotlib's Agg backend into PNG bytes shown by an
``ipywidgets.Image``: that works the same in JupyterLab, in a headless nbclient run and in a
saved notebook, and never touches the user's pyplot state.
"""
from __future__ import annotations

import html
import io

PS_COLOR = "#e07a2f"       # parameter server
AR_COLOR = "#3a76c4"       # allreduce
SPARSE_COLOR = "#2a9d8f"
DENSE_COLOR = "#8a8f98"
MUTED = "#d5d9e0"
ERROR_BG = "#fdecea"
ERROR_FG = "#a4262c"
# ipywidgets' HTML widget sets a 28 px line height for one-line labels; our blocks set their own.
FONT = "font-family: -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif; line-height: 1.45;"

METHOD_COLORS = {"ps": PS_COLOR, "ar": AR_COLOR}
KIND_COLORS = {"sparse": SPARSE_COLOR, "dense": DENSE_COLOR}

TABLE_CSS = (
    "border-collapse: collapse; font-size: 12.5px; " + FONT +
    " font-variant-numeric: tabular-nums;"
)
TH_CSS = ("text-align: right; padding: 5px 10px; border-bottom: 2px solid #c9ced6; color: #3c4048; "
          "font-weight: 600; white-space: nowrap; background: #f4f6f9;")
TD_CSS = "text-align: right; padding: 4px 10px; border-bottom: 1px solid #eceef2; white-space: nowrap;"


def esc(value) -> str:
    return html.escape(str(value))


def badge(text: str, color: str) -> str:
    return (f'<span style="display:inline-block; padding:1px 8px; border-radius:9px; background:{color}; '
            f'color:white; font-size:11px; line-height:16px; font-weight:600; letter-spacing:.3px">'
            f'{esc(text)}</span>')


def html_table(header: list[str], rows: list[list[str]], row_styles: list[str] | None = None,
               left_columns: int = 1) -> str:
    """A compact table; cells are HTML already escaped by the caller. The first
    ``left_columns`` columns are left-aligned (names), the rest right-aligned (numbers)."""
    def align(i):
        return "text-align: left;" if i < left_columns else ""

    head = "".join(f'<th style="{TH_CSS}{align(i)}">{h}</th>' for i, h in enumerate(header))
    body = []
    for r, cells in enumerate(rows):
        style = row_styles[r] if row_styles else ""
        tds = "".join(f'<td style="{TD_CSS}{align(i)}">{c}</td>' for i, c in enumerate(cells))
        body.append(f'<tr style="{style}">{tds}</tr>')
    return f'<table style="{TABLE_CSS}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def card(title: str, value: str, note: str = "", color: str = "#1f2328", css_class: str = "") -> str:
    """A small figure card: a caption, a big number, a note line."""
    return (f'<div class="{css_class}" style="flex: 1 1 0; min-width: 120px; padding: 8px 12px; border: 1px solid #e1e4e8; '
            f'border-radius: 8px; background: #fbfcfd; {FONT}">'
            f'<div style="font-size: 11px; color: #6a737d; text-transform: uppercase; letter-spacing: .5px">'
            f'{esc(title)}</div>'
            f'<div style="font-size: 20px; font-weight: 650; color: {color}; margin-top: 2px">{esc(value)}</div>'
            f'<div style="font-size: 11px; color: #6a737d; margin-top: 1px">{esc(note)}</div></div>')


def cards(items: list[str]) -> str:
    return f'<div style="display: flex; gap: 8px; flex-wrap: wrap">{"".join(items)}</div>'


def heading(title: str, subtitle: str = "") -> str:
    sub = f'<div style="color: #6a737d; font-size: 12px; margin-top: 2px">{esc(subtitle)}</div>' if subtitle else ""
    return (f'<div style="{FONT} margin: 2px 0 6px 0"><div style="font-size: 15px; font-weight: 650; '
            f'color: #1f2328">{esc(title)}</div>{sub}</div>')


def error_box(message: str, hint: str | None, note: str) -> str:
    hint_html = f'<div style="margin-top: 3px">&rarr; {esc(hint)}</div>' if hint else ""
    return (f'<div class="parallax-error" style="{FONT} background: {ERROR_BG}; color: {ERROR_FG}; '
            f'border: 1px solid #f5c2c0; border-radius: 6px; padding: 8px 12px; font-size: 12.5px">'
            f'<b>Invalid input:</b> {esc(message)}{hint_html}'
            f'<div style="color: #6a737d; margin-top: 3px">{esc(note)}</div></div>')


def figure_png(fig) -> bytes:
    """Render a matplotlib Figure (made with ``matplotlib.figure.Figure``, not pyplot) to PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, facecolor="white")   # no bbox "tight": it draws twice
    return buffer.getvalue()


def new_figure(width_in: float, height_in: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in))


def label_margin_in(labels) -> float:
    """Inches a column of 8.5 pt tick labels needs left of an axis (about 0.068 in a character)."""
    return 0.25 + 0.068 * max((len(str(label)) for label in labels), default=4)


def style_axes(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.spines["left"].set_color("#9aa1ab")
    ax.spines["bottom"].set_color("#9aa1ab")
    ax.tick_params(colors="#3c4048", labelsize=8.5)
    ax.grid(axis="x", color="#eceef2", linewidth=0.8)
    ax.set_axisbelow(True)


def short_bytes(n: float) -> str:
    """``4096 -> "4 KiB"``, ``1.5 * 2**20 -> "1.5 MiB"``: tick labels without trailing zeros."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


def log_bytes_axis(axis) -> None:
    """A log-scaled byte axis with ticks at 1, 4, 16, 64, 256 x powers of 1024 (B, KiB, MiB ...)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=1024, subs=(1.0, 4.0, 16.0, 64.0, 256.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: short_bytes(x) if x > 0 else "0"))
    axis.set_minor_formatter(NullFormatter())
