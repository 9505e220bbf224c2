"""The Calibration value: JSON round-trip, the wrong-shape error, defaults, bad files refused."""
from __future__ import annotations

import json

import pytest

from parallax_nb.calibration import DEFAULT_HOROVOD_CYCLE_TIME_MS, Calibration, CollectiveFit, LinkFit
from parallax_nb.errors import ConfigError


def measured() -> Calibration:
    return Calibration(2, 2, {"allreduce/all": CollectiveFit(3e-4, 8e8, samples=4, max_relative_error=0.05),
                              "alltoall/cross": {"latency_s": 5e-4, "bandwidth_bps": 9e8}},
                       compute_time_s={"lm_tiny": 0.012}, baseline_compute_time_s={"lm_tiny": {"horovod": 0.02}},
                       coordination_bytes_per_s=6.7e5,
                       busy_coordination_bytes_per_s=2.3e4, where="emulated 2x2@1Gbit/s",
                       created="2026-11-24T15:00:00Z", horovod_env={"HOROVOD_CYCLE_TIME": "0.1"},
                       link_fits={"alltoall/cross": LinkFit(2400.0, 2.02, points=((256, 2917.0, 28.0),)),
                                  "alltoall/machine": {"overhead_bytes": 800.0, "bytes_per_handed_byte": 0.0}},
                       rank_cores=1, compute_recheck_time_s={"lm_tiny": 0.0125}, call_pricing="in stride")


def test_round_trip_through_json(tmp_path):
    cal = measured()
    path = tmp_path / "calibration.json"
    cal.to_json(str(path))
    back = Calibration.from_json(str(path))
    assert back == cal and back.fits == cal.fits and back.compute_time_s == cal.compute_time_s
    assert back.fit("alltoall", "cross").time_s(9e8 / 8) == pytest.approx(5e-4 + 1.0)
    assert back.fit("allreduce", "machine") == cal.fits["allreduce/all"]   # unmeasured scope: "all"
    assert back.compute_for("lm_tiny") == 0.012 and back.compute_for("other") is None
    assert back.compute_for("lm_tiny", "horovod") == 0.02 and back.baseline_compute_known("lm_tiny")
    assert back.compute_for("lm_tiny", "sparse_as_dense") == 0.012   # not measured: the runtime's
    assert "calibrated on emulated 2x2@1Gbit/s, Horovod cycle 0.1 ms" in back.label
    assert back.horovod_env == {"HOROVOD_CYCLE_TIME": "0.1"} and back.horovod_cycle_time_ms == 0.1
    assert back.rank_cores == 1 and back.compute_recheck_time_s == {"lm_tiny": 0.0125}
    assert back.call_pricing == "in stride" and "Horovod cycle 0.1 ms, small calls in stride, 2026-" in back.label
    assert back.busy_coordination_bytes_per_s == back.step_coordination_bytes_per_s == 2.3e4
    assert back.link_fits == cal.link_fits and back.link_fit("alltoall", "cross").overhead_bytes == 2400.0
    assert back.link_fit("alltoall", "machine").points == () and back.link_fit("allgather") is None
    assert back.payload_framing_factor == pytest.approx(1.01)   # 2.02 / (2 x 1 byte crossing per byte handed)
    # the printed table gives each scope across machines its own payload factor, none inside one
    from parallax_nb.calibrate import fits_table

    lines = {line.split()[0]: line for line in fits_table(back).splitlines() if line.startswith("  ")}
    assert lines["alltoall/cross"].endswith("link bytes per byte handed (payload x1.010)"), lines
    assert lines["alltoall/machine"].endswith("link bytes per byte handed"), lines


def test_a_file_from_before_the_horovod_settings_loads_with_the_stated_defaults():
    """No horovod_env: Horovod's default 1 ms cycle; no busy rate: the idle rate stands in."""
    d = measured().to_dict()
    for key in ("horovod_env", "horovod_cycle_time_ms", "busy_coordination_bytes_per_s", "link_fits",
                "baseline_compute_time_s", "rank_cores", "call_pricing"):
        del d[key]
    old = Calibration.from_json(json.dumps(d))
    assert not old.baseline_compute_known("lm_tiny") and old.compute_for("lm_tiny", "horovod") == 0.012
    assert old.link_fits == {} and old.payload_framing_factor is None   # the assumed framing, no call bytes
    assert old.horovod_env == {} and old.horovod_cycle_time_ms == 1.0 == DEFAULT_HOROVOD_CYCLE_TIME_MS
    assert old.busy_coordination_bytes_per_s is None and old.step_coordination_bytes_per_s == 6.7e5
    assert old.rank_cores is None and old.call_pricing == "chain"   # what every earlier file fitted
    assert "in stride" not in old.label
    # its ranks' cores were not recorded: a run that records its own is told so
    assert "cores per rank than the run (not recorded in the calibration" in old.settings_mismatch(None, 1)


def test_another_cycle_time_in_the_run_is_named():
    cal = measured()
    assert cal.settings_mismatch({"HOROVOD_CYCLE_TIME": "0.1", "PATH": "/bin"}) == ""
    assert cal.settings_mismatch(None) == ""   # the run's settings not known: nothing to say
    text = cal.settings_mismatch({})
    assert "HOROVOD_CYCLE_TIME 0.1 ms in the calibration, 1 ms in the run" in text
    text = cal.settings_mismatch({"HOROVOD_CYCLE_TIME": "0.1", "HOROVOD_CACHE_CAPACITY": "0"})
    assert "HOROVOD_CACHE_CAPACITY unset in the calibration, 0 in the run" in text
    assert Calibration.defaults(2, 2, 1e9, 25e-6).settings_mismatch({}) == ""   # nothing measured
    with pytest.raises(ConfigError, match="HOROVOD_CYCLE_TIME='fast'"):
        Calibration(2, 2, horovod_env={"HOROVOD_CYCLE_TIME": "fast"})
    with pytest.raises(ConfigError, match="horovod_env must map Horovod settings"):
        Calibration(2, 2, horovod_env={"PATH": "/bin"})


def test_other_cores_per_rank_in_the_run_are_named():
    """Ranks bound to one core each compute and wait at other speeds than unbound ones."""
    cal = measured()   # 1 core per rank
    assert cal.settings_mismatch({"HOROVOD_CYCLE_TIME": "0.1"}, 1) == ""
    assert cal.settings_mismatch({"HOROVOD_CYCLE_TIME": "0.1"}, None) == ""   # the run's not known
    text = cal.settings_mismatch({"HOROVOD_CYCLE_TIME": "0.1"}, 2)
    assert text == ("calibrated with other cores per rank than the run (1 in the calibration; 2 in the run): its "
                    "compute and per-call times are not the run's; calibrate again on the run's ranks")
    both = cal.settings_mismatch({}, 2)   # and another cycle time: both named
    assert both.startswith("calibrated under other Horovod settings") and ". Calibrated with other cores" in both
    assert Calibration.defaults(2, 2, 1e9, 25e-6).settings_mismatch({}, 2) == ""   # nothing measured
    for bad in (0, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="rank_cores must be a whole number >= 1"):
            Calibration(2, 2, rank_cores=bad)


def test_wrong_shape_names_both_shapes():
    with pytest.raises(ConfigError) as err:
        measured().check_shape(4, 1)
    text = str(err.value)
    assert "2 machine(s) x 2 rank(s)" in text and "4 machine(s) x 1 rank(s)" in text
    measured().check_shape(2, 2)


def test_compute_that_read_apart_at_the_start_and_the_end_is_named_in_every_estimate():
    """Two compute readings more than 10 % apart: the cores' speed moved while calibrating, and
    the estimates made with the calibration say so, with both figures; within 10 %, or without
    the second reading (files from before it), nothing is said."""
    from parallax_nb.calibrate import fits_table
    from parallax_nb.cost.timing import time_basis_notes
    from parallax_nb.types import Kind, Profile, VariableProfile

    def calibration(first, again):
        return Calibration(1, 2, compute_time_s={"lm_tiny": first},
                           compute_recheck_time_s={} if again is None else {"lm_tiny": again})

    drifted = calibration(0.0369, 0.0472)
    assert drifted.compute_drift("lm_tiny") == ("compute drifted +28 % while calibrating (36.9 ms at the start, "
                                                "47.2 ms at the end): the cores' speed moved, and step times can "
                                                "miss by as much")
    assert calibration(0.0472, 0.0369).compute_drift("lm_tiny").startswith("compute drifted -22 % ")
    assert calibration(0.030, 0.0329).compute_drift("lm_tiny") == ""   # 9.7 %: within
    assert calibration(0.030, None).compute_drift("lm_tiny") == ""
    assert drifted.compute_drift("other") == ""
    layer = VariableProfile("dense/kernel", (4, 4), "float32", 64, Kind.DENSE, 4, 1.0, 1.0, 1.0, 1.0, 64)
    profile = Profile("lm_tiny", batch_size=8, steps=10, step_time_s=0.010, peak_memory_bytes=0, variables=[layer])
    assert drifted.compute_drift("lm_tiny") in time_basis_notes(profile, drifted)
    assert time_basis_notes(profile, calibration(0.030, 0.031)) == ()
    assert "  again at the end: 47.2 ms per step; compute drifted +28 %" in fits_table(drifted)


def test_defaults_are_marked_uncalibrated():
    cal = Calibration.defaults(2, 2, 1e9, 25e-6)
    assert not cal.measured and "uncalibrated" in cal.label
    assert cal.fit("allreduce", "all").bandwidth_bps == 1e9   # 2 x 2: the machine's sum crosses once each way
    assert cal.fit("alltoall", "cross").bandwidth_bps == 1e9 and cal.fit("allgather", "all").bandwidth_bps == 2.5e8
    assert cal.fit("allreduce", "machine").bandwidth_bps > 1e9
    one = Calibration.defaults(1, 4, 1e9, 25e-6)
    assert one.fit("alltoall", "all") == one.fit("alltoall", "machine")


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("machines"), "lacks field 'machines'"),
    (lambda d: d.update(schema="other"), "not a parallax_nb calibration"),
    (lambda d: d.update(schema_version=99), "schema_version 99"),
    (lambda d: d["fits"]["allreduce/all"].update(bandwidth_bps=float("nan")), "bandwidth_bps must be a finite"),
    (lambda d: d["fits"].update({"broadcast/all": {"latency_s": 1, "bandwidth_bps": 1}}), "'broadcast/all'"),
    (lambda d: d["compute_time_s"].update(lm_tiny=-1), "compute_time_s['lm_tiny']"),
    (lambda d: d.update(machines=0), "machines must be a whole number"),
    (lambda d: d.update(rank_cores=-2), "rank_cores must be a whole number >= 1"),
    (lambda d: d.update(call_pricing="fan"), "call_pricing must be one of ('chain', 'in stride'), got 'fan'"),
    (lambda d: d["compute_recheck_time_s"].update(lm_tiny=float("inf")),
     "compute_recheck_time_s['lm_tiny'] must be a finite number > 0, got inf"),
    (lambda d: d.update(compute_recheck_time_s=[0.1]), "compute_recheck_time_s must map a model to seconds"),
    (lambda d: d["link_fits"]["alltoall/cross"].update(overhead_bytes=-5), "link overhead_bytes must be a finite"),
    (lambda d: d["link_fits"].update({"alltoall/world": {"overhead_bytes": 1, "bytes_per_handed_byte": 1}}),
     "link fit 'alltoall/world'"),
    (lambda d: d.update(link_fits=[1, 2]), "'link_fits' must map"),
    (lambda d: d["baseline_compute_time_s"]["lm_tiny"].update(horovod=float("nan")),
     "baseline_compute_time_s['lm_tiny']['horovod'] must be a finite number > 0, got nan"),
    (lambda d: d["baseline_compute_time_s"]["lm_tiny"].update(tf_ps=0.1), "names ['tf_ps'], not a Horovod baseline"),
    (lambda d: d.update(baseline_compute_time_s={"lm_tiny": 0.1}), "must map a model to {baseline: seconds}"),
])
def test_bad_files_are_refused_with_the_value(change, words):
    d = json.loads(measured().to_json())
    change(d)
    with pytest.raises(ConfigError, match=None) as err:
        Calibration.from_dict(d)
    assert words in str(err.value)


def test_fit_recovers_latency_and_bandwidth_and_keeps_the_points():
    from parallax_nb.calibration import fit_collective

    sizes = [4096, 65536, 1 << 20, 4 << 20]
    times = [2e-4 + b * 8 / 5e9 for b in sizes]
    fit = fit_collective(sizes, times)
    assert fit.latency_s == pytest.approx(2e-4) and fit.bandwidth_bps == pytest.approx(5e9)
    assert fit.samples == 4 and fit.max_relative_error < 1e-9
    assert [b for b, _ in fit.points] == sizes
    noisy = fit_collective(sizes, [t * f for t, f in zip(times, (1.2, 0.9, 1.1, 1.0))])
    assert 0.05 < noisy.max_relative_error < 0.5
    back = Calibration.from_json(Calibration(1, 2, {"alltoall/all": noisy}).to_json())
    assert back.fits["alltoall/all"] == noisy


def test_fit_never_gives_a_negative_latency():
    from parallax_nb.calibration import fit_collective

    fit = fit_collective([1000, 2000, 4000], [1e-6, 2.5e-6, 5.5e-6])   # a line below the origin
    assert fit.latency_s == 0.0 and fit.bandwidth_bps > 0
    flat = fit_collective([1000, 1e6], [1e-3, 0.9e-3])                  # no growth with size: noise only
    assert flat.latency_s > 0 and flat.time_s(1e6) < 1.02 * flat.latency_s
    with pytest.raises(ConfigError, match="2 distinct sizes"):
        fit_collective([1000, 1000], [1e-3, 2e-3])


def test_link_fit_takes_the_slope_from_the_largest_calls_and_the_overhead_from_the_smallest():
    """Link bytes per call: overhead + slope x bytes handed. The slope through the two largest
    sizes; the overhead what it leaves at the smallest, where a small call's other algorithm
    (here 2x the payload at 4 KiB, as Open MPI's recursive doubling) and a large call's
    counter noise cannot move it."""
    from parallax_nb.calibration import fit_link

    sizes = [256, 4096, 65536, 1 << 20, 4 << 20]
    link = [2400 + 2.0 * b for b in sizes]
    link[1] += 2.0 * 4096
    fit = fit_link([(b, v, 3.0) for b, v in zip(sizes, link)])
    assert fit.bytes_per_handed_byte == pytest.approx(2.0) and fit.overhead_bytes == pytest.approx(2400.0)
    assert fit.framing_factor("alltoall", "all", 2, 2) == pytest.approx(1.0)   # 2 x 2 ranks: 2 bytes cross per byte
    assert [p[0] for p in fit.points] == sizes and fit.points[0][2] == 3.0
    assert fit_link([(256, 100.0), (1 << 20, 90.0)]).bytes_per_handed_byte == 0.0   # shrinking: noise, not a slope
    assert fit_link([(256, 10.0), (1 << 20, 3e6)]).overhead_bytes == 0.0             # never below 0
    with pytest.raises(ConfigError, match="2 distinct sizes"):
        fit_link([(256, 100.0, 1.0)])
    with pytest.raises(ConfigError, match="finite link bytes"):
        fit_link([(256, float("nan")), (4096, 1.0)])


def test_the_links_pace_is_read_from_the_largest_calls_that_cross_machines():
    """Per op and scope across machines: the largest timed call's link bytes, halved (received
    + sent), over its time; the median over them. Inside a machine, on one machine, and
    without link points there is no pace."""
    from parallax_nb.calibration import fit_link

    def fitted(largest_link_bytes, largest_s):
        timed = CollectiveFit(1e-3, 1e8, points=((256, 1e-3), (4 << 20, largest_s)))
        return timed, fit_link([(256, 3000.0, 4.0), (4 << 20, largest_link_bytes, 3000.0)])

    # each way: 8 MiB in 0.5 s (16,777,216 B/s), 4 MiB in 0.5 s (8,388,608), 6 MiB in 0.25 s (25,165,824)
    keys = {"alltoall/cross": fitted(16 << 20, 0.5), "allreduce/all": fitted(8 << 20, 0.5),
            "allgather/all": fitted(12 << 20, 0.25), "alltoall/machine": fitted(1 << 30, 0.001)}
    cal = Calibration(2, 2, {k: t for k, (t, _) in keys.items()}, link_fits={k: f for k, (_, f) in keys.items()})
    assert cal.link_bytes_per_s == pytest.approx(16777216.0)
    assert Calibration(1, 2, {k: t for k, (t, _) in keys.items()}).link_bytes_per_s is None
    no_points = {k: CollectiveFit(1e-3, 1e8) for k in keys}
    assert Calibration(2, 2, no_points, link_fits={k: f for k, (_, f) in keys.items()}).link_bytes_per_s is None
    assert measured().link_bytes_per_s is None   # its fits keep no timed calls
    back = Calibration.from_json(cal.to_json())
    assert back.link_bytes_per_s == pytest.approx(16777216.0)


def test_a_known_links_pace_gives_a_calibration_that_reads_it():
    """``with_link_pace``: the calls across machines read at the pace given, those inside a
    machine and every fit's latency and bandwidth as they were; one machine unchanged; a pace
    that is not a positive number refused with the value."""
    cal = Calibration.defaults(2, 2, 1e9, 25e-6)
    paced = cal.with_link_pace(5e7, overhead_bytes=2400.0)
    assert cal.link_bytes_per_s is None and paced.link_bytes_per_s == pytest.approx(5e7)
    assert paced.fits["alltoall/machine"] == cal.fits["alltoall/machine"]
    assert {k: (f.latency_s, f.bandwidth_bps) for k, f in paced.fits.items()} == \
        {k: (f.latency_s, f.bandwidth_bps) for k, f in cal.fits.items()}
    assert paced.link_fit("alltoall", "cross").overhead_bytes == pytest.approx(2400.0)
    one = Calibration.defaults(1, 2, 1e9, 25e-6)
    assert one.with_link_pace(5e7) is one
    for bad in (0, -1.0, float("nan"), "fast"):
        with pytest.raises(ConfigError, match="positive number of bytes per second"):
            cal.with_link_pace(bad)


def test_combine_fits_the_machines_mean_link_per_call():
    """px.calibrate's combine: per op and scope, the mean over the machines' link readings at
    each size (the other ranks read none), then fit_link; one host gives none."""
    from parallax_nb.calibrate import combine

    def rank(r, link):
        return {"rank": r, "machines": 2, "workers_per_machine": 1, "compute": None, "link": None,
                "busy_link": None, "collectives": {"alltoall/all": [(256, 1e-3), (1 << 20, 9e-3)]},
                "stride": {"alltoall/all": [(256, 0.8e-3)]}, "host": f"host{r}", "cores": [0],
                "link_per_call": {"alltoall/all": link} if link else {}}

    cal = combine([rank(0, [(256, 2000.0, 9.0), (1 << 20, 2_100_000.0, 90.0)]),
                   rank(1, [(256, 3000.0, 11.0), (1 << 20, 2_200_000.0, 110.0)])], "here")
    fit = cal.link_fit("alltoall")
    assert fit.points == ((256.0, 2500.0, 10.0), (float(1 << 20), 2_150_000.0, 100.0))
    assert fit.overhead_bytes == pytest.approx(2500.0 - 256 * fit.bytes_per_handed_byte)
    one_host = combine([dict(rank(0, None), machines=1, workers_per_machine=2)], "loopback")
    assert one_host.link_fits == {}


def _stride_rank(r, host, cores, chain_s, stride_s):
    """One rank's figures for combine: alltoall at 256 B (a chain's mean ``chain_s``, in stride
    ``stride_s``) and at 4 MiB (no stride: a call that size outlasts a chain's start)."""
    return {"rank": r, "machines": 1, "workers_per_machine": 2, "compute": None, "link": None,
            "busy_link": None, "link_per_call": {}, "host": host, "cores": cores,
            "collectives": {"alltoall/all": [(256, chain_s), (4 << 20, 5e-3)]},
            "stride": {"alltoall/all": [(256, stride_s)]}}


def test_combine_prices_small_calls_in_stride_only_where_every_rank_had_a_core():
    """Each rank with a core of its own (per host, by boot id): the slowest rank's stride at
    256 B, the chain's mean from 1 MiB on; ranks that share cores: the chain's mean everywhere;
    a stride below STRIDE_FLOOR of the chain's mean (noise between two medians) is raised to it."""
    from parallax_nb.calibrate import STRIDE_FLOOR, combine, fits_table

    own = combine([_stride_rank(0, "a", [0], 3e-4, 2.0e-4), _stride_rank(1, "a", [1], 3.2e-4, 2.2e-4)], "here")
    assert own.call_pricing == "in stride"
    assert own.fits["alltoall/all"].points == ((256.0, 2.2e-4), (float(4 << 20), 5e-3))
    assert "priced in stride" in fits_table(own)
    # unbound ranks that may each use both cores: two ranks, two cores, a core each
    unbound = combine([_stride_rank(0, "a", [0, 1], 3e-4, 2e-4), _stride_rank(1, "a", [0, 1], 3e-4, 2e-4)], "x")
    assert unbound.call_pricing == "in stride"
    # two emulated machines on one host of 2 cores, 4 ranks bound two to a core: shared
    shared = [_stride_rank(r, "a", [r % 2], 3e-4 + 1e-5 * r, 2e-4) for r in range(4)]
    chain = combine(shared, "emulated")
    assert chain.call_pricing == "chain" and chain.fits["alltoall/all"].points[0] == (256.0, 3.3e-4)
    assert "short chain's mean" in fits_table(chain)
    # two real hosts of one core each, one rank on each: a core each, whatever the core ids
    two_hosts = combine([_stride_rank(0, "a", [0], 3e-4, 2e-4), _stride_rank(1, "b", [0], 3e-4, 2e-4)], "hosts")
    assert two_hosts.call_pricing == "in stride"
    noisy = combine([_stride_rank(0, "a", [0], 4e-4, -1e-5), _stride_rank(1, "a", [1], 4e-4, 1e-5)], "here")
    assert noisy.fits["alltoall/all"].points[0] == (256.0, STRIDE_FLOOR * 4e-4)


def test_calibrating_engines_refuses_what_does_not_apply_to_them():
    import parallax_nb as px
    from parallax_nb.cluster import Cluster

    with pytest.raises(ConfigError, match="needs a px.Cluster, got str"):
        px.calibrate(cluster="engines")
    stopped = Cluster(n=2)
    with pytest.raises(ConfigError, match="np, env do\\(es\\) not apply"):
        px.calibrate(cluster=stopped, np=2, env={"HOROVOD_CYCLE_TIME": "0.1"})
    with pytest.raises(ConfigError, match="needs a started cluster"):
        px.calibrate(cluster=stopped)
    assert not stopped.running   # refused before anything started


def _calibrate_cli(capsys, *argv):
    from parallax_nb.__main__ import main

    code = main(["calibrate", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (("--np", "0"), "number of ranks must be a whole number >= 1, got 0"),
    (("--np", "2", "--hostfile", "/nonexistent/hosts.txt"), "hostfile '/nonexistent/hosts.txt' does not exist"),
    (("--emulate", "2by2@1Gbit/s"), "cannot read the emulated network '2by2@1Gbit/s'"),
    (("--emulate", "2x2@fast"), "fast"),
    (("--emulate", "0x2@1Gbit/s"), "machines must be a whole number >= 1, got 0"),
    (("--emulate", "2x2@1Gbit/s", "--np", "3"), "has 4 ranks but np=3"),
    (("--emulate", "2x2@1Gbit/s", "--hostfile", __file__), "not both"),
    (("--np", "4", "--workers-per-machine", "3"), "workers_per_machine must be a whole number >= 1 that divides np=4"),
    (("--np", "2", "--job", "no_such_module_px:job"), "no_such_module_px"),
    (("--np", "2", "--env", "HOROVOD_CYCLE_TIME"), "--env 'HOROVOD_CYCLE_TIME' is not NAME=VALUE"),
    (("--np", "2", "--env", "HOROVOD_CYCLE_TIME=fast"), "HOROVOD_CYCLE_TIME='fast' is not a number of milliseconds"),
    (("--np", "2", "--timeout", "-3"), "--timeout must be a positive number of seconds, got -3"),
    (("--np", "2", "--timeout", "nan"), "--timeout must be a positive number of seconds, got nan"),
])
def test_cli_refuses_bad_input_before_anything_starts(capsys, tmp_path, argv, words):
    out = tmp_path / "calibration.json"
    code, err = _calibrate_cli(capsys, *argv, "-o", str(out))
    assert code == 2 and words in err and "parallax_nb calibrate: error:" in err, err
    assert not out.exists()


@pytest.mark.parametrize("step_s, steps", [(0.004, (50, 125)), (0.15, (5, 5))])
def test_compute_is_timed_for_half_a_second_unless_five_steps_take_longer(step_s, steps):
    """The rank side's compute timing (``runtime.calibrate._timed_steps``): short steps are
    timed until they have lasted COMPUTE_MIN_S (5 steps of a 1 ms step read 15-40 % long), long
    ones 5 times. ``step`` sleeps; ``hvd`` answers only the rank numbers (no launch here); every
    timed step takes the next batch, and the taking is timed with it."""
    import itertools
    import time
    from types import SimpleNamespace

    from parallax_nb.runtime import calibrate as rank_side

    seen = []

    def step(x, y):
        seen.append(x)
        time.sleep(step_s)
        return 0.0

    def batches():
        for i in itertools.count():
            time.sleep(step_s / 2)   # a batch that takes half a step to make
            yield i, i

    job = SimpleNamespace(dataset=lambda rank, ranks: batches())
    hvd = SimpleNamespace(rank=lambda: 0, size=lambda: 1, local_rank=lambda: 0, local_size=lambda: 1)
    times, link = rank_side._timed_steps(step, job, hvd, lambda tag: None, 2, rank_side.COMPUTE_STEPS, None, "t")
    assert link is None
    assert steps[0] <= len(times) <= steps[1], len(times)
    assert sum(times) >= rank_side.COMPUTE_MIN_S or len(times) == rank_side.COMPUTE_MAX_STEPS
    assert sum(times[:-1]) < rank_side.COMPUTE_MIN_S or len(times) == rank_side.COMPUTE_STEPS
    assert seen == list(range(2 + len(times)))   # 2 untimed, then a new batch for every timed step
    assert min(times) >= 1.5 * step_s   # the batch's making counted with its step
