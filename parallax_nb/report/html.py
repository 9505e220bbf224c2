"""The report as one self-contained HTML page.

Everything is drawn from the report's plain data (the dict the JSON holds). The page has no
script and fetches nothing: CSS is inline, charts are ``data:`` URIs, and a
Content-Security-Policy (``default-src 'none'``) makes the browser refuse any other load
should one slip in. Every piece of text that comes from the user or the model (variable
names, model name, notes, environment values) goes through :func:`html.escape`, so a
variable named ``<script>alert(1)</script>`` is shown as text.
"""
from __future__ import annotations

import html as _html

from .. import labels
from ..executed import ExecutedPlan
from ..staleness import DEFINITION, MeasuredStaleness
from ..plan import RECORDED_COSTS
from ..types import Kind, Method, format_bandwidth, format_bytes
from . import charts

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

# Scoped under .pxr so the fragment can sit inside a notebook without restyling it. Colours are
# variables: inside JupyterLab they take the theme's (--jp-*), elsewhere a light palette, or a
# dark one when the browser prefers dark. ".pxr.pxr" outranks JupyterLab's own table rules.
CSS = """
.pxr { --pxr-fg: var(--jp-content-font-color1, #1a202c); --pxr-fg2: var(--jp-content-font-color2, #4a5568);
  --pxr-bg: var(--jp-layout-color0, #ffffff); --pxr-bg2: var(--jp-layout-color2, #edf2f7);
  --pxr-stripe: var(--jp-layout-color1, #f7f9fb); --pxr-border: var(--jp-border-color2, #e2e8f0);
  --pxr-border-strong: var(--jp-border-color1, #cbd5e0); --pxr-note: var(--jp-layout-color2, #fffbeb);
  color-scheme: light dark; }
@media (prefers-color-scheme: dark) {
  .pxr { --pxr-fg: var(--jp-content-font-color1, #e6e9ee); --pxr-fg2: var(--jp-content-font-color2, #b4bcc8);
    --pxr-bg: var(--jp-layout-color0, #111418); --pxr-bg2: var(--jp-layout-color2, #252b33);
    --pxr-stripe: var(--jp-layout-color1, #1a1f25); --pxr-border: var(--jp-border-color2, #333b45);
    --pxr-border-strong: var(--jp-border-color1, #566170); --pxr-note: var(--jp-layout-color2, #2a2616); }
}
.pxr.pxr { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: var(--pxr-fg); background: var(--pxr-bg); line-height: 1.45; max-width: 1240px; margin: 0 auto;
  padding: 8px 20px 40px; }
.pxr.pxr h1, .pxr.pxr h2, .pxr.pxr h3 { color: var(--pxr-fg); }
.pxr.pxr h1 { font-size: 1.6em; margin: 0.6em 0 0.1em; }
.pxr.pxr h2 { font-size: 1.2em; margin: 1.6em 0 0.5em; padding-bottom: 4px; border-bottom: 2px solid var(--pxr-border); }
.pxr .subtitle { color: var(--pxr-fg2); margin: 0 0 1em; }
.pxr .cards { display: flex; flex-wrap: wrap; gap: 10px; }
.pxr .card { background: var(--pxr-stripe); border: 1px solid var(--pxr-border); border-radius: 8px; padding: 8px 14px; min-width: 140px; }
.pxr .card .label { font-size: 0.78em; color: var(--pxr-fg2); text-transform: uppercase; letter-spacing: 0.04em; }
.pxr .card .value { font-size: 1.15em; font-weight: 600; }
.pxr.pxr table { border-collapse: collapse; width: 100%; font-size: 0.9em; margin: 6px 0; color: var(--pxr-fg);
  table-layout: auto; }
.pxr.pxr th { background: var(--pxr-bg2); color: var(--pxr-fg); text-align: left; font-weight: 600; padding: 6px 8px;
  border: none; border-bottom: 2px solid var(--pxr-border-strong); }
.pxr.pxr td { color: var(--pxr-fg); text-align: left; padding: 5px 8px; border: none; border-bottom: 1px solid var(--pxr-border); vertical-align: top; }
.pxr.pxr tbody tr { background: var(--pxr-bg); }
.pxr.pxr tbody tr:nth-child(even) { background: var(--pxr-stripe); }
.pxr.pxr tbody tr:hover { background: var(--pxr-bg2); }
.pxr td.nowrap { white-space: nowrap; }
.pxr.pxr td.num, .pxr.pxr th.num { text-align: right; font-variant-numeric: tabular-nums; }
.pxr td.num { white-space: nowrap; }
.pxr .scroll { overflow-x: auto; max-width: 100%; }
.pxr td.name { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: nowrap; }
.pxr table.facts td:first-child { width: 34%; color: var(--pxr-fg2); }
.pxr.pxr h3 { font-size: 1.02em; margin: 1.2em 0 0.4em; }
.pxr.pxr tr.chosen td { font-weight: 600; box-shadow: inset 4px 0 0 """ + labels.colour("hybrid") + """; }
.pxr.pxr tr.chosen td + td { box-shadow: none; }
.pxr tfoot td { font-weight: 600; border-top: 2px solid var(--pxr-border-strong); }
.pxr .badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 0.8em; font-weight: 600; color: #fff; white-space: nowrap; }
""" + "".join(f".pxr .badge.{key} {{ background: {labels.colour(key)}; }}\n" for key in (*(m.value for m in Method), *(k.value for k in Kind))) + """
.pxr .err-small, .pxr .err-mid, .pxr .err-big { font-weight: 600; }
.pxr .err-mid::after { content: " \\25B2"; color: #b35900; } .pxr .err-big::after { content: " \\25B2\\25B2"; color: #c53030; }
.pxr ul.assumptions li { margin: 3px 0; }
.pxr figure { margin: 10px 0; } .pxr figure img { max-width: 100%; height: auto; background: #ffffff; border-radius: 6px; padding: 6px; }
.pxr figcaption { color: var(--pxr-fg2); font-size: 0.88em; }
.pxr .notes { background: var(--pxr-note); border-left: 4px solid #d69e2e; padding: 8px 12px; margin: 0 0 12px; white-space: pre-wrap; }
.pxr .warn { background: var(--pxr-stripe); border-left: 4px solid #c53030; padding: 6px 12px; margin: 6px 0; }
.pxr .muted { color: var(--pxr-fg2); font-size: 0.85em; }
"""


def esc(value) -> str:
    """Text made safe for HTML element content and attribute values."""
    return _html.escape("" if value is None else str(value), quote=True)


def fmt_ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:,.3g} ms" if seconds * 1e3 < 100 else f"{seconds * 1e3:,.0f} ms"


def fmt_bytes(n) -> str:
    return "n/a" if n is None else format_bytes(n)


def fmt_pct(pct) -> str:
    return "n/a" if pct is None else f"{pct:+.1f}%"


def _pct_class(pct) -> str:
    if pct is None:
        return ""
    return "err-small" if abs(pct) <= 5 else "err-mid" if abs(pct) <= 25 else "err-big"


def _td(text, cls: str = "", title: str | None = None) -> str:
    attrs = f' class="{cls}"' if cls else ""
    attrs += f' title="{esc(title)}"' if title is not None else ""
    return f"<td{attrs}>{esc(text)}</td>"


def _badge(value: str) -> str:
    return f'<span class="badge {esc(value)}">{esc(labels.text(value))}</span>'


def _card(label: str, value: str) -> str:
    return f'<div class="card"><div class="label">{esc(label)}</div><div class="value">{esc(value)}</div></div>'


def _overview(data: dict) -> str:
    prof, cluster, plan = data["profile"], data["cluster"], data["plan"]
    cards = [
        _card("model", prof["model_name"]),
        _card("variables", f"{prof['variables_count']} ({prof['sparse_variables_count']} sparse)"),
        _card("parameters", format_bytes(prof["total_bytes"])),
        _card("cluster", f"{cluster['machines']} x {cluster['workers_per_machine']} workers"),
        _card("bandwidth", format_bandwidth(cluster["bandwidth_bps"])),
        _card("plan", labels.text(plan["architecture"])),
        _card("training", plan.get("training", "synchronous")),
        _card("est. bytes / machine / step", format_bytes(plan["bytes_per_machine_per_step"])),
        _card("est. step time", fmt_ms(plan["step_time_s"])),
        _card("step times priced", data.get("calibration") or "uncalibrated (defaults)"),
    ]
    why = ""
    if plan.get("explanations"):
        items = "".join(f"<li>{esc(line)}</li>" for line in plan["explanations"])
        why = f'<h2>Why AUTO chose this plan</h2><ul class="assumptions explanations">{items}</ul>'
    if plan.get("straggler_outlook"):
        head, *modes = plan["straggler_outlook"]
        items = "".join(f"<li>{esc(line.strip())}</li>" for line in modes)
        why += (f'<h2>Synchronous or asynchronous, with a straggler</h2><p>{esc(head)}</p>'
                f'<ul class="assumptions straggler-outlook">{items}</ul>')
    return f'<div class="cards">{"".join(cards)}</div>{why}'


def _cluster_and_assumptions(data: dict) -> str:
    prof, cluster = data["profile"], data["cluster"]
    rows = [
        ("machines", cluster["machines"]),
        ("workers per machine", cluster["workers_per_machine"]),
        ("workers in all", cluster["workers"]),
        ("bandwidth per machine link", f"{format_bandwidth(cluster['bandwidth_bps'])} ({cluster['bandwidth_bps']:.4g} bit/s)"),
        ("latency per message", f"{cluster['latency_s'] * 1e6:g} us"),
        ("local aggregation", "on" if cluster["local_aggregation"] else "off"),
        ("profiled batch size per worker", prof["batch_size"]),
        ("profiled steps", prof["steps"]),
        ("profiled compute time per step", fmt_ms(prof["step_time_s"])),
        ("peak memory while profiling", format_bytes(prof["peak_memory_bytes"])),
    ]
    rows += [(f"environment: {k}", _environment_value(k, v)) for k, v in sorted(prof.get("environment", {}).items())]
    table = "".join(f"<tr>{_td(k)}{_td(v)}</tr>" for k, v in rows)
    items = "".join(f"<li>{esc(a)}</li>" for a in data["assumptions"])
    return (f'<h2>Cluster and profile</h2><table class="facts"><tbody>{table}</tbody></table>'
            f'<h2>Assumptions of the cost model</h2><ul class="assumptions">{items}</ul>')


def _environment_value(key: str, value) -> str:
    """Environment facts for people (the JSON keeps them as text): seconds with 3 digits in
    s, ms or µs, an empty list as "none"."""
    from ..cost.timing import duration

    text = str(value).strip()
    if text in ("", "[]", "None", "()"):
        return "none"
    if key.endswith("_s"):
        try:
            return duration(float(text))
        except ValueError:
            return text
    return text.strip("[]").replace("'", "") if text.startswith("[") else text


def _variables_table(data: dict) -> str:
    per_machine = any(v["alpha_per_machine"] is not None and v["alpha"] is not None
                      and abs(v["alpha_per_machine"] - v["alpha"]) > 1e-12 for v in data["variables"])
    alpha_head = "<th class=num>&alpha;</th>" + ("<th class=num>&alpha; per machine</th>" if per_machine else "")
    keys = [f"{key}_bytes_per_step" for key in RECORDED_COSTS]
    head = ("<tr><th>variable</th><th>kind</th><th>shape</th><th class=num>size</th>" + alpha_head
            + "".join(f"<th class=num>{esc(labels.text(key))} bytes/step</th>" for key in RECORDED_COSTS)
            + "<th>method</th><th class=num>partitions</th></tr>")
    body = []
    for v in data["variables"]:
        shape = " x ".join(str(d) for d in v["shape"]) or "scalar"
        body.append(
            "<tr>" + _td(v["name"], "name") + f"<td>{_badge(v['kind'])}</td>" + _td(shape, "nowrap")
            + _td(format_bytes(v["size_bytes"]), "num", f"{v['size_bytes']} bytes")
            + _td(_fmt_alpha(v["alpha"]), "num")
            + (_td(_fmt_alpha(v["alpha_per_machine"]), "num") if per_machine else "")
            + "".join(_td(fmt_bytes(v[key]), "num", f"{v[key]:.0f} bytes") for key in keys)
            + f"<td>{_badge(v['method'])}</td>" + _td(v["partitions"], "num") + "</tr>")
    total = sum(v["size_bytes"] for v in data["variables"])
    chosen = sum(v[f"{v['method']}_bytes_per_step"] for v in data["variables"])
    foot = (f"<tr><td>all {len(data['variables'])} variables</td><td></td><td></td>"
            f"{_td(format_bytes(total), 'num')}<td></td>{'<td></td>' if per_machine else ''}"
            + "".join(_td(fmt_bytes(sum(v[key] for v in data["variables"])), "num") for key in keys)
            + f"{_td('plan: ' + format_bytes(chosen), 'nowrap')}<td></td></tr>")
    return (f'<h2>Variables</h2><p class="muted">Bytes are sent + received per machine per step on the planned '
            f'cluster; &alpha; is the fraction of a variable\'s rows one worker\'s step touches (1 for dense variables)'
            + ('; &alpha; per machine is the union of a machine\'s workers, what local aggregation sends' if per_machine else '')
            + '.</p>'
            f'<div class="scroll"><table class="variables"><thead>{head}</thead><tbody>{"".join(body)}</tbody><tfoot>{foot}</tfoot></table></div>')


def _comm_cell(est: dict) -> str:
    """The communication of one estimate, marked "(link)" where the link's pace sets it, not its calls."""
    if not est.get("link_bound"):   # Estimate.link_bound, as the report's data carries it
        return _td(fmt_ms(est["comm_time_s"]), "num")
    return _td(f"{fmt_ms(est['comm_time_s'])} (link)", "num nowrap",
               "the step's bytes at the pace the calibration read the link to sustain; its calls alone take less")


def _architectures_table(data: dict) -> str:
    head = ("<tr><th>architecture</th><th class=num>bytes / machine / step</th><th class=num>messages / step</th>"
            "<th class=num>transfer</th><th class=num>latency</th><th class=num>est. communication</th>"
            "<th class=num>est. step time</th><th class=num>est. examples/s</th><th class=num>speed-up vs AR</th></tr>")
    plan = data["plan"]
    rows = []

    def row(label, est, chosen):
        return (f"<tr{' class=chosen' if chosen else ''}>" + _td(label)
                + _td(fmt_bytes(est["bytes_per_machine_per_step"]), "num",
                      f"{est['bytes_per_machine_per_step']:.0f} bytes")
                + _td(_fmt_count(est["messages_per_step"]), "num") + _td(fmt_ms(est["transfer_time_s"]), "num")
                + _td(fmt_ms(est["latency_time_s"]), "num") + _comm_cell(est)
                + _td(fmt_ms(est["step_time_s"]), "num") + _td(_fmt_count(est["examples_per_s"]), "num")
                + _td("n/a" if est["speedup_vs_ar"] is None else f"{est['speedup_vs_ar']:.2f}x", "num") + "</tr>")

    same = [a for a in data["architectures"] if a["name"] == plan["architecture"]]
    plan_is_whole_model = (bool(same) and not plan.get("overrides")
                           and all(_close(same[0][k], plan[k]) for k in ("bytes_per_machine_per_step", "step_time_s")))
    if not plan_is_whole_model:
        rows.append(row(f"this plan ({labels.text(plan['architecture'])}, edited)", plan, True))
    for a in data["architectures"]:
        rows.append(row(a["label"], a, plan_is_whole_model and a["name"] == plan["architecture"]))
    return (f'<h2>Totals per architecture</h2><div class="scroll"><table class="architectures"><thead>{head}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            f'<p class="muted">Highlighted: this plan. Communication = the collective calls a step issues, each '
            f'its latency plus the bytes one rank hands to it over the bandwidth '
            f'({esc(data.get("calibration") or "uncalibrated (defaults)")}), and never less than the step\'s '
            f'bytes need at the pace the calibration read the link to sustain (marked "(link)" where that '
            f'sets it); step time = compute time '
            f'({esc(fmt_ms(plan["compute_time_s"]))}) + communication, without overlap. Messages: the byte '
            f'model\'s message rounds. Sparse-as-dense AR is plain Horovod with sparse_as_dense=True; plain '
            f'Horovod (defaults) allgathers sparse gradients among all ranks with their duplicate rows; TF '
            f'parameter servers push and pull every variable from each worker on its own.</p>')


def _fmt_alpha(a) -> str:
    return "n/a" if a is None else f"{a:.4g}"


def _close(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)


def _fmt_count(x) -> str:
    return "n/a" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def _figure(svg: str, alt: str, caption: str, cls: str) -> str:
    return (f'<figure class="{cls}"><img src="{charts.svg_data_uri(svg)}" alt="{esc(alt)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def _charts(data: dict) -> str:
    n = len(data["variables"])
    shown = min(n, charts.MAX_BARS)
    bars = _figure(charts.bytes_per_variable_svg(data["variables"]), "bytes per variable under each method",
                   f"Bytes per machine per step of each variable under PS, AR and sparse-as-dense AR "
                   f"({shown} of {n} variables, largest first).", "chart-bytes")
    curve = _figure(charts.step_time_curve_svg(data["step_time_curve"], data["cluster"]["machines"]),
                    "estimated step time against machines",
                    f"Estimated step time for {data['step_time_curve']['machines'][0]} to "
                    f"{data['step_time_curve']['machines'][-1]} machines of "
                    f"{data['cluster']['workers_per_machine']} worker(s), same bandwidth and latency.",
                    "chart-curve")
    return f"<h2>Charts</h2>{bars}{curve}"


def _plan_changes(executed: dict | None) -> str:
    """What the run changed from the plan, each change with its reason (from its executed plan)."""
    if not executed:
        return ""
    lines = ExecutedPlan.from_dict(executed).change_lines()
    if not lines:
        return '<p class="plan-changes muted">The run executed the plan as given.</p>'
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f'<h3>What the run changed from the plan</h3><ul class="plan-changes">{items}</ul>'


def _staleness(staleness: dict | None) -> str:
    """An asynchronous run's measured staleness: per rank, mean and max steps ahead of the slowest."""
    if not staleness:
        return ""
    measured = MeasuredStaleness.from_dict(staleness)
    head = ("<tr><th>rank</th><th class=num>steps</th><th class=num>mean steps ahead</th>"
            "<th class=num>max steps ahead</th></tr>")
    rows = "".join(f"<tr>{_td(r.rank)}{_td(r.steps, 'num')}{_td(f'{r.mean_steps_ahead:.2f}', 'num')}"
                   f"{_td(r.max_steps_ahead, 'num')}</tr>" for r in measured.ranks)
    total = (f"<tr>{_td('all ranks')}{_td(sum(r.steps for r in measured.ranks), 'num')}"
             f"{_td(f'{measured.mean_steps_ahead:.2f}', 'num')}{_td(measured.max_steps_ahead, 'num')}</tr>")
    return (f'<h3>Measured staleness</h3><p class="staleness-definition muted">{esc(DEFINITION)}.</p>'
            f'<div class="scroll"><table class="staleness"><thead>{head}</thead><tbody>{rows}{total}</tbody>'
            f'</table></div>')


def _step_time_basis(step_time: dict | None) -> str:
    """How the run's step time was predicted and which steps were measured."""
    if not step_time:
        return ""
    warning = step_time.get("warning")
    return (f'<p class="step-time-basis muted">Step time: predicted by the {esc(step_time["basis"])}; measured: '
            f'the median of {esc(step_time["measured_steps"])}.</p>'
            + (f'<p class="step-time-warning">Warning: {esc(warning)}</p>' if warning else ""))


def _measured(data: dict) -> str:
    m = data.get("measured")
    if not m:
        return ""
    run = m["run"]
    facts = [("architecture", labels.text(run["architecture"])), ("ranks", run["ranks"]),
             ("machines x workers", f"{run['machines']} x {run['workers_per_machine']}"),
             ("steps", run["steps"]), ("batch size per rank", run["batch_size_per_rank"]),
             ("median examples/s", _fmt_count(run["examples_per_s_median"])), ("final loss", "n/a" if run["final_loss"] is None else f"{run['final_loss']:.5g}"),
             ("median step time", fmt_ms(run["step_time_s_median"])), ("training", m.get("training", "synchronous"))]
    facts_html = "".join(_card(k, str(v)) for k, v in facts)
    head = "<tr><th>quantity</th><th class=num>predicted</th><th class=num>measured</th><th class=num>error</th></tr>"

    def row(label, predicted, measured, pct, fmt, name_cls=""):
        return ("<tr>" + _td(label, name_cls) + _td(fmt(predicted), "num") + _td(fmt(measured), "num")
                + _td(fmt_pct(pct), "num " + _pct_class(pct)) + "</tr>")

    totals = "".join(row(t["quantity"], t["predicted"], t["measured"], t["error_pct"],
                         fmt_bytes if t["unit"] == "bytes" else fmt_ms) for t in m["totals"])
    per_var = "".join(row(v["name"] + f" ({labels.text(v['method'])})", v["predicted_bytes_per_step"],
                          v["measured_bytes_per_step"], v["error_pct"], fmt_bytes, "name") for v in m["variables"])
    warnings = "".join(f'<div class="warn">{esc(w)}</div>' for w in m.get("warnings", []))
    return (f"<h2>Predicted against measured</h2>{warnings}<div class=\"cards\">{facts_html}</div>"
            f"<p>{esc(m['basis'])}</p>{_plan_changes(m.get('executed_plan'))}{_staleness(m.get('staleness'))}"
            f'<div class="scroll"><table class="measured"><thead>{head}</thead><tbody>{totals}</tbody></table></div>'
            f'{_step_time_basis(m.get("step_time"))}'
            f'<h3>Per variable (bytes sent + received per machine per step)</h3>'
            f'<div class="scroll"><table class="measured-variables"><thead>{head}</thead><tbody>{per_var}</tbody></table></div>'
            f'<p class="muted">error = (measured - predicted) / predicted.</p>')


def render_fragment(data: dict) -> str:
    """The report as a ``<div class="pxr">`` with its scoped style: for notebooks."""
    notes = f'<div class="notes">{esc(data["notes"])}</div>' if data.get("notes") else ""
    return (f'<style>{CSS}</style><div class="pxr">'
            f'<h1>{esc(data["title"])}</h1>'
            f'<p class="subtitle">Cost report generated {esc(data["generated_utc"])} by parallax_nb '
            f'{esc(data["parallax_nb_version"])}</p>{notes}'
            f'{_overview(data)}{_cluster_and_assumptions(data)}{_variables_table(data)}'
            f'{_architectures_table(data)}{_charts(data)}{_measured(data)}'
            f'<p class="muted">The same figures are in the JSON (schema {esc(data["schema"])} version '
            f'{esc(data["schema_version"])}) and CSV written beside this file.</p></div>')


def render_document(data: dict, fragment: str | None = None) -> str:
    """A whole HTML page that opens from disk and loads nothing from anywhere
    (``fragment``: :func:`render_fragment` of ``data`` when the caller already has it)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>{esc(data['title'])}</title>"
            '<link rel="icon" href="data:,">'
            f"</head><body>{fragment if fragment is not None else render_fragment(data)}</body></html>\n")
