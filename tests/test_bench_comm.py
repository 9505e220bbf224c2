"""Pure parts of the communication benchmark: kernel counters, byte arithmetic, argument checks."""
import os
import sys

import pytest

from parallax_nb.errors import ConfigError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_comm  # noqa: E402
import counters  # noqa: E402


def test_reads_this_namespace_interfaces():
    interfaces = counters.read_interfaces()
    assert "lo" in interfaces
    rx, tx = interfaces["lo"]
    assert isinstance(rx, int) and isinstance(tx, int) and rx >= 0 and tx >= 0


def test_kernel_bytes_counts_links_both_ways_and_local_bytes_twice():
    # two machines; machine A sends 300 B to B over eth0 and 50 B between its own ranks on lo
    start = {1: {"lo": (0, 0), "eth0": (0, 0)}, 2: {"lo": (0, 0), "eth0": (0, 0)}}
    end = {1: {"lo": (50, 50), "eth0": (0, 300)}, 2: {"lo": (0, 0), "eth0": (300, 0)}}
    out = counters.kernel_bytes(start, end, ranks=4, steps=1)
    # sent + received summed over ranks: 2 x 300 across machines + 2 x 50 inside A
    assert out["bytes_per_rank_per_step"] == pytest.approx((600 + 100) / 4)
    assert out["link_bytes_per_machine_per_step"] == pytest.approx(600 / 2)
    assert out["local_bytes_per_rank_per_step"] == pytest.approx(100 / 4)


@pytest.mark.parametrize("text", ["2x2", "2by2@1Gbit/s", "0x2@1Gbit/s", "2x2@fast"])
def test_bad_network_is_a_config_error(text):
    with pytest.raises(ConfigError):
        bench_comm.parse_network(text)


def test_network_parses():
    assert bench_comm.parse_network("4x2@10Gbit/s") == (4, 2, "10Gbit/s")
