"""When each collective of a step is asked for and done, from Horovod's timeline.

Run a benchmark with ``HOROVOD_TIMELINE=PATH`` (rank 0 writes it), then::

    python benchmarks/timeline_calls.py PATH --first px_ids_embedding_embeddings_0

Horovod names each tensor's row in the timeline after the collective (parallax_nb's calls are
``px_<what>_<variable>``). For the ``k``-th call of the tensor named by ``--first`` (one per
step), every other tensor's ``k``-th call is placed relative to it: ``requested`` when the first
rank asked for it (the start of Horovod's negotiation), ``all requested`` when the last rank
did, ``done`` when the call ended. Medians over the calls after ``--skip``. Only tensors with a
call in every step of ``--first`` and requested within one step's period of it are shown, so
the calls of another configuration in the same timeline drop out.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys


def read_timeline(path: str) -> list[dict]:
    """The timeline's events; a timeline whose writer was ended early lacks its closing bracket."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def calls_by_tensor(events: list[dict]) -> dict[str, list[tuple[float, float, float]]]:
    """tensor name -> its calls in order, each (requested, all requested, done) in microseconds:
    a negotiation span (``NEGOTIATE_*``) and the top-level span of the operation after it."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    spans, open_spans = collections.defaultdict(list), collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "B":
            open_spans[e["pid"]].append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_spans[e["pid"]]:
            name, start = open_spans[e["pid"]].pop()
            if not open_spans[e["pid"]]:
                spans[e["pid"]].append((name, start, e["ts"]))
    out = {}
    for pid, sequence in spans.items():
        out[names.get(pid, str(pid))] = [(a[1], a[2], b[2]) for a, b in zip(sequence, sequence[1:])
                                         if a[0].startswith("NEGOTIATE") and not b[0].startswith("NEGOTIATE")]
    return out


def step_table(calls: dict, first: str, skip: int, period: float) -> list[tuple[str, float, float, float]]:
    """(tensor, requested, all requested, done), medians relative to ``first``'s request, by
    median request time; tensors requested more than ``period`` away from it are left out."""
    anchors = [c[0] for c in calls[first]]
    rows = []
    for name, seq in calls.items():
        if len(seq) < len(anchors):
            continue
        rel = [(r - t0, a - t0, d - t0) for (r, a, d), t0 in zip(seq, anchors)][skip:]
        medians = tuple(statistics.median(x[i] for x in rel) for i in range(3)) if rel else None
        if medians and abs(medians[0]) < period:
            rows.append((name, *medians))
    return sorted(rows, key=lambda r: r[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline")
    parser.add_argument("--first", required=True, help="the tensor whose calls mark the steps")
    parser.add_argument("--skip", type=int, default=10, help="steps left out at the start (warm-up)")
    args = parser.parse_args(argv)
    calls = calls_by_tensor(read_timeline(args.timeline))
    if args.first not in calls:
        raise SystemExit(f"no tensor named {args.first!r} in the timeline; tensors: {sorted(calls)[:20]}")
    anchors = [c[0] for c in calls[args.first]][args.skip:]
    if len(anchors) < 2:
        raise SystemExit(f"{args.first!r} has {len(anchors)} calls after --skip {args.skip}: too few to find a step")
    period = statistics.median(b - a for a, b in zip(anchors, anchors[1:]))
    rows = step_table(calls, args.first, args.skip, period)
    print(f"{len(anchors)} steps after {args.skip}; median period {period:.0f} us; medians in us from the request "
          f"of {args.first}")
    print(f"  {'tensor':<48} {'requested':>9} {'all requested':>13} {'done':>6}")
    for name, requested, everyone, done in rows:
        print(f"  {name[:48]:<48} {requested:9.0f} {everyone:13.0f} {done:6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
