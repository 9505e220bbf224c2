"""Open MPI's allgatherv algorithms and what of them crosses a machine's link
(parallax_nb.allgatherv), and plain Horovod's link bytes through them. Pure Python.

The figures the calibrations measured on the emulated networks (link bytes per byte a rank
hands to an allgatherv, both directions of one machine's link, the per-call overhead taken
out): 2 x 2 ranks 6.13 at 4 KiB, 9.38 at 64 KiB, 7.36-7.78 at 1-4 MiB (2026-11-28); 4 x 2
ranks 25.40-26.51 at 256 B-4 MiB (2026-11-26). Direct sends say 8 and 24 at every size."""
import pytest

from parallax_nb.allgatherv import (BRUCK, DIRECT, GATHER_BCAST, NEIGHBOUR, RING, algorithm, crossing_slices,
                                    direct_slices, messages)
from parallax_nb.calibration import Calibration, LinkFit, link_factor
from parallax_nb.cost import variable_cost
from parallax_nb.cost.pricing import variable_costs
from parallax_nb.types import PLAIN_HOROVOD, ClusterSpec, Kind, Profile, VariableProfile


@pytest.mark.parametrize("ranks", [3, 4, 5, 6, 8, 12, 16, 17])
def test_every_algorithm_brings_each_rank_every_other_slice_once(ranks):
    """Counted message by message: every rank sends and receives W - 1 slices (the gather and
    broadcast sends the whole result down a tree instead; the neighbour exchange needs an even W)."""
    for name in (DIRECT, RING, BRUCK, NEIGHBOUR):
        if name == NEIGHBOUR and ranks % 2:
            continue
        received, sent = [0] * ranks, [0] * ranks
        for s, r, n in messages(name, ranks):
            assert s != r, (name, s)
            sent[s] += n
            received[r] += n
        assert received == [ranks - 1] * ranks and sent == [ranks - 1] * ranks, (name, received, sent)
    gathered = messages(GATHER_BCAST, ranks)
    assert sum(n for s, r, n in gathered if r == 0) == ranks - 1          # the gather to rank 0
    assert all(sum(n for s, r, n in gathered if r == rank) == ranks for rank in range(1, ranks))   # the whole result


def test_open_mpi_picks_by_ranks_and_size():
    assert algorithm(2, 10 << 20) == DIRECT
    assert [algorithm(4, b) for b in (100, 256, 4096, 8192, 16384, 65536, 262144)] == [
        GATHER_BCAST, NEIGHBOUR, RING, NEIGHBOUR, BRUCK, BRUCK, NEIGHBOUR]
    assert algorithm(5, 300) == RING              # the neighbour exchange of an odd count is a ring
    assert [algorithm(8, b) for b in (1000, 1024, 4 << 20)] == [GATHER_BCAST, BRUCK, BRUCK]
    assert [algorithm(48, b) for b in (100, 4096, 8192)] == [GATHER_BCAST, BRUCK, RING]


def test_what_crosses_a_machine_is_what_the_calibrations_measured():
    """One way per machine, slices of one rank: 2 x 2 ranks 3 (ring, 4 KiB), 5 (Bruck, 64 KiB)
    and 4 (neighbour exchange, 4 MiB), against the measured 6.13 / 2, 9.38 / 2 and 7.78 / 2;
    4 x 2 ranks 13 by Bruck from 1 KiB on (measured 25.40-26.51 / 2); direct sends 4 and 12."""
    assert [crossing_slices(4, 2, b) for b in (4096, 65536, 4 << 20)] == [3.0, 5.0, 4.0]
    assert direct_slices(4, 2) == 4.0 and direct_slices(8, 2) == 12.0
    assert crossing_slices(8, 2, 4 << 20) == 13.0
    # a ring relays each slice into a machine once: 8 x 6 ranks carry 47 slices, not 6 x 42
    assert crossing_slices(48, 6, 4 << 20) == 47.0 and direct_slices(48, 6) == 252.0
    # one rank per machine: every algorithm but the gather and broadcast moves W - 1 slices
    assert [crossing_slices(8, 1, b) for b in (2048, 4 << 20)] == [7.0, 7.0]
    assert crossing_slices(4, 4, 4096) == 0.0                  # one machine: nothing crosses
    with pytest.raises(ValueError, match="do not fill machines"):
        crossing_slices(5, 2, 4096)
    # the link factor a calibration divides by: size-aware for allgather, direct without a size
    assert link_factor("allgather", "all", 2, 2, 65536) == 5.0 and link_factor("allgather", "all", 2, 2) == 4.0
    assert link_factor("allgather", "cross", 4, 2, 4096) == 2 * 3.0


def _table(name: str, rows: int, width: int, lookups: int) -> VariableProfile:
    """A float32 table whose gradient is ``lookups`` rows and their int64 ids a step."""
    touched = float(lookups)
    return VariableProfile(name=name, shape=(rows, width), dtype="float32", size_bytes=rows * width * 4,
                           kind=Kind.SPARSE, rows_touched_mean=touched, alpha_mean=touched / rows,
                           alpha_p50=touched / rows, alpha_p95=touched / rows, alpha_max=touched / rows,
                           grad_bytes_per_step=touched * (width * 4 + 8), union_rows_by_workers=(touched,))


def test_plain_horovods_allgathers_are_priced_at_their_fused_size():
    """The recommender's shape on 2 x 2 ranks: four tables, 64 lookups of 32-float rows each
    a step (8,192 B of values and 512 B of ids per rank). Horovod fuses the four tables' values
    into one allgather of 32 KiB a rank, which Open MPI runs by Bruck's algorithm: 10 slices a
    machine both ways, not the 8 of a neighbour exchange at 8 KiB. The ids' 2 KiB call is a
    neighbour exchange either way. Per table: 2·5·8,192 + 2·4·512 = 86,016 B (alone: 69,632)."""
    tables = tuple(_table(f"table_{i}", 1000 * (i + 1), 32, 64) for i in range(4))
    profile = Profile("recommender-shaped", 64, 10, 0.002, 0, tables)
    cluster = ClusterSpec.create(2, 2, "1Gbit/s")
    fused = [c.cost_of(PLAIN_HOROVOD) for c in variable_costs(profile, cluster)]
    assert [c.bytes_per_step for c in fused] == [86_016.0] * 4
    assert [c.index_bytes_per_step for c in fused] == [4_096.0] * 4
    alone = variable_cost(tables[0], cluster).cost_of(PLAIN_HOROVOD)
    assert alone.bytes_per_step == 69_632.0
    # the calls stay listed per table, as the program issues them: 8 allgathers and their bytes
    assert all(c.collectives[0].count == 2 and c.collectives[0].handed_bytes == 8_704.0 for c in fused)
    # parallax_nb's AR without local aggregation sends the four tables' deduplicated rows (64
    # distinct here) with their ids in one allgather of 34 KiB a rank: Bruck's algorithm for
    # values and ids alike, 2·5·(8,192 + 512) = 87,040 B a table
    flat = cluster.replace(local_aggregation=False)
    assert [c.cost_of("ar").bytes_per_step for c in variable_costs(profile, flat)] == [87_040.0] * 4
    assert variable_cost(tables[0], flat).cost_of("ar").bytes_per_step == 69_632.0


def test_a_calibrations_framing_divides_by_the_algorithm_of_its_largest_sizes():
    """The allgatherv's slope is measured between the two largest sizes (4 x 2 ranks: 25.46
    link bytes per byte handed at 1-4 MiB). Bruck moves 2 x 13 there, so the framing is x0.979,
    not the x1.061 that dividing by direct sends' 2 x 12 made of it."""
    fit = LinkFit(2200.0, 25.46, points=((256.0, 8800.0, 20.0), (1 << 20, 2.67e7, 900.0), (4 << 20, 1.07e8, 3500.0)))
    assert fit.framing_factor("allgather", "all", 4, 2) == pytest.approx(25.46 / 26)
    assert LinkFit(2200.0, 25.46).framing_factor("allgather", "all", 4, 2) == pytest.approx(25.46 / 24)
    calibration = Calibration(4, 2, where="here", link_fits={"allgather/all": fit})
    assert calibration.link_framing("allgather") == pytest.approx(0.979, abs=1e-3)


def test_uncalibrated_allgather_bandwidth_follows_the_large_calls_algorithm():
    """Without a calibration an allgather's bandwidth is the link's over what Open MPI's
    algorithm for 4 MiB calls moves across per handed byte: on 8 x 6 ranks a ring's 47, where
    direct sends' 252 made plain Horovod's allgathers 5.4 times slower."""
    fit = Calibration.defaults(8, 6, 100e9, 25e-6).fit("allgather", "all")
    assert fit.bandwidth_bps == pytest.approx(100e9 / 47)
