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


def test_bench_predict_reads_one_machine_of_ranks_apart_from_a_machine_per_rank():
    """``1x4`` is one machine of 4 ranks on loopback (local aggregation planned and run,
    calibrated as one machine, nothing crosses a link: no link row); ``loop4`` is 4 ranks each
    taken as a machine; a shape it cannot read names the value and both spellings."""
    import bench_predict

    one = bench_predict.parse_setting_network("1x4")
    per_rank = bench_predict.parse_setting_network("loop4")
    assert one == (1, 4, None, True) and per_rank == (1, 4, None, False)
    assert bench_predict.parse_setting_network("2x2@1Gbit/s") == (2, 2, "1Gbit/s", False)
    cluster = bench_predict.model_cluster(one)
    assert (cluster.machines, cluster.workers_per_machine, cluster.local_aggregation) == (1, 4, True)
    cluster = bench_predict.model_cluster(per_rank)
    assert (cluster.machines, cluster.workers_per_machine) == (4, 1)
    for text in ("1x", "1xfour", "loop0"):
        with pytest.raises(ConfigError, match="1xN") as e:
            bench_predict.parse_setting_network(text)
        assert repr(text) in str(e.value)

    prediction = {"ar": {"step_time_s": 0.002, "link": {"total_bytes": None}}}
    run = {"configs": {"ar": {"windows": [{"steps_per_s": 400.0, "kernel_bytes_per_rank_per_step": 9e4}] * 3}}}
    row = bench_predict.compare_setting(prediction, run, None)["rows"]["ar"]
    assert row["step_time_error_pct"] == pytest.approx(25.0)
    assert (row["measured_link_bytes"], row["link_error_pct"]) == (None, None)


def test_bench_predict_keeps_the_settings_it_finished_when_it_is_stopped(tmp_path, monkeypatch):
    """A calibrated grid runs for most of an hour here: an invocation stopped in its second
    setting leaves a JSON of the first, marked incomplete, and predict_repeats names it as
    stopped; an invocation that finishes is marked complete."""
    import json

    import bench_predict
    import predict_repeats

    done = []

    def run_one(args, name, spec, profile, network, workdir):
        if done:
            raise KeyboardInterrupt
        done.append(network)
        return {"workload": name, "network": network, "comparison": {"rows": {}, "auto": None}}

    monkeypatch.setattr(bench_predict, "run_one", run_one)
    monkeypatch.setattr(bench_comm, "profile_workload", lambda spec, workdir, steps: None)
    monkeypatch.setattr(bench_predict.os, "geteuid", lambda: 0)
    out = tmp_path / "p.json"
    argv = ["--workloads", "recommender", "--networks", "loop2", "1x2", "--json", str(out), "--workdir", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        bench_predict.main(argv)
    doc = json.loads(out.read_text())
    assert (doc["complete"], doc["settings_planned"], [s["network"] for s in doc["settings"]]) == (False, 2, ["loop2"])
    assert predict_repeats.stopped(doc) == "; stopped after 1 of 2 settings"

    done.clear()
    assert bench_predict.main(argv[:4] + argv[5:]) == 0   # loop2 alone
    doc = json.loads(out.read_text())
    assert doc["complete"] and len(doc["settings"]) == 1 and predict_repeats.stopped(doc) == ""


def test_predict_repeats_judges_issue_14s_targets_over_every_reading_of_every_invocation():
    """Two invocations of one setting: a configuration that ran another's program is counted
    once, a failed one not at all; each row's errors are the median and range over invocations;
    the targets are judged over every reading (and the error with the launch's compute apart)."""
    import predict_repeats

    def row(step, link, launch=None, same_as=None, error=None):
        out = {"step_time_error_pct": step, "link_error_pct": link, "same_as": same_as, "error": error}
        if launch is not None:
            out["step_time_error_with_launch_compute_pct"] = launch
        return out

    def doc(ar, ps, auto_ok):
        rows = {"ar": ar, "ps": ps, "hybrid": row(None, None, same_as="ar"), "horovod": row(None, None, error="hung")}
        return {"schema": "parallax_nb.bench_predict", "machine": "m", "finished_utc": "t", "command": "c",
                "wall_s": 1.0, "settings": [{"workload": "lm", "network": "loop2", "comparison": {
                    "rows": rows, "auto": {"ok": auto_ok, "fastest": "ar", "auto_behind_pct": 0.0}}}]}

    docs = [doc(row(-10.0, 1.0, launch=2.0), row(20.0, 4.0, launch=-4.0), True),
            doc(row(12.0, -2.0, launch=8.0), row(-40.0, 6.0, launch=1.0), False)]
    summary = predict_repeats.summarise(docs)
    rows = {r["config"]: r for r in summary["rows"]}
    assert sorted(rows) == ["ar", "ps"]
    assert rows["ps"]["step_time_error_pct"] == dict(median=-10.0, min=-40.0, max=20.0, runs=2)
    assert rows["ar"]["link_error_pct"] == dict(median=-0.5, min=-2.0, max=1.0, runs=2)
    targets = {t["target"].split(":")[0]: t for t in summary["targets"]}
    step = targets["step error"]
    assert step["status"] == "MISSED" and step["text"] == "median 16.0 %, largest 40.0 % over 4 readings"
    launch = targets["step error with the launch's compute"]
    assert launch["status"] == "MET" and launch["text"] == "median 3.0 %, largest 8.0 % over 4 readings"
    link = targets["link bytes within 5 % in every reading"]
    assert link["status"] == "MISSED" and link["text"] == "3 of 4 readings within; outside: lm loop2 ps"
    auto = next(t for t in summary["targets"] if t["target"].startswith("AUTO"))
    assert auto["status"] == "MISSED" and auto["text"] == "1 of 2"
    table = predict_repeats.render(summary, docs)
    assert "| lm | loop2 | ps | -10.0 % (-40.0 to +20.0) | -1.5 % (-4.0 to +1.0) | +5.0 % (+4.0 to +6.0) |" in table


def test_auto_is_judged_against_every_configuration_and_beside_that_against_parallax_plans():
    """Plain Horovod ran fastest: AUTO 10 % behind it misses issue 14's target, but AUTO ran the
    fastest of parallax_nb's plans, which the verdict and predict_repeats say beside it; a row
    that failed or ran no window is not a candidate."""
    import predict_repeats

    def rows(**ms):
        out = {c: {"measured_step_time_s": t / 1e3} for c, t in ms.items()}
        out["sparse_as_dense"] = {"measured_step_time_s": None, "error": "hung"}
        return out

    behind = predict_repeats.auto_verdict(rows(ar=12.0, ps=20.0, auto=11.0, horovod=10.0))
    assert behind["fastest"] == "horovod" and behind["auto_behind_pct"] == pytest.approx(10.0) and not behind["ok"]
    assert behind["plan_fastest"] == "auto" and behind["plan_auto_behind_pct"] == 0.0 and behind["plan_ok"]
    slow_plan = predict_repeats.auto_verdict(rows(ar=10.0, auto=11.0, horovod=12.0))
    assert slow_plan["fastest"] == slow_plan["plan_fastest"] == "ar" and not slow_plan["plan_ok"]
    assert predict_repeats.auto_verdict(rows(auto=11.0)) is None

    def doc(workload, r):
        return {"schema": "parallax_nb.bench_predict", "machine": "m", "finished_utc": "t", "command": "c",
                "wall_s": 1.0, "settings": [{"workload": workload, "network": "2x2@1Gbit/s", "comparison": {
                    "rows": r, "auto": predict_repeats.auto_verdict(r)}}]}

    docs = [doc("recommender", rows(ar=12.0, auto=11.0, horovod=10.0)), doc("lm", rows(ar=10.0, auto=11.0))]
    summary = predict_repeats.summarise(docs)
    auto = next(t for t in summary["targets"] if t["target"].startswith("AUTO"))
    assert auto["status"] == "MISSED" and auto["text"] == "0 of 2"
    assert summary["beside"] == [{"reading": "AUTO within 5 % of the fastest of parallax_nb's plans (AR, PS, HYBRID)",
                                  "text": "1 of 2; plain Horovod's program ran faster in recommender 2x2@1Gbit/s"}]
    assert "beside them: AUTO within 5 % of the fastest of parallax_nb's plans" in predict_repeats.render(summary, docs)


def test_predict_repeats_says_how_far_each_calibrations_compute_moved_between_its_two_timings():
    """Beside the targets: per calibration, the compute timed at its start and at its end (the
    host's own drift); a calibration without the second timing is not counted."""
    import predict_repeats

    def setting(first_s, again_s):
        figures = {"compute_time_s": {"lm-small": first_s}}
        if again_s is not None:
            figures["compute_recheck_time_s"] = {"lm-small": again_s}
        return {"workload": "lm", "network": "loop2", "calibration_figures": figures,
                "comparison": {"rows": {"ar": {"step_time_error_pct": 1.0, "link_error_pct": 0.0}}}}

    docs = [{"schema": "parallax_nb.bench_predict", "machine": "m", "finished_utc": "t", "command": "c", "wall_s": 1.0,
             "settings": [setting(0.010, 0.014), setting(0.020, None)]},
            {"schema": "parallax_nb.bench_predict", "machine": "m", "finished_utc": "t", "command": "c", "wall_s": 1.0,
             "settings": [setting(0.010, 0.009)]}]
    assert predict_repeats.compute_drifts(docs) == pytest.approx([40.0, -10.0])
    summary = predict_repeats.summarise(docs)
    assert summary["beside"] == [{"reading": "the host's speed: each calibration's compute, timed at its start "
                                             "and again at its end",
                                  "text": "25.0 % apart on the median, largest 40.0 %, more than 30 % in 1 of 2 "
                                          "calibrations"}]
    assert "beside them: the host's speed" in predict_repeats.render(summary, docs)
    assert predict_repeats.drift_reading([{"settings": [setting(0.010, None)]}]) == []


def test_interleaved_rounds_alternate_the_order_and_merge_into_one_summary():
    """``--interleave``: every round runs one window of each configuration, the order reversed
    every other round; a configuration's rounds become one summary whose windows are the
    rounds' in order (so the median is taken over the same stretch of time for every
    configuration), with the first round's steps and the compute timed before each round."""
    import worker

    configs = ["horovod", "ar", "hybrid"]
    assert [worker.round_order(configs, r) for r in range(3)] == [
        ["horovod", "ar", "hybrid"], ["hybrid", "ar", "horovod"], ["horovod", "ar", "hybrid"]]

    def one_round(steps_per_s, compute, steps):
        return {"windows": [{"steps_per_s": steps_per_s}], "step_seconds": steps, "losses_first_last": [steps_per_s],
                "config": "ar", "methods": {}, "wall_s": 2.0, "ranks": 2, "machines": 1, "launch_compute_s": compute,
                "schedule": {"warmup_steps": 10, "repeats": 1, "steps_per_repeat": 20}}

    merged = worker.merge_rounds([one_round(30.0, 0.02, [1.0, 0.1]), one_round(20.0, None, [0.9, 0.2]),
                                  one_round(25.0, 0.04, [0.8, 0.3])])
    assert [w["steps_per_s"] for w in merged["windows"]] == [30.0, 20.0, 25.0]
    assert merged["step_seconds"] == [1.0, 0.1] and merged["losses_first_last"] == [25.0]
    assert merged["schedule"] == {"warmup_steps": 10, "repeats": 3, "steps_per_repeat": 20, "interleaved": True}
    assert merged["wall_s"] == 6.0
    assert merged["launch_compute_s"] == pytest.approx(0.03) and merged["launch_compute_rounds_s"] == [0.02, 0.04]


def _timeline_events(steps):
    """A Horovod timeline as rank 0 writes it: per tensor a name row, then per call a
    negotiation span (with per-rank marks inside) and the operation's span (with phases inside)."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    for pid, name in ((1, "px_ids_t"), (2, "px_rows_t"), (3, "other_config")):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
    for k in range(steps):
        t0 = 10_000 * k
        for pid, (requested, everyone, start, done) in ((1, (0, 40, 45, 100)), (2, (300, 310, 320, 400))):
            events += [{"ph": "B", "name": "NEGOTIATE_ALLTOALL", "ts": t0 + requested, "pid": pid},
                       {"ph": "X", "name": "0", "ts": t0 + requested, "pid": pid, "dur": 0},
                       {"ph": "E", "ts": t0 + everyone, "pid": pid},
                       {"ph": "B", "name": "ALLTOALL", "ts": t0 + start, "pid": pid},
                       {"ph": "B", "name": "MPI_ALLTOALL", "ts": t0 + start + 1, "pid": pid},
                       {"ph": "E", "ts": t0 + done - 1, "pid": pid},
                       {"ph": "E", "ts": t0 + done, "pid": pid}]
        # another configuration's calls, run long after this one's
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10**8 + t0, "pid": 3},
                   {"ph": "E", "ts": 10**8 + t0 + 5, "pid": 3},
                   {"ph": "B", "name": "ALLREDUCE", "ts": 10**8 + t0 + 6, "pid": 3},
                   {"ph": "E", "ts": 10**8 + t0 + 9, "pid": 3}]
    return events


def test_timeline_calls_places_each_call_in_its_step(tmp_path):
    import json

    import timeline_calls

    path = tmp_path / "timeline.json"
    text = json.dumps(_timeline_events(5))
    path.write_text(text[:-1] + ",\n")   # as a writer ended early leaves it: no closing bracket
    calls = timeline_calls.calls_by_tensor(timeline_calls.read_timeline(str(path)))
    assert calls["px_rows_t"][2] == (20_300, 20_310, 20_400)
    rows = timeline_calls.step_table(calls, "px_ids_t", skip=1, period=10_000)
    assert rows == [("px_ids_t", 0, 40, 100), ("px_rows_t", 300, 310, 400)]


def test_thread_cpu_splits_a_step_between_main_horovod_and_other_threads():
    import threading
    import time

    from step_anatomy import ThreadCpu

    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    go, spun, read, tids = threading.Barrier(3), threading.Barrier(3), threading.Event(), {}

    def worker(name, seconds):   # counted only while it lives: it waits until the last read
        tids[name] = threading.get_native_id()
        go.wait()
        spin(seconds)
        spun.wait()
        read.wait(10)

    threads = [threading.Thread(target=worker, args=("horovod", 0.4)), threading.Thread(target=worker, args=("tf", 0.2))]
    for t in threads:
        t.start()
    while len(tids) < 2:
        time.sleep(0.01)
    cpu = ThreadCpu({tids["horovod"]}, start=1, end=3)
    cpu(1)
    go.wait()
    spin(0.3)   # the main thread
    spun.wait()
    cpu(2)   # neither the start nor the end: not read
    cpu(3)
    read.set()
    for t in threads:
        t.join()
    per_step = cpu.per_step()   # two steps
    assert per_step["horovod"] == pytest.approx(0.2, abs=0.03)
    assert per_step["other"] == pytest.approx(0.1, abs=0.03)
    assert per_step["main"] == pytest.approx(0.15, abs=0.03)
    assert per_step["total"] == pytest.approx(sum(per_step[k] for k in ("main", "horovod", "other")))


def test_call_overlap_reads_a_chain_per_call_and_what_a_fan_adds_per_call():
    import call_overlap

    rounds = [{"fan": {1: 0.20, 4: 0.32}, "chain": {1: 0.20, 4: 0.88}},
              {"fan": {1: 0.22, 4: 0.31}, "chain": {1: 0.22, 4: 0.92}},
              {"fan": {1: 0.21, 4: 0.36}, "chain": {1: 0.21, 4: 0.90}}]
    one, four = call_overlap.summary(rounds, [1, 4])
    assert one[:4] == (1, 0.21, 0.21, 0.21)
    k, fan, chain, per_call, beside = four
    assert (k, fan, chain) == (4, 0.32, 0.90)
    assert per_call == pytest.approx(0.225) and beside == pytest.approx((0.32 - 0.21) / 3)


def test_each_configuration_times_windows_of_about_a_second_at_its_estimated_pace(monkeypatch):
    """A window of 5 steps of 3 ms is mostly the scheduler's noise: each configuration gets as
    many warm-up and window steps as last ``--warmup-s`` and ``--window-s`` at its estimated
    step, never fewer than ``--warmup`` and ``--steps`` (a CNN's window scale included) nor
    more than the cap; sparse_as_dense keeps its own short schedule, and ``--window-s 0`` the
    common one."""
    import types

    import bench_predict

    args = bench_predict.make_parser().parse_args(["--warmup", "5", "--steps", "5"])
    assert (args.window_s, args.warmup_s) == (1.0, 0.5)
    assert bench_comm.sized_schedule(0.004, args, 5, 5) == {"warmup_steps": 125, "steps_per_repeat": 250}
    assert bench_comm.sized_schedule(0.300, args, 5, 5) == {"warmup_steps": 5, "steps_per_repeat": 5}
    assert bench_comm.sized_schedule(1e-6, args, 5, 5) == {"warmup_steps": bench_comm.MAX_SIZED_STEPS,
                                                           "steps_per_repeat": bench_comm.MAX_SIZED_STEPS}
    for unknown in (None, 0.0, float("nan")):
        assert bench_comm.sized_schedule(unknown, args, 5, 5) == {}

    launched = []
    monkeypatch.setattr(bench_comm, "write_plans", lambda profile, spec, workdir, tag, calibration=None:
                        {c: f"{c}.json" for c in bench_comm.ARCHITECTURES})
    monkeypatch.setattr(bench_comm, "duplicates", lambda profile, plans, configs: {"auto": "ar"})
    monkeypatch.setattr(bench_comm, "predictions", lambda profile, spec: {})
    monkeypatch.setattr(bench_comm, "launch", lambda spec, configs, *rest: launched.append((spec, configs)) or {})
    estimates = {"ar": 0.002, "auto": 0.002, "hybrid": 0.040, "horovod": 0.010, "sparse_as_dense": 0.5}
    profile = types.SimpleNamespace(variables=[])
    bench_comm.run_setting("t", "cnn", {"workload": "cnn"}, profile, ["ar", "auto", "hybrid", "horovod", "sparse_as_dense"],
                           1, 2, None, args, "/nonexistent", step_estimates=estimates)
    spec, configs = launched[-1]
    schedules = {c["name"]: c["schedule"] for c in configs}
    assert spec["steps_per_repeat"] == 30 and spec["warmup_steps"] == 5   # the CNN's window scale
    assert schedules == {"ar": {"warmup_steps": 250, "steps_per_repeat": 500},
                         "hybrid": {"warmup_steps": 13, "steps_per_repeat": 30},   # 25 steps last 1 s: the CNN's 30
                         "horovod": {"warmup_steps": 50, "steps_per_repeat": 100},
                         "sparse_as_dense": {"warmup_steps": 1, "steps_per_repeat": args.sad_steps}}

    args.window_s = 0
    bench_comm.run_setting("t", "cnn", {"workload": "cnn"}, profile, ["ar", "horovod"], 1, 2, None, args, "/nonexistent",
                           step_estimates=estimates)
    assert [c["schedule"] for c in launched[-1][1]] == [{}, {}]


def test_predict_repeats_names_a_file_it_cannot_read(tmp_path, capsys):
    """A missing, cut-off or foreign file is named with what is wrong with it, not a traceback."""
    import predict_repeats

    cut = tmp_path / "cut.json"
    cut.write_text('{"schema": "parallax_nb.bench_predict", "settings": [')
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    for path, why in ((tmp_path / "missing.json", "No such file"), (cut, "cannot read"),
                      (listed, "not a bench_predict JSON")):
        assert predict_repeats.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and why in err, err
