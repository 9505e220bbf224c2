"""``python -m parallax_nb quickstart [-o DIR]``: execute notebooks/quickstart.ipynb headless.

The notebook profiles the LM reference workload, plans it, trains it on 2 MPI engines and saves
its cost report. Here it runs top to bottom in a fresh kernel (nbclient) with DIR as its working
directory and ``PARALLAX_QUICKSTART_REPORT=DIR/quickstart_report.html``; the executed notebook is
written to DIR/quickstart.ipynb even when a cell fails, so the failing cell can be read there.
"""
from __future__ import annotations

import os
import pathlib
import sys
import time

from ..errors import ConfigError, ParallaxError

REPORT_ENV = "PARALLAX_QUICKSTART_REPORT"
REPORT_NAME = "quickstart_report.html"


class NotebookError(ParallaxError, RuntimeError):
    """A cell of the executed notebook raised."""


def default_notebook() -> pathlib.Path:
    """notebooks/quickstart.ipynb of the source tree this package was imported from."""
    return pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def add_arguments(parser) -> None:
    parser.add_argument("-o", "--output-dir", default="quickstart-output",
                        help="where the executed notebook and the report go (default: ./quickstart-output)")
    parser.add_argument("--notebook", default=None,
                        help="the notebook to execute (default: notebooks/quickstart.ipynb of this source tree)")
    parser.add_argument("--cell-timeout", type=int, default=600,
                        help="seconds one cell may run before it is stopped (default: 600)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")


def execute_notebook(notebook: pathlib.Path, output_dir: pathlib.Path, *, cell_timeout: int = 600,
                     kernel: str = "python3", env: dict | None = None) -> pathlib.Path:
    """Run ``notebook`` top to bottom with ``output_dir`` as working directory; write the executed
    copy there and return its path. A failing cell raises :class:`NotebookError` (after the copy
    is written) naming the cell and the error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if not notebook.is_file():
        raise ConfigError(f"notebook not found: {notebook}",
                          hint="run from a source checkout of parallax_nb, or pass --notebook PATH")
    output_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    executed = output_dir / notebook.name
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(output_dir)}})
    # TensorFlow's start-up notes (oneDNN, CPU instructions) from the kernel are not the user's
    # business on this command's terminal; a caller's own setting is kept
    kernel_env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, **(env or {})}
    # the kernel (and the engines it starts) import the same parallax_nb as this command
    source_root = str(pathlib.Path(__file__).resolve().parents[2])
    kernel_env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, kernel_env.get("PYTHONPATH")) if p)
    try:
        client.execute(env=kernel_env)
    except CellExecutionError as e:
        nbformat.write(nb, executed)
        raise NotebookError(f"a cell of {notebook.name} failed: {_last_line(str(e))}",
                            hint=f"open {executed} to see the failing cell and its traceback") from None
    except CellTimeoutError:
        nbformat.write(nb, executed)
        raise NotebookError(f"a cell of {notebook.name} ran longer than {cell_timeout} s and was stopped",
                            hint=f"raise --cell-timeout, or see which cell in {executed}") from None
    except (DeadKernelError, AssertionError):
        # Ctrl-C: nbclient shuts the kernel down itself (its engines follow it), the running cell
        # then sees a dead kernel, and nbclient 0.10's own clean-up trips an assertion.
        nbformat.write(nb, executed)
        raise NotebookError(f"the kernel stopped before {notebook.name} finished (interrupted, or out of memory)",
                            hint=f"the cells that ran are in {executed}") from None
    nbformat.write(nb, executed)
    return executed


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def main(args) -> int:
    output_dir = pathlib.Path(args.output_dir).resolve()
    notebook = pathlib.Path(args.notebook).resolve() if args.notebook else default_notebook()
    report_html = output_dir / REPORT_NAME
    start = time.monotonic()
    print(f"executing {notebook} in {output_dir} ...", flush=True)
    executed = execute_notebook(notebook, output_dir, cell_timeout=args.cell_timeout, kernel=args.kernel,
                                env={REPORT_ENV: str(report_html)})
    files = [report_html, report_html.with_suffix(".csv"), report_html.with_suffix(".json")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise NotebookError(f"the notebook ran but did not write {missing}",
                            hint=f"its last cell should save the report to ${REPORT_ENV}; see {executed}")
    print(f"done in {time.monotonic() - start:.0f} s")
    print(f"executed notebook: {executed}")
    for label, path in zip(("report (HTML)", "report (CSV)", "report (JSON)"), files):
        print(f"{label + ':':<15} {path}")
    sys.stdout.flush()
    return 0
