"""What a collective costs beside others and after others: fans against chains of small calls.

Run under mpirun (every rank the same command)::

    mpirun -np 2 --mca btl tcp,self --mca mpi_yield_when_idle 1 -x HOROVOD_CYCLE_TIME=0.1 \\
        python benchmarks/call_overlap.py

The cost model prices every call of a step at its calibrated latency, one after the other
(``parallax_nb/cost/timing.py``), and ``px.calibrate`` times each op as a chain of calls, each
waiting for the one before. A step also issues calls that do not wait for each other (the
lookups of several tables, the gradients of several variables). Per op and size, in one
``tf.function`` each, medians over ``--iters`` calls of the function, ``--repeats`` rounds:

* ``chain of k``: k calls, each fed by the one before;
* ``fan of k``: k calls of the same input, issued together.

Printed per k: the median time of the function, the chain's time per call, and what each call
of the fan adds beside the first (``(fan k - fan 1) / (k - 1)``). A step whose calls share
Horovod's cycles sits between the two; where it sits depends on when the step's ops reach
Horovod, which neither measures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

OPS = ("alltoall", "allreduce", "allgather")


def function(calls: dict, op: str, k: int, chained: bool):
    """One ``tf.function`` of k calls of ``op`` over all ranks, as ``px.calibrate`` issues them
    (``calls``: :func:`parallax_nb.runtime.calibrate._collective_calls`), chained or fanned."""
    import tensorflow as tf

    call = calls[f"{op}/all"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)], autograph=False)
    def run(x):
        outs, y = [], x
        for i in range(k):
            y = call(y if chained else x + float(i), i)
            outs.append(y)
        return tf.add_n(outs)

    return run


def measure(hvd, calls: dict, op: str, size_bytes: int, ks: list[int], iters: int, warmup: int) -> dict:
    """``{"fan": {k: seconds}, "chain": {k: seconds}}``: median seconds of one call of each function."""
    import tensorflow as tf

    x = tf.ones([max(hvd.size(), size_bytes // 4 // hvd.size() * hvd.size())])
    out = {"fan": {}, "chain": {}}
    for kind in ("fan", "chain"):
        for k in ks:
            if kind == "chain" and k == 1:
                continue   # a chain of one is a fan of one
            f = function(calls, op, k, kind == "chain")
            for _ in range(warmup):
                f(x).numpy()
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                f(x).numpy()
                times.append(time.perf_counter() - start)
            out[kind][k] = statistics.median(times)
    out["chain"][1] = out["fan"][1]
    return out


def summary(rounds: list[dict], ks: list[int]) -> list[tuple]:
    """Per k: (k, fan s, chain s, chain s per call, fan s per call beside the first), each the
    median over ``rounds``."""
    def median(kind, k):
        return statistics.median(r[kind][k] for r in rounds)

    one = median("fan", 1)
    table = []
    for k in ks:
        fan, chain = median("fan", k), median("chain", k)
        beside = (fan - one) / (k - 1) if k > 1 else float("nan")
        table.append((k, fan, chain, chain / k, beside))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--bytes", type=int, default=256, help="bytes each rank hands to one call (default 256)")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 12], help="calls per function (must include 1)")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="write every round's figures here (rank 0)")
    args = parser.parse_args()
    if 1 not in args.k or any(k < 1 for k in args.k):
        parser.error(f"--k must include 1 and hold whole numbers >= 1, got {args.k}")
    from parallax_nb.runtime.calibrate import _collective_calls
    from parallax_nb.runtime.context import horovod, shutdown

    hvd = horovod()
    calls = _collective_calls(hvd, None)
    results = {}
    for op in args.ops:
        results[op] = [measure(hvd, calls, op, args.bytes, args.k, args.iters, args.warmup)
                       for _ in range(args.repeats)]
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {args.bytes} B per call and rank, medians of {args.iters} calls, "
              f"then the median of {args.repeats} rounds (us):")
        print(f"  {'op':<10} {'k':>3} {'fan':>8} {'chain':>8} {'chain per call':>15} {'fan: per call beside the first':>31}")
        for op, rounds in results.items():
            for k, fan, chain, per_call, beside in summary(rounds, args.k):
                extra = "-" if k == 1 else f"{beside * 1e6:.0f}"
                print(f"  {op:<10} {k:3d} {fan * 1e6:8.0f} {chain * 1e6:8.0f} {per_call * 1e6:15.0f} {extra:>31}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": hvd.size(), "bytes": args.bytes, "iters": args.iters,
                           "rounds": {op: [{kind: {str(k): s for k, s in r[kind].items()} for kind in r} for r in rounds]
                                      for op, rounds in results.items()}}, f, indent=1)
    shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no atexit hook may block in a collective
