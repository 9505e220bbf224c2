"""Peak memory of the profiled training, measured as growth over a baseline taken before it.

Which meter is used depends on what the machine offers, and the profile says which
(``Profile.environment["memory_measure"]``):

- GPU: ``tf.config.experimental.get_memory_info(device)["peak"]`` after
  ``reset_memory_stats`` (bytes allocated by TensorFlow on that device).
- Linux CPU: the kernel's peak resident set size ``VmHWM`` of this process, reset to the
  current RSS by writing ``5`` to ``/proc/self/clear_refs``; peak = VmHWM - RSS at start.
- Elsewhere: a background thread samples the RSS (psutil) every ``interval_s`` seconds;
  peak = max sample - RSS at start (may miss spikes shorter than the interval).
"""
from __future__ import annotations

import os
import threading


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _read_vmhwm_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_vmhwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return _read_vmhwm_bytes() is not None
    except OSError:
        return False


class PeakMemoryMeter:
    """Context manager: ``with PeakMemoryMeter() as m: ...`` then ``m.peak_bytes``, ``m.method``."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.method = ""
        self._gpu = None
        self._stop = threading.Event()
        self._thread = None
        self._baseline = 0
        self._max_sample = 0

    def __enter__(self) -> "PeakMemoryMeter":
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            self._gpu = gpus[0].name
            try:
                tf.config.experimental.reset_memory_stats(self._gpu)
                self._baseline = tf.config.experimental.get_memory_info(self._gpu)["current"]
                self.method = (f"tf.config.experimental.get_memory_info({self._gpu!r})['peak'] minus the "
                               "allocation before profiling (TensorFlow's device allocator)")
                return self
            except (ValueError, RuntimeError):
                self._gpu = None
        self._baseline = _rss_bytes()
        if os.name == "posix" and _reset_vmhwm():
            self.method = ("peak RSS growth: VmHWM (reset via /proc/self/clear_refs) minus RSS before "
                           "building the model (host memory of the whole process)")
        else:
            self.method = (f"peak RSS growth: psutil RSS sampled every {self.interval_s * 1e3:g} ms minus RSS "
                           "before building the model (host memory; may miss short spikes)")
            self._max_sample = self._baseline
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._max_sample = max(self._max_sample, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if self._gpu is not None:
            import tensorflow as tf

            peak = tf.config.experimental.get_memory_info(self._gpu)["peak"]
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            peak = max(self._max_sample, _rss_bytes())
        else:
            peak = _read_vmhwm_bytes() or _rss_bytes()
        self.peak_bytes = max(0, int(peak) - int(self._baseline))
