"""Command line: ``python -m parallax_nb <command> ...`` (also installed as ``parallax-nb``).

Each command lives in ``parallax_nb/cli/<command>.py`` with ``add_arguments(parser)`` and
``main(args) -> int``. Errors of parallax_nb print as one clear message, not a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "profile": "profile a Job on one device and write profile.json",
    "plan": "plan per-variable PS/AR communication for a cluster from profile.json",
    "run": "train a Job on N MPI ranks with a plan (launches mpirun)",
    "report": "write an HTML/CSV/JSON cost report from a profile, a plan and a run",
    "calibrate": "measure this cluster's collectives and a job's compute per step; write calibration.json",
    "doctor": "check the environment: TensorFlow, Horovod (TensorFlow + MPI), Open MPI",
    "quickstart": "execute the quickstart notebook headless and leave its cost report on disk",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m parallax_nb", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(f"parallax_nb.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"parallax_nb.cli.{name}":
                raise
            p.set_defaults(_module=None)
            continue
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import ParallaxError

    args = build_parser().parse_args(argv)
    if args._module is None:
        print(f"parallax_nb: the '{args.command}' command is not available in this build", file=sys.stderr)
        return 2
    try:
        return int(args._module.main(args) or 0)
    except ParallaxError as e:
        print(f"parallax_nb {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"parallax_nb {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
