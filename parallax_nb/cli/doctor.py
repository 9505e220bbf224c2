"""``python -m parallax_nb doctor``: print the environment checks; exit 0 when distributed
training can run here, 1 (with what to fix) when it cannot."""
from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--quiet", action="store_true", help="print only problems")


def main(args) -> int:
    from ..environment import check_environment, failures, format_table

    checks = check_environment()
    failed = failures(checks)
    if not args.quiet or failed:
        print("parallax_nb environment:")
        print(format_table(checks))
    if failed:
        print(f"parallax_nb doctor: {len(failed)} problem(s): {', '.join(c.name for c in failed)}; "
              "distributed training cannot run until they are fixed", file=sys.stderr)
        return 1
    print("parallax_nb doctor: all required checks passed")
    return 0
