"""``python -m parallax_nb.netem cleanup [--all] | status``."""
from __future__ import annotations

import argparse
import sys

from . import links


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parallax_nb.netem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    clean = sub.add_parser("cleanup", help="remove emulated clusters whose owner process is gone")
    clean.add_argument("--all", action="store_true", help="also remove clusters of live processes")
    sub.add_parser("status", help="list emulated clusters and leftover namespaces")
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        removed = links.cleanup_stale(include_live=args.all)
        print("\n".join(f"removed {r}" for r in removed) or "nothing to remove")
        return 0
    for r in links.records():
        state = "live" if links.pid_alive(r.owner_pid) else "stale (owner gone)"
        print(f"{r.cluster_id}: {len(r.namespaces)} machines on {r.subnet}, owner pid {r.owner_pid}, {state}")
    leftovers = [ns for ns in links.list_namespaces() if ns.startswith(links.PREFIX)]
    print(f"namespaces: {' '.join(leftovers) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
