"""Profile a Job on one device: per-variable kind (sparse iff the gradient is a
``tf.IndexedSlices``), rows touched, alpha, gradient bytes, union of rows over G workers,
step time and peak memory. ``px.profile`` is :func:`profile_job`."""
from .profiler import profile_job

profile = profile_job

__all__ = ["profile_job", "profile"]
