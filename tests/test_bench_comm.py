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


def test_repeated_invocations_keep_rank_counts_apart(monkeypatch):
    """2 and 4 ranks of one workload on loopback are two settings: their medians and ratios are
    never pooled (they once were, which reported the CNN's 2-rank ratio over 6 runs of both)."""
    import repeats

    monkeypatch.setattr(repeats.report, "_row", lambda s, name: {"steps_per_s": s["steps"][name]})

    def setting(ranks, horovod, ar):
        return {"workload": "cnn", "ranks": ranks, "network": "loopback", "configs": {"horovod": {}, "ar": {}},
                "steps": {"horovod": horovod, "ar": ar}}

    runs = [{"settings": [setting(2, 40.0, 44.0), setting(4, 20.0, 19.0)]},
            {"settings": [setting(2, 38.0, 38.0), setting(4, 18.0, 18.9)]},
            {"settings": [setting(2, 42.0, 46.2), setting(4, 19.0, 20.9)]}]
    summary = {(s["ranks"], s["network"]): s for s in repeats.summarise(runs)}
    assert sorted(summary) == [(2, "loopback"), (4, "loopback")]
    two = {c["config"]: c for c in summary[2, "loopback"]["configs"]}
    four = {c["config"]: c for c in summary[4, "loopback"]["configs"]}
    assert two["ar"]["vs_horovod"] == dict(median=1.1, min=1.0, max=1.1, runs=3)
    assert four["ar"]["vs_horovod"]["median"] == pytest.approx(1.05) and four["ar"]["vs_horovod"]["runs"] == 3
    assert four["horovod"]["steps_per_s"] == dict(median=19.0, min=18.0, max=20.0, runs=3)


def test_bench_predict_gives_the_launch_every_option_it_reads():
    """``bench_predict`` runs its settings through ``bench_comm.run_setting`` with its own
    parsed options: every ``args.NAME`` that run_setting reads must be among them (a new
    ``--bind-cores`` once crashed every bench_predict setting before its first launch)."""
    import inspect
    import re

    import bench_predict

    read = set(re.findall(r"\bargs\.(\w+)", inspect.getsource(bench_comm.run_setting)))
    assert read >= {"bind_cores", "steps", "timeout"}, read
    parsed = vars(bench_predict.make_parser().parse_args([]))
    assert read <= set(parsed), sorted(read - set(parsed))


def test_bench_predict_reprices_a_configuration_with_the_compute_timed_in_its_launch():
    """The diagnostic beside each prediction: the same calibration with only that
    configuration's compute replaced by the figure timed in its launch (the runtime's for
    parallax plans, the baseline's own for plain Horovod), and the row's error against it."""
    import bench_predict

    from parallax_nb.calibration import Calibration
    from parallax_nb.types import PLAIN_HOROVOD, SPARSE_AS_DENSE

    calibration = Calibration(1, 2, compute_time_s={"m": 0.030, "other": 0.010},
                              baseline_compute_time_s={"m": {PLAIN_HOROVOD: 0.050, SPARSE_AS_DENSE: 0.200}})
    ar = bench_predict.with_launch_compute(calibration, "m", "ar", 0.040)
    assert (ar.compute_for("m"), ar.compute_for("m", PLAIN_HOROVOD), ar.compute_for("other")) == (0.040, 0.050, 0.010)
    horovod = bench_predict.with_launch_compute(calibration, "m", "horovod", 0.070)
    assert horovod.compute_for("m") == 0.030
    assert (horovod.compute_for("m", PLAIN_HOROVOD), horovod.compute_for("m", SPARSE_AS_DENSE)) == (0.070, 0.200)
    assert calibration.compute_for("m") == 0.030 and calibration.compute_for("m", PLAIN_HOROVOD) == 0.050

    prediction = {"ar": {"step_time_s": 0.040, "link": {"total_bytes": 1000.0}}}
    run = {"configs": {"ar": {"windows": [{"steps_per_s": 20.0, "kernel_bytes_per_rank_per_step": 1000.0}] * 3}}}
    control = {"ar": {"calibrated_compute_s": 0.030, "launch_compute_s": 0.040, "predicted_with_launch_compute_s": 0.050}}
    row = bench_predict.compare_setting(prediction, run, False, control)["rows"]["ar"]
    assert row["step_time_error_pct"] == pytest.approx(25.0)
    assert row["step_time_error_with_launch_compute_pct"] == pytest.approx(0.0)
    assert "| 30.0 / 40.0 | +0.0 % |" in bench_predict.markdown(
        {"settings": [{"workload": "m", "network": "loop2", "calibration": "c",
                       "comparison": {"rows": {"ar": row}, "auto": None}}]})
    assert "launch_compute_s" not in bench_predict.compare_setting(prediction, run, False)["rows"]["ar"]
