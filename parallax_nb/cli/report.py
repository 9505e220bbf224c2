"""``python -m parallax_nb report --profile profile.json --plan plan.json [--run RUN_DIR]
[--calibration calibration.json] -o report.html``

Writes the HTML cost report and, beside it, the same name with .csv and .json; prints the
three paths.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, metavar="PROFILE_JSON",
                        help="profile.json written by `python -m parallax_nb profile`")
    parser.add_argument("--plan", required=True, metavar="PLAN_JSON",
                        help="plan.json written by `python -m parallax_nb plan`")
    parser.add_argument("--run", metavar="RUN_DIR",
                        help="output directory of `python -m parallax_nb run` (holding run.json), or the run.json "
                             "itself: adds predicted against measured")
    parser.add_argument("-o", "--output", default="cost_report.html", metavar="REPORT_HTML",
                        help="where to write the HTML (default: cost_report.html); .csv and .json go beside it")
    parser.add_argument("--title", help="title at the top of the report")
    parser.add_argument("--notes", help="free text shown under the title")
    parser.add_argument("--calibration", metavar="CALIBRATION_JSON",
                        help="calibration of the plan's cluster (python -m parallax_nb calibrate): prices the step "
                             "times; default: documented defaults, marked uncalibrated")


def main(args: argparse.Namespace) -> int:
    from ..calibration import Calibration
    from ..plan import Plan
    from ..report import report
    from ..types import Profile

    profile = Profile.from_json(args.profile)
    plan = Plan.from_json(args.plan)
    calibration = Calibration.from_json(args.calibration) if args.calibration else None
    files = report(profile, plan, args.run, title=args.title, notes=args.notes,
                   calibration=calibration).save(args.output)
    for path in files:
        print(path)
    return 0
