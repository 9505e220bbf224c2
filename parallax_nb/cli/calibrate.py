"""``python -m parallax_nb calibrate --np N [--hostfile H | --emulate 2x2@1Gbit/s] [--job module:name]
[--env NAME=VALUE ...] -o calibration.json``: measure this cluster's collectives (and a job's
compute per step) on N ranks under ``mpirun``, print the fits, write the calibration atomically.

The ranks run with this shell's environment, as ``python -m parallax_nb run`` does, plus
``--env``: calibrate under the Horovod settings of the run to be predicted (e.g.
``--env HOROVOD_CYCLE_TIME=0.1``); the calibration records them."""
from __future__ import annotations

import argparse
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", type=int, default=None,
                        help="MPI ranks to start (default 2; with --emulate its machines x ranks)")
    parser.add_argument("--hostfile", help="mpirun hostfile (default: all ranks on this machine)")
    parser.add_argument("--emulate", metavar="MxG@BANDWIDTH",
                        help="an emulated network of M machines x G ranks, e.g. 2x2@1Gbit/s (needs root)")
    parser.add_argument("--job", help="also measure this Job's compute per step under the real placement (module:name)")
    parser.add_argument("--workers-per-machine", type=int, default=None,
                        help="treat ranks r // G as one machine (default: the hosts)")
    parser.add_argument("--link-interface", default=None,
                        help="on real hosts: the network interface whose counters give Horovod's idle traffic")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the ranks, e.g. HOROVOD_CYCLE_TIME=0.1 (repeatable)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop the ranks after this many seconds (default 1800); ranks that report no step "
                             "for 120 s are stopped sooner")
    parser.add_argument("-o", "--output", default="calibration.json", help="where to write the calibration JSON")


def main(args: argparse.Namespace) -> int:
    from ..calibrate import calibrate, fits_table
    from ..errors import ConfigError

    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout:g}",
                          hint="leave it out for the default (1800 s, and 120 s without a rank's step)")
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--env {item!r} is not NAME=VALUE", hint="e.g. --env HOROVOD_CYCLE_TIME=0.1")
        env[name] = value
    start = time.perf_counter()
    print(f"parallax_nb calibrate: measuring on {args.emulate or args.hostfile or 'this host'} ...",
          file=sys.stderr, flush=True)
    calibration = calibrate(np=args.np, hostfile=args.hostfile, emulate=args.emulate, job=args.job,
                            workers_per_machine=args.workers_per_machine, link_interface=args.link_interface,
                            timeout_s=args.timeout, env=env)
    print(f"Calibration of {calibration.shape}, {calibration.where} "
          f"(t = latency + bytes per rank / bandwidth):")
    print(fits_table(calibration))
    calibration.to_json(args.output)
    print(f"\nwrote {args.output} in {time.perf_counter() - start:.1f} s")
    return 0
