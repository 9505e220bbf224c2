"""Cost reports: one self-contained HTML page, with a CSV and a JSON beside it.

    rep = px.report(profile, plan, run)          # run: None, a summary dict, a run dir, or .summary()
    rep.save("cost_report.html")                 # -> ReportFiles(html=..., csv=..., json=...)
    Report.from_json("cost_report.json").html()  # the same page again

``build`` assembles the data (one JSON-ready dict), ``html`` and ``charts`` draw it, this
module writes it. The JSON (schema ``parallax_nb.report``, version 1) holds everything the
HTML shows; the CSV has one row per variable.
"""
from __future__ import annotations

import csv
import io
import json
import os
from typing import NamedTuple

from ..errors import ConfigError
from ..jsonfile import atomic_write_text, check_schema, load_json
from ..plan import RECORDED_COSTS
from .build import SCHEMA, SCHEMA_VERSION, build_report_data, error_pct, load_run

__all__ = ["report", "Report", "ReportFiles", "SCHEMA", "SCHEMA_VERSION", "load_run", "error_pct"]

CSV_COLUMNS = ("name", "kind", "shape", "dtype", "size_bytes", "alpha",
               *(f"{key}_bytes_per_step" for key in RECORDED_COSTS), "method", "partitions", "training",
               "max_staleness")
CSV_MEASURED_COLUMNS = ("run_method", "predicted_bytes_per_step_run", "measured_bytes_per_step_run",
                        "error_pct_run", "predicted_step_time_s_run", "measured_step_time_s_run",
                        "step_time_measured_steps_run", "step_time_error_pct_run", "training_run",
                        "mean_steps_ahead_run", "max_steps_ahead_run")
_SPREADSHEET_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class ReportFiles(NamedTuple):
    """Where :meth:`Report.save` wrote the report."""

    html: str
    csv: str
    json: str


def report(profile, plan, run=None, *, title: str | None = None, notes: str | None = None,
           calibration=None) -> "Report":
    """Build the cost report of ``plan`` for ``profile``, compared with ``run`` when given.

    ``run`` may be None, a run summary dict (schema ``parallax_nb.run`` v1), the output
    directory of a run (holding run.json), or an object with ``.summary()``. ``title`` and
    ``notes`` are free text shown (escaped) at the top of the page. ``calibration`` (a
    :class:`~parallax_nb.calibration.Calibration` of the plan's cluster shape; another shape is
    refused naming both) prices the step times; without one the defaults do ("uncalibrated").
    """
    return Report(build_report_data(profile, plan, run, title=title, notes=notes, calibration=calibration))


class Report:
    """A built report: its data (:meth:`to_dict`), its page (:meth:`html`) and its files (:meth:`save`)."""

    def __init__(self, data: dict):
        check_schema(data, SCHEMA, SCHEMA_VERSION, "report", ConfigError,
                     version_hint="rebuild the report from its profile and plan with this version")
        self._data = data
        self._fragment: str | None = None  # the data never changes, so neither does the page

    # ------------------------------------------------------------ views
    def to_dict(self) -> dict:
        """A deep copy of the report's data, exactly what the JSON file holds."""
        return json.loads(self.to_json())

    def to_json(self) -> str:
        return json.dumps(self._data, indent=2, allow_nan=False)

    def html(self) -> str:
        """The whole self-contained page."""
        from .html import render_document

        return render_document(self._data, self._repr_html_())

    def _repr_html_(self) -> str:
        """The page's body with its scoped style, for a notebook output cell (drawn once, then kept)."""
        if self._fragment is None:
            from .html import render_fragment

            self._fragment = render_fragment(self._data)
        return self._fragment

    def to_csv(self) -> str:
        """One row per variable; with a run, the run's per-variable predicted and measured bytes too,
        and on every row the run's predicted and measured step time (``*_step_time_s_run``, the
        steps measured, and the step time's error in ``step_time_error_pct_run``). ``training``
        and ``max_staleness``: the plan's sync or async on every row; ``training_run`` the run's,
        and for an asynchronous run its measured staleness over every rank and step
        (``mean_steps_ahead_run``, ``max_steps_ahead_run``; :mod:`parallax_nb.staleness`).

        A name that a spreadsheet would read as a formula (starting with ``= + - @``) is
        prefixed with ``'`` so that opening the CSV cannot run it.
        """
        measured = {v["name"]: v for v in (self._data.get("measured") or {}).get("variables", [])}
        step_time = (self._data.get("measured") or {}).get("step_time") or {}
        columns = CSV_COLUMNS + (CSV_MEASURED_COLUMNS if self._data.get("measured") else ())
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        plan = self._data["plan"]
        run = self._data.get("measured") or {}
        staleness = run.get("staleness") or {}
        for v in self._data["variables"]:
            row = dict(v, shape="x".join(str(d) for d in v["shape"]), training=plan.get("training", "synchronous"),
                       max_staleness=plan.get("max_staleness"))
            if run:
                row.update(training_run=run.get("training", "synchronous"),
                           mean_steps_ahead_run=staleness.get("mean_steps_ahead"),
                           max_steps_ahead_run=staleness.get("max_steps_ahead"))
            m = measured.get(v["name"])
            if m:
                row.update(run_method=m["method"], predicted_bytes_per_step_run=m["predicted_bytes_per_step"],
                           measured_bytes_per_step_run=m["measured_bytes_per_step"], error_pct_run=m["error_pct"])
            if step_time:
                row.update(predicted_step_time_s_run=step_time["predicted_step_time_s"],
                           measured_step_time_s_run=step_time["measured_step_time_s"],
                           step_time_measured_steps_run=step_time["measured_steps"],
                           step_time_error_pct_run=step_time["error_pct"])
            writer.writerow([_csv_cell(row.get(c)) for c in columns])
        return out.getvalue()

    @property
    def architecture_totals(self) -> dict[str, dict]:
        """Estimated bytes, communication and step time per architecture, by name."""
        return {a["name"]: dict(a) for a in self._data["architectures"]}

    # ------------------------------------------------------------ files
    def save(self, path) -> ReportFiles:
        """Write ``path`` (HTML) and, beside it, the same name with ``.csv`` and ``.json``."""
        path = os.fspath(path)
        stem, ext = os.path.splitext(path)
        if ext.lower() not in (".html", ".htm"):
            raise ConfigError(f"report path must end in .html, got {path!r}",
                              hint="e.g. cost_report.html; the .csv and .json are written beside it")
        files = ReportFiles(html=path, csv=stem + ".csv", json=stem + ".json")
        atomic_write_text(files.json, self.to_json())
        atomic_write_text(files.csv, self.to_csv())
        atomic_write_text(files.html, self.html())
        return files

    @classmethod
    def from_json(cls, path_or_text) -> "Report":
        """Read a report back from its JSON file (or JSON text)."""
        return cls(load_json(os.fspath(path_or_text), what="report"))

    @classmethod
    def from_dict(cls, data: dict) -> "Report":
        return cls(json.loads(json.dumps(data, allow_nan=False)))

    def __repr__(self) -> str:
        d = self._data
        return (f"<Report {d['profile']['model_name']!r}: {len(d['variables'])} variables, "
                f"plan {d['plan']['architecture']}, cluster {d['cluster']['machines']}x"
                f"{d['cluster']['workers_per_machine']}{', with run' if d.get('measured') else ''}>")


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_SPREADSHEET_FORMULA_START):
        return "'" + value
    return value
