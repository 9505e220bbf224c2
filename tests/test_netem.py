"""The emulated cluster comes up, shapes its links, runs mpirun across namespaces, and is removed
(on exit, on an exception, on SIGTERM, and by `python -m parallax_nb.netem cleanup` after kill -9)."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from parallax_nb.errors import ConfigError

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="the emulated cluster needs root and iproute2"),
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def leftovers(cluster_id: str) -> list[str]:
    """Everything of one cluster still present: namespaces, links, /etc/netns dirs, state file."""
    prefix = "pxnb" + cluster_id
    found = [n for n in os.listdir("/sys/class/net") if n.startswith(prefix)]
    found += [n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else []) if n.startswith(prefix)]
    found += [n for n in (os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []) if n.startswith(prefix)]
    if os.path.exists(f"/run/parallax_nb-netem/{cluster_id}.json"):
        found.append("state file")
    return found


def throughput_bps(sender_ns: str, receiver_ns: str, receiver_ip: str, megabytes: int) -> float:
    """Bits per second of one TCP stream between two namespaces, timed by the receiver."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", receiver_ns, sys.executable, "-c", textwrap.dedent("""
            import socket, time
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", 5599)); s.listen(); print("ready", flush=True)
            c, _ = s.accept(); n = 0; t0 = None
            while True:
                d = c.recv(1 << 20)
                if not d: break
                t0 = t0 or time.perf_counter(); n += len(d)
            print(n * 8 / (time.perf_counter() - t0))
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", sender_ns, sys.executable, "-c",
                        f"import socket; s = socket.create_connection(({receiver_ip!r}, 5599)); "
                        f"s.sendall(b'x' * ({megabytes} << 20)); s.close()"], check=True, timeout=30)
        out, _ = server.communicate(timeout=30)
        return float(out.strip())
    finally:
        if server.poll() is None:
            server.kill()


MPI_PROGRAM = textwrap.dedent("""
    import os
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    a = np.full(1 << 20, comm.rank + 1, np.float32)      # 4 MiB
    comm.Allreduce(MPI.IN_PLACE, a)
    print(f"rank {comm.rank} netns {os.stat('/proc/self/ns/net').st_ino} sum {a[0]:.0f}", flush=True)
""")


def test_cluster_shapes_runs_mpirun_across_namespaces_and_is_removed():
    from parallax_nb.netem import EmulatedCluster

    with EmulatedCluster(machines=2, workers_per_machine=1, bandwidth="200Mbit/s") as cluster:
        cid = cluster.cluster_id
        m0, m1 = cluster.machines
        assert leftovers(cid), "nothing was created"
        qdisc = subprocess.run(["ip", "netns", "exec", m0.namespace, "tc", "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc, qdisc

        # A 12 MiB stream between machines runs at the shaped rate, not at memory speed.
        bps = throughput_bps(m0.namespace, m1.namespace, m1.address, 12)
        assert 0.5 * 200e6 < bps < 1.15 * 200e6, f"measured {bps / 1e6:.0f} Mbit/s on a 200 Mbit/s link"

        before = cluster.counters()
        proc = subprocess.run(["mpirun", "-np", "2", *cluster.mpirun_args(), sys.executable, "-c", MPI_PROGRAM],
                              env=ENV, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
        assert [line.split()[-1] for line in lines] == ["3", "3"], proc.stdout
        namespaces = {line.split()[3] for line in lines}
        assert len(namespaces) == 2 and str(os.stat("/proc/self/ns/net").st_ino) not in namespaces, lines
        after = cluster.counters()
        for m in cluster.machines:   # the allreduce's 4 MiB crossed each machine's shaped link
            assert after[m.namespace][1] - before[m.namespace][1] > 2 << 20, (before, after)
    assert leftovers(cid) == []


def test_removed_on_exception():
    from parallax_nb.netem import EmulatedCluster

    cluster = EmulatedCluster(machines=2, bandwidth="10Gbit/s")
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            assert leftovers(cluster.cluster_id)
            raise RuntimeError("boom")
    assert leftovers(cluster.cluster_id) == []


HOLDER = textwrap.dedent("""
    import time
    from parallax_nb.netem import EmulatedCluster
    with EmulatedCluster(machines=2, bandwidth="1Gbit/s") as c:
        print(c.cluster_id, flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("how", ["sigterm", "kill9_then_cleanup"])
def test_removed_after_signal(how):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        cid = holder.stdout.readline().strip()
        assert cid and leftovers(cid), cid
        holder.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        holder.wait(timeout=20)
        if how == "kill9_then_cleanup":
            assert leftovers(cid), "a killed owner cannot clean up; cleanup must"
            status = subprocess.run([sys.executable, "-m", "parallax_nb.netem", "status"], env=ENV,
                                    capture_output=True, text=True, check=True).stdout
            assert f"{cid}:" in status and "stale" in status, status
            subprocess.run([sys.executable, "-m", "parallax_nb.netem", "cleanup"], env=ENV, check=True,
                           capture_output=True, timeout=30)
        deadline = time.monotonic() + 5
        while leftovers(cid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftovers(cid) == []
    finally:
        if holder.poll() is None:
            holder.kill()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(machines=0), "machines"),
    (dict(machines=2, workers_per_machine=1.5), "workers_per_machine"),
    (dict(machines=2, bandwidth="fast"), "bandwidth"),
])
def test_bad_input_is_a_config_error(kwargs, needle):
    from parallax_nb.netem import EmulatedCluster

    with pytest.raises(ConfigError, match=needle):
        EmulatedCluster(**kwargs)
