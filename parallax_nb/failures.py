"""Why a rank failed: each rank writes its reason to a shared folder, the launcher reads them.

A leaf module (standard library and :mod:`.errors` only), so the runtime on the ranks, the
command line and the notebook's dispatcher report and read failures the same way without
importing each other. File format: ``<dir>/error-<rank>.txt``, first line the Unix time of
the failure in seconds, then the text.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback

from .errors import ParallaxError


def mpi_rank() -> int:
    """This process's rank in MPI_COMM_WORLD from the launcher's environment (0 outside MPI)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


#: how a rank says it stopped because another rank failed (asynchronous training: the failed
#: rank's abort, :meth:`parallax_nb.runtime.async_ps.AsyncPS.abort`)
_PEER_FAILED = "failed during asynchronous training:"
_CAUSED_BY = re.compile(r"rank \d+ stopped: rank (\d+) on host \S+ " + re.escape(_PEER_FAILED))


def peer_failure_message(rank: int, peer: int, host: str, text: str) -> str:
    """The message of rank ``rank`` stopping because rank ``peer`` on ``host`` failed with ``text``."""
    return f"rank {rank} stopped: rank {peer} on host {host} {_PEER_FAILED} {text}"


def failed_peer(message: str) -> int | None:
    """The rank a :func:`peer_failure_message` in ``message`` names as the cause, else None.
    Launchers report that rank's own failure rather than one that followed from it (both can
    end within a moment, in either order)."""
    found = _CAUSED_BY.search(message or "")
    return int(found.group(1)) if found else None


def read_failures(workdir: str) -> list[tuple[int, float, str]]:
    """(rank, time, traceback) of every rank that wrote an error file, earliest first; a
    failure caused by another rank's that is also here (:func:`failed_peer`) comes after it."""
    failures = []
    for name in os.listdir(workdir):
        if name.startswith("error-") and name.endswith(".txt"):
            with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
                first, _, text = f.read().partition("\n")
            failures.append((int(name[6:-4]), float(first or 0), text))
    ranks = {rank for rank, _, _ in failures}
    return sorted(failures, key=lambda f: (failed_peer(f[2]) in ranks, f[1], f[0]))


def report_rank_failure(exc: BaseException, out_dir: str | None = None) -> str:
    """Print why this rank failed to stderr (and to ``out_dir/error-<rank>.txt``); return it:
    the traceback, or only the message of a :class:`ParallaxError` (which names the problem)."""
    rank = mpi_rank()
    if isinstance(exc, ParallaxError):  # our own message says it all: no traceback of our code
        text = f"{type(exc).__name__}: {exc}\n"
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"[parallax_nb] rank {rank} failed:\n{text}"
    sys.stderr.write(message)
    sys.stderr.flush()
    if out_dir is not None:
        _write_stamped(os.path.join(out_dir, f"error-{rank}.txt"), text)
    return text


def _write_stamped(path: str, text: str) -> None:
    """``path`` replaced by the Unix time, a newline and ``text`` (the files of this module)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(f"{time.time():.6f}\n{text}")
    os.replace(path + ".tmp", path)


#: the environment variable naming the folder where ranks of :func:`parallax_nb.launch.run_on_ranks`
#: write their errors and their progress
ERROR_DIR_ENV = "PARALLAX_NB_RANK_ERROR_DIR"


def report_progress(text: str) -> None:
    """Say what this rank is doing now (``<dir>/progress-<rank>.txt``: the Unix time, then
    ``text``), where the launcher gave a folder (:data:`ERROR_DIR_ENV`): a launch that makes
    no progress is stopped, and its error names each rank's last step (:func:`read_progress`).
    A no-op elsewhere; a write that fails is left out (progress is a diagnosis, not a result)."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return
    try:
        _write_stamped(os.path.join(folder, f"progress-{mpi_rank()}.txt"), text)
    except OSError:
        pass


def read_progress(workdir: str) -> dict[int, tuple[float, str]]:
    """``{rank: (time, text)}`` of each rank's last :func:`report_progress` in ``workdir``."""
    out = {}
    try:
        names = os.listdir(workdir)
    except OSError:
        return out
    for name in names:
        if name.startswith("progress-") and name.endswith(".txt"):
            try:
                with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
                    first, _, text = f.read().partition("\n")
                out[int(name[9:-4])] = (float(first), text.strip())
            except (OSError, ValueError):
                continue
    return out
