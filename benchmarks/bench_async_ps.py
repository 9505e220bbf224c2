"""Latency of the asynchronous PS (``parallax_nb.runtime.async_ps``) between two ranks, with the
owner idle and with the owner busy in TensorFlow.

Rank 1 is the worker: for ``--seconds`` per phase it pulls ``--rows`` rows of ``--dim``
float32 from partitions rank 0 owns, then pushes their gradients and waits for them to be
applied (``push`` + ``end_step``, which waits for the acknowledgement). Rank 0 serves from its
serving thread while its main thread first sleeps in Python ("idle"), then runs TensorFlow
matmuls without calling MPI ("busy"): a mechanism that needs the owner to enter MPI stalls
in the second phase. Also reported: rank 0's CPU seconds per second while it only serves
(sleeping main thread, no requests), Horovod's own background thread included.

    python benchmarks/bench_async_ps.py                 # ranks share memory (btl self,vader)
    python benchmarks/bench_async_ps.py --tcp           # bytes cross TCP sockets (btl tcp,self)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]


def _busy_tensorflow(seconds: float) -> int:
    import tensorflow as tf

    a, end, n = tf.random.normal((384, 384)), time.monotonic() + seconds, 0
    while time.monotonic() < end:
        a = tf.linalg.matmul(a, a) * 1e-3
        n += 1
    return n


def measure(rows: int, dim: int, seconds: float) -> dict:
    """On each of 2 ranks; rank 1 returns the latencies (ms), rank 0 its CPU use."""
    import numpy as np

    from parallax_nb.runtime.async_ps import AsyncPS, mpi
    from parallax_nb.runtime.owner_optimizers import SGD

    world = mpi().COMM_WORLD
    table = np.zeros((4 * rows, dim), np.float32)   # P = 2: even rows are rank 0's partition 0
    ps = AsyncPS.from_arrays({"t": table}, 2, SGD(0.01), max_staleness=None)
    ids = np.arange(0, 2 * rows, 2)
    grads = np.ones((rows, dim), np.float32)
    out = {"rank": ps.rank, "thread_level": mpi().Query_thread()}
    for phase in ("idle", "busy"):
        world.Barrier()
        if ps.rank == 0:
            start = time.process_time()
            if phase == "idle":
                time.sleep(seconds)
            else:
                out["busy_matmuls"] = _busy_tensorflow(seconds)
            out[f"{phase}_cpu_s"] = time.process_time() - start
        else:
            pulls, pushes, end = [], [], time.monotonic() + seconds - 0.3
            while time.monotonic() < end:
                t0 = time.perf_counter()
                ps.pull("t", ids)
                t1 = time.perf_counter()
                ps.push("t", ids, grads)
                ps.end_step()
                pulls.append(t1 - t0)
                pushes.append(time.perf_counter() - t1)
            out[phase] = {what: dict(n=len(v), median_ms=1e3 * float(np.median(v)),
                                     p90_ms=1e3 * float(np.percentile(v, 90)), max_ms=1e3 * float(np.max(v)))
                          for what, v in (("pull", pulls), ("push_applied", pushes))}
    world.Barrier()
    start, wall = time.process_time(), time.monotonic()
    time.sleep(2.0)
    out["serving_only_cpu_s_per_s"] = (time.process_time() - start) / (time.monotonic() - wall)
    ps.close()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    parser.add_argument("--tcp", action="store_true", help="Open MPI over TCP sockets (btl tcp,self)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.tcp:
        os.environ["OMPI_MCA_btl"] = "tcp,self"
    from parallax_nb.launch import run_on_ranks

    worker, server = reversed(run_on_ranks(measure, 2, args=(args.rows, args.dim, args.seconds),
                                           env={"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
                                           timeout_s=120))
    transport = "tcp,self" if args.tcp else "self,vader"
    print(f"async PS, 2 ranks, btl {transport}, {args.rows} rows x {args.dim} float32 per request, "
          f"MPI thread level {server['thread_level']}")
    for phase in ("idle", "busy"):
        for what, s in worker[phase].items():
            print(f"  owner {phase:4s}  {what:12s}  median {s['median_ms']:6.2f} ms  p90 {s['p90_ms']:6.2f} ms  "
                  f"max {s['max_ms']:6.1f} ms  ({s['n']} requests)")
    print(f"  owner's CPU while only serving: {server['serving_only_cpu_s_per_s']:.2f} s/s "
          f"(busy phase: {server['busy_matmuls']} matmuls in {args.seconds:g} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(transport=transport, rows=args.rows, dim=args.dim, worker=worker, server=server), f, indent=1)


if __name__ == "__main__":
    main()
