"""The output folder of ``python -m parallax_nb run``: checked and locked before any rank starts.

* An existing file where the folder should be, a folder that cannot be created, or one that
  cannot be written (read-only file system, immutable directory, missing permission) is a
  :class:`ConfigError` naming the path, raised before any training: a probe file is created
  and removed in the folder and in its ``checkpoints/``.
* One run per folder: :class:`OutputLock` creates ``.parallax-run.lock`` exclusively
  (``O_CREAT | O_EXCL``) holding the pid and host of the run. A second run on the folder is
  refused naming them; a lock left by a process that no longer runs on this host is taken
  over (said on stderr). The lock is removed when the run ends, however it ends short of
  SIGKILL (and then the next run takes the stale lock over).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import psutil

from ..errors import ConfigError

LOCK_NAME = ".parallax-run.lock"


def check_writable(output: str) -> None:
    """Create ``output`` (and ``output/checkpoints``) if needed and prove both writable."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise ConfigError(f"--output {output!r} is an existing file, not a folder",
                          hint="pass a folder path (it is created if missing)")
    for folder in (output, os.path.join(output, "checkpoints")):
        probe = os.path.join(folder, f".parallax-write-probe-{os.getpid()}")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(probe, "w") as f:
                f.write("probe")
            os.unlink(probe)
        except OSError as e:
            raise ConfigError(f"the output folder {folder!r} is not writable: {e.strerror or e}",
                              hint="choose another --output, or fix its permissions; nothing was trained") from None


class OutputLock:
    """``with OutputLock(folder): ...`` holds the folder for one run (module docstring)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, LOCK_NAME)
        self.host = socket.gethostname()
        self._held = False

    def _holder(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def acquire(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder() or {}
                pid, host = holder.get("pid"), holder.get("host")
                if host == self.host and isinstance(pid, int) and not psutil.pid_exists(pid):
                    print(f"parallax_nb run: taking over the stale lock of pid {pid} (no longer running) on "
                          f"{os.path.dirname(self.path)}", file=sys.stderr, flush=True)
                    os.unlink(self.path)
                    continue
                raise ConfigError(f"the output folder {os.path.dirname(self.path)!r} is in use by another run: "
                                  f"pid {pid} on host {host} (started {holder.get('started', '?')})",
                                  hint=f"wait for it, pass another --output, or delete {self.path} if that run "
                                       "is gone") from None
            with os.fdopen(fd, "w") as f:
                json.dump({"pid": os.getpid(), "host": self.host,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
            self._held = True
            return

    def release(self) -> None:
        if self._held:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self._held = False

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
