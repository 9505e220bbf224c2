"""``python -m parallax_nb profile <module:job> --steps K [--warmup W] [--batch-size B] -o profile.json``

Profiles the Job on this machine's one device, prints the per-variable table (the 40 largest
variables, the rest counted; ``--all`` lists every one) and writes the Profile as JSON
(atomically: a crash leaves no half-written file).
"""
from __future__ import annotations

import os

from ..types import SUMMARY_ROWS


def add_arguments(parser) -> None:
    parser.add_argument("job", help="the Job to profile, as module:name (e.g. parallax_nb.workloads:lm_tiny)")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps after the warm-up (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps, not measured (default 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="override the Job's per-worker batch size")
    parser.add_argument("--max-workers", type=int, default=8,
                        help="largest G for the union of rows over G workers (default 8)")
    parser.add_argument("--all", action="store_true", dest="every_variable",
                        help=f"list every variable (default: the {SUMMARY_ROWS} largest, the rest counted)")
    parser.add_argument("-o", "--output", default="profile.json", help="where to write the profile (JSON)")


def check_counts(args) -> None:
    """A ConfigError in the command line's own terms for a count out of range, before the job
    is loaded (TensorFlow's import takes seconds)."""
    from ..errors import ConfigError

    for flag, value, least in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                               ("--max-workers", args.max_workers, 1), ("--batch-size", args.batch_size, 1)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be a whole number >= {least}, got {value}",
                              hint="e.g. --steps 20 --warmup 2 (the defaults)")


def main(args) -> int:
    check_counts(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from .. import progress
    from ..job import load_job
    from ..profile import profile_job

    progress.listen(progress.terminal_listener())

    job = load_job(args.job)
    if args.batch_size is not None:
        job = job.replace(batch_size=args.batch_size)
    prof = profile_job(job, steps=args.steps, warmup=args.warmup, max_workers=args.max_workers)
    print(prof.summary(limit=None if args.every_variable else SUMMARY_ROWS))
    prof.to_json(args.output)
    print(f"wrote {args.output}")
    return 0
