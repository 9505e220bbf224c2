"""Shared look of the parallax_nb views: theme colours, HTML tables, cards, badges, boxes.

Every colour of page text, background and border is a JupyterLab CSS variable
(``--jp-ui-font-color1``, ``--jp-layout-color1``, ``--jp-border-color2`` ...) with a light
fallback, so the views follow Lab's light and dark themes and still read on a page without
those variables (GitHub, nbviewer, ``nbconvert --to html``). Colour that carries meaning
(PS, AR, sparse, dense, failed) is a badge or a bar with its own background from
:mod:`parallax_nb.labels`, never coloured text on the page, so contrast holds in both themes.
Charts are inline SVG (:mod:`parallax_nb.svg`) drawn in ``currentColor``.
"""
from __future__ import annotations

import html

from .. import labels

FG = "var(--jp-ui-font-color1, #1f2328)"
FG2 = "var(--jp-ui-font-color2, #57606a)"
BG = "var(--jp-layout-color1, #ffffff)"
BG2 = "var(--jp-layout-color2, #eef1f4)"
BORDER = "var(--jp-border-color2, #d8dde3)"
BORDER_STRONG = "var(--jp-border-color1, #a8b0ba)"
FAIL = "#a4262c"        # white text reads on it at 7.3:1
GOOD = "#1a7f37"        # 5.1:1
# ipywidgets' HTML widget sets a 28 px line height for one-line labels; our blocks set their own.
FONT = ("font-family: -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif; line-height: 1.45; "
        f"color: {FG};")

TABLE_CSS = f"border-collapse: collapse; font-size: 12.5px; {FONT} font-variant-numeric: tabular-nums;"
TH_CSS = (f"text-align: right; padding: 5px 10px; border-bottom: 2px solid {BORDER_STRONG}; color: {FG}; "
          f"font-weight: 600; white-space: nowrap; background: {BG2};")
TD_CSS = f"text-align: right; padding: 4px 10px; border-bottom: 1px solid {BORDER}; white-space: nowrap; color: {FG};"


def esc(value) -> str:
    return html.escape(str(value))


def badge(text: str, colour: str, title: str = "", key: str = "") -> str:
    tip = f' title="{esc(title)}"' if title else ""
    kind = f" parallax-badge-{esc(key)}" if key else ""
    return (f'<span class="parallax-badge{kind}"{tip} style="display:inline-block; padding:1px 8px; border-radius:9px; '
            f'background:{colour}; color:#ffffff; font-size:11px; line-height:16px; font-weight:600; '
            f'letter-spacing:.3px; white-space:nowrap">{esc(text)}</span>')


def label_badge(key, suffix: str = "") -> str:
    """The badge of a method, architecture or kind from the one label table."""
    lab = labels.label(key)
    return badge(lab.text + suffix, lab.colour, lab.description, str(getattr(key, "value", key)).lower())


#: rows a view's per-variable table lists at most, those with the most bytes: a model of 1,000
#: variables made 2.5 MB of HTML in 0.07 s on every change, sent to the browser and kept in the notebook
TABLE_ROWS = 100
TABLE_HEIGHT = "480px"   # a table of many rows scrolls in a box this tall (about 10 rows)


def html_table(header: list[str], rows: list[list[str]], row_styles: list[str] | None = None,
               left_columns: int = 1, max_height: str | None = None) -> str:
    """A compact table in a horizontally scrolling box (a wide table never overflows the
    notebook); cells are HTML already escaped by the caller. The first ``left_columns``
    columns are left-aligned (names), the rest right-aligned (numbers).

    The box is as wide as the view around it, not as its table: ``width: 0; min-width: 100%``
    gives the widget that holds it no minimum width, so a wide table scrolls inside the view
    instead of pushing the widget, and the table with it, past the view's right edge.
    ``max_height`` (e.g. :data:`TABLE_HEIGHT`) lets the same box scroll down too, its header
    row staying in sight (a header sticks only within the box that scrolls)."""
    def align(i):
        return "text-align: left;" if i < left_columns else ""

    sticky, box = "", ""
    if max_height is not None:
        sticky, box = "position: sticky; top: 0; z-index: 1;", f" max-height: {max_height}; overflow-y: auto;"
    head = "".join(f'<th style="{TH_CSS}{sticky}{align(i)}">{h}</th>' for i, h in enumerate(header))
    body = []
    for r, cells in enumerate(rows):
        style = row_styles[r] if row_styles else ""
        tds = "".join(f'<td style="{TD_CSS}{align(i)}">{c}</td>' for i, c in enumerate(cells))
        body.append(f'<tr style="{style}">{tds}</tr>')
    return (f'<div style="overflow-x: auto; width: 0; min-width: 100%;{box}"><table style="{TABLE_CSS}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def name_cell(name: str) -> str:
    """A variable name in code type that wraps, where its column is too narrow, only after a
    "/" ("lstm/lstm_cell/" + "recurrent_kernel"), never inside a word ("softmax/soft max_w")."""
    *dirs, last = name.split("/")
    parts = "<wbr>".join(f'<span style="white-space: nowrap">{esc(part)}</span>' for part in [f"{d}/" for d in dirs] + [last])
    return f'<code style="white-space: normal; color: {FG}; background: transparent">{parts}</code>'


def card(title: str, value: str, note: str = "", css_class: str = "", mark: str = "") -> str:
    """A small figure card: a caption, a big number (and an optional badge), a note line."""
    return (f'<div class="{css_class}" style="flex: 1 1 0; min-width: 130px; padding: 8px 12px; '
            f'border: 1px solid {BORDER}; border-radius: 8px; background: {BG}; {FONT}">'
            f'<div style="font-size: 11px; color: {FG2}; text-transform: uppercase; letter-spacing: .5px">'
            f'{esc(title)}</div>'
            f'<div style="font-size: 20px; font-weight: 650; color: {FG}; margin-top: 2px">{esc(value)} {mark}</div>'
            f'<div style="font-size: 11px; color: {FG2}; margin-top: 1px">{esc(note)}</div></div>')


def cards(items: list[str]) -> str:
    return f'<div style="display: flex; gap: 8px; flex-wrap: wrap">{"".join(items)}</div>'


def heading(title: str, subtitle: str = "") -> str:
    sub = f'<div style="color: {FG2}; font-size: 12px; margin-top: 2px">{esc(subtitle)}</div>' if subtitle else ""
    return (f'<div style="{FONT} margin: 2px 0 6px 0"><div style="font-size: 15px; font-weight: 650; '
            f'color: {FG}">{esc(title)}</div>{sub}</div>')


def note(text: str) -> str:
    return f'<div style="{FONT} font-size: 11.5px; color: {FG2}; margin-top: 4px">{text}</div>'


def caption(text: str) -> str:
    """A note above a table, read before its rows: which rows a capped table lists (the
    table scrolls in a box of its own, so a note under it is seen only at its last row)."""
    return f'<div style="{FONT} font-size: 11.5px; color: {FG2}; margin: 0 0 4px">{text}</div>'


def box(kind: str, message_html: str, colour: str = FAIL, css_class: str = "parallax-error") -> str:
    """A message box that reads in both themes: the page's colours, a coloured edge and a badge."""
    return (f'<div class="{css_class}" style="{FONT} background: {BG}; border: 1px solid {BORDER}; '
            f'border-left: 4px solid {colour}; border-radius: 6px; padding: 8px 12px; font-size: 12.5px">'
            f'{badge(kind, colour)} {message_html}</div>')


def error_box(message: str, hint: str | None, note_text: str) -> str:
    hint_html = f'<div style="margin-top: 3px">&rarr; {esc(hint)}</div>' if hint else ""
    return box("Invalid input", f'{esc(message)}{hint_html}'
                                f'<div style="color: {FG2}; margin-top: 3px">{esc(note_text)}</div>')


def warning_box(message: str) -> str:
    return box("Note", esc(message), colour=labels.colour("ps"), css_class="parallax-warning")


def snapshot(css_class: str, parts: list[str]) -> str:
    """The static HTML of a view (what a saved notebook shows without a kernel)."""
    return (f'<div class="parallax-snapshot {css_class}" style="{FONT} max-width: 100%; overflow-x: auto">'
            f'{"".join(parts)}</div>')
