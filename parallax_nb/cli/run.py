"""``python -m parallax_nb run <module:job> --np N --steps S --output DIR (--plan plan.json | --arch A)``

Outside MPI it starts ``mpirun`` with N ranks that run this same command; inside an MPI job
(``mpirun``/``horovodrun`` of your own: ``OMPI_COMM_WORLD_SIZE`` is set) it runs as one rank.
Rank 0 leaves in DIR: ``model.keras`` (the trained single-device model; ``model.weights.h5``
with a warning when Keras cannot serialise the model), ``history.csv`` (one
row per step and rank: loss, examples/s, step time, bytes sent and received by that rank),
``run.json`` (the run summary, schema ``parallax_nb.run``), ``plan.json`` (the plan executed)
and ``checkpoints/``; its summary on stderr ends with the predicted against the measured step
time (:func:`step_time_summary`).

``--async [--max-staleness K]`` trains asynchronously (:mod:`parallax_nb.sync_flags`): without ``--plan``
and ``--arch`` it plans every variable PS. The launcher checks the flags and the plan's methods
(the plan file, or ``--arch`` applied to the job's variable kinds) before mpirun starts;
run.json then carries ``sync``, ``max_staleness`` and every rank's measured staleness
(``staleness``, :mod:`parallax_nb.staleness`), history.csv a ``steps_ahead`` column. Its
checkpoints (``--checkpoint-every``, the end, ``--resume``) are the owners' consistent
snapshots (:mod:`parallax_nb.runtime.checkpoint`).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

from ..errors import ConfigError, DistributedError, ParallaxError
from ..failures import ERROR_DIR_ENV
from ..sync_flags import add_sync_arguments, apply_sync_flags, check_sync_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the Job as module:name (e.g. parallax_nb.workloads:lm_tiny)")
    parser.add_argument("--plan", help="plan.json from `parallax_nb plan` (else --arch plans from a quick profile)")
    parser.add_argument("--arch", choices=["hybrid", "ps", "ar", "auto"],
                        help="plan automatically with this architecture when no --plan is given (default hybrid)")
    parser.add_argument("--np", type=int, default=2, help="MPI ranks to start (default 2)")
    parser.add_argument("--steps", type=int, required=True, help="train until this step")
    parser.add_argument("--output", required=True, help="directory for model.keras, history.csv, run.json, checkpoints/")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K steps (and at the end)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest valid checkpoint in OUTPUT/checkpoints (an error if there is none)")
    parser.add_argument("--resume-if-present", action="store_true",
                        help="like --resume, but start from step 0 when OUTPUT/checkpoints holds no checkpoint")
    parser.add_argument("--profile", help="profile.json of this job: its peak memory sizes the check of this host's "
                                          "memory against the ranks asked for, and the summary predicts the step "
                                          "time from it")
    parser.add_argument("--force", action="store_true",
                        help="start even when the ranks asked for exceed this host's cores or memory")
    parser.add_argument("--partitions", default=None,
                        help="partitions of every PS variable: a number, or 'auto' to measure and fit t(P)")
    parser.add_argument("--hostfile", help="mpirun hostfile (default: all ranks on this machine)")
    parser.add_argument("--workers-per-machine", type=int, default=None,
                        help="treat ranks r // G as one machine (local aggregation and which bytes count as "
                             "network traffic; default: the hosts, or the plan's cluster on one host)")
    parser.add_argument("--step-timeout", type=float, default=None,
                        help="seconds after which a hung step stops the run with an error")
    parser.add_argument("--timeout", type=float, default=None, help="kill the whole run after this many seconds")
    add_sync_arguments(parser)


def _check(args) -> None:
    """Refuse bad arguments before anything starts (in the launcher and again on every rank)."""
    if args.np < 1:
        raise ConfigError(f"--np must be >= 1, got {args.np}")
    if args.steps < 0:
        raise ConfigError(f"--steps must be >= 0, got {args.steps}")
    if args.checkpoint_every < 0:
        raise ConfigError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.plan and args.arch:
        raise ConfigError("give either --plan or --arch, not both",
                          hint="--arch plans automatically; a plan file already fixes every method")
    if args.plan and not os.path.exists(args.plan):
        raise ConfigError(f"plan file {args.plan!r} does not exist", hint="make one with `python -m parallax_nb plan`")
    if args.workers_per_machine is not None and (args.workers_per_machine < 1 or args.np % args.workers_per_machine):
        raise ConfigError(f"--workers-per-machine must be >= 1 and divide --np={args.np}, "
                          f"got {args.workers_per_machine}")
    if args.partitions is not None and args.partitions != "auto":
        try:
            if int(args.partitions) < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--partitions must be a whole number >= 1 or 'auto', got {args.partitions!r}") from None
    if args.step_timeout is not None and not args.step_timeout > 0:
        raise ConfigError(f"--step-timeout must be a positive number of seconds, got {args.step_timeout:g}")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    check_sync_flags(args)
    if args.asynchronous and args.partitions == "auto":
        raise ConfigError("--async does not take --partitions auto yet: the partition search times synchronous steps",
                          hint="pass --partitions N, or train synchronously (without --async)")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise ConfigError(f"--output {args.output!r} is an existing file, not a folder",
                          hint="pass a folder path (it is created if missing)")
    if args.resume and args.resume_if_present:
        raise ConfigError("give either --resume or --resume-if-present, not both")
    if args.resume:
        from ..runtime.checkpoint import checkpoint_folders

        if not checkpoint_folders(os.path.join(args.output, "checkpoints")):
            raise ConfigError(f"--resume: there is no checkpoint to resume from in {args.output}/checkpoints",
                              hint="pass --resume-if-present to start from step 0 when there is none, or drop --resume")


def main(args) -> int:
    from ..launch import die_with_parent, in_mpi_job

    _check(args)
    if in_mpi_job():
        die_with_parent()  # a rank must not outlive its mpirun/orted
        return _rank_main(args)
    return _launch(args)


def _launch(args) -> int:
    """Check the output folder and this host, lock the folder, start mpirun with ``--np``
    ranks running this command; report the first failing rank (or the one that died)."""
    from ..launch import check_host_resources
    from .output_folder import OutputLock, check_writable

    from ..job import load_job
    from ..plan import Plan

    plan = Plan.from_json(args.plan) if args.plan else None  # fail here, before mpirun, on a bad plan file
    if args.asynchronous or (plan is not None and not plan.sync):
        _check_async_plan(args, plan)   # before the output folder is made: a refused run leaves nothing
    check_writable(args.output)
    load_job(args.job)  # fail here, before mpirun, on a job spec that does not name a Job
    if args.hostfile is None:
        check_host_resources(args.np, _peak_memory_per_rank(args.profile), force=args.force)
    with OutputLock(args.output):
        errors = tempfile.mkdtemp(prefix="parallax-run-")
        try:
            return _run_mpirun(args, errors)
        finally:
            shutil.rmtree(errors, ignore_errors=True)


def _check_async_plan(args, plan) -> None:
    """Refuse ``--async`` for a plan with AllReduce variables (``plan``, the plan file, or
    ``--arch`` applied to the job's variable kinds; AUTO follows HYBRID here, its costed choice,
    made on the ranks, is checked there again), and for an optimizer the owners have no rule for."""
    from ..job import load_job
    from ..plan import plan_for_kinds
    from ..runtime.owner_optimizers import owner_rule

    job = load_job(args.job)
    if plan is not None:
        apply_sync_flags(plan, args)
    else:
        from ..runtime.reference import variable_kinds

        apply_sync_flags(plan_for_kinds(variable_kinds(job), _architecture(args), model_name=job.name), args)
    owner_rule(job.make_optimizer())


def _peak_memory_per_rank(profile_path: str | None) -> int | None:
    if not profile_path:
        return None
    from ..jsonfile import load_json

    try:
        return int(load_json(profile_path, what="profile")["peak_memory_bytes"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"--profile {profile_path!r} has no peak_memory_bytes",
                          hint="pass a profile.json written by `python -m parallax_nb profile`") from None


def _run_mpirun(args, errors: str) -> int:
    from ..failures import read_failures
    from ..launch import OutputPump, connect_failure_note, kill_process_group, mpirun_command, rank_death_error, \
        rank_environment, start_mpirun

    argv = [sys.executable, "-m", "parallax_nb", "run", *_argv_of(args)]
    cmd = mpirun_command(args.np, argv, hostfile=args.hostfile)
    env = rank_environment({ERROR_DIR_ENV: errors})
    print(f"parallax_nb run: {args.np} ranks: {' '.join(cmd[:6])} ...", file=sys.stderr, flush=True)
    proc = start_mpirun(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pumps = [OutputPump(proc.stdout, echo=True, sink=sys.stdout), OutputPump(proc.stderr, echo=True, sink=sys.stderr)]
    for pump in pumps:
        pump.start()
    try:
        proc.wait(timeout=args.timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
        kill_process_group(proc)
        if isinstance(e, KeyboardInterrupt):
            raise
        note = connect_failure_note("".join(pump.text for pump in pumps))
        raise DistributedError(f"the run did not finish within {args.timeout:g} s and was stopped{note}") from None
    finally:
        kill_process_group(proc)
        for pump in pumps:
            pump.join(timeout=5)
    failures = read_failures(errors)
    if failures:
        rank, _, text = failures[0]
        raise DistributedError(f"rank {rank} of {args.np} failed:\n{text.rstrip()}")
    if proc.returncode != 0:
        died = rank_death_error("".join(pump.text for pump in pumps), args.np, proc.returncode)
        raise died if died is not None else DistributedError(f"mpirun exited with status {proc.returncode}")
    model_file = "model.keras" if os.path.exists(os.path.join(args.output, "model.keras")) else "model.weights.h5"
    print(f"parallax_nb run: wrote {args.output}/{model_file}, history.csv, run.json", file=sys.stderr)
    return 0


def _argv_of(args) -> list[str]:
    out = [args.job, "--np", str(args.np), "--steps", str(args.steps), "--output", args.output,
           "--checkpoint-every", str(args.checkpoint_every)]
    for flag, value in (("--plan", args.plan), ("--arch", args.arch), ("--partitions", args.partitions),
                        ("--step-timeout", args.step_timeout), ("--workers-per-machine", args.workers_per_machine)):
        if value is not None:
            out += [flag, str(value)]
    if args.max_staleness is not None:
        out += ["--max-staleness", str(args.max_staleness)]
    flags = [("--resume", args.resume), ("--resume-if-present", args.resume_if_present), ("--force", args.force),
             ("--async", args.asynchronous)]
    return out + [flag for flag, on in flags if on]


def _plan_on_rank(job, args, info):
    """``(plan, profile)``: the plan every rank executes (the file, or planned on rank 0 from a
    quick profile and broadcast, so every rank runs the same plan) and, on rank 0, the profile
    its step time is predicted from (``--profile``, else the quick profile; None without)."""
    from ..plan import Plan, make_plan, plan_for_kinds
    from ..types import ClusterSpec
    from .. import runtime  # noqa: F401
    from ..runtime.context import horovod

    profile = _profile_file(args.profile) if info.rank == 0 else None
    if args.plan:
        return Plan.from_json(args.plan), profile
    hvd = horovod()
    text = None
    if info.rank == 0:
        # on one host each rank stands for a machine (as on notebook engines), unless told otherwise
        if args.workers_per_machine:
            workers = args.workers_per_machine
        else:
            workers = max(info.local_size, 1) if info.machines > 1 else 1
        cluster = ClusterSpec(machines=max(info.size // workers, 1), workers_per_machine=workers)
        architecture = _architecture(args)
        try:
            from ..profile import profile_job

            quick = profile_job(job, steps=5, warmup=1)
            plan = make_plan(quick, cluster, architecture)
            profile = profile or quick
        except ImportError:
            from ..runtime.reference import variable_kinds

            plan = plan_for_kinds(variable_kinds(job), architecture, cluster=cluster, model_name=job.name)
        text = plan.to_json()
    if info.size > 1:
        text = hvd.broadcast_object(text, root_rank=0, name="px_cli_plan")
    return Plan.from_json(text), profile


def _architecture(args) -> str:
    """``--arch``, else ``ps`` for ``--async`` (every variable asynchronous), else ``hybrid``."""
    return args.arch or ("ps" if args.asynchronous else "hybrid")


def _profile_file(path: str | None):
    """The Profile in ``--profile``, or None when none was given or it is not a full profile
    (a file with only ``peak_memory_bytes`` still sizes the memory check)."""
    if not path:
        return None
    from ..types import Profile

    try:
        return Profile.from_json(path)
    except Exception:  # noqa: BLE001 - no prediction, said in the summary
        return None


def step_time_summary(profile, plan, summary: dict, calibration=None) -> str:
    """The CLI's line of predicted against measured step time: the estimate of what the ranks
    executed on their topology (:func:`parallax_nb.cost.against_run.check_step_time`, with the
    plan's bandwidth and latency) against the median over the steps after the first."""
    if profile is None:
        return "step time: no prediction (pass --profile profile.json, or plan with --arch)"
    from ..cost.against_run import check_step_time, recorded_settings
    from ..executed import ExecutedPlan
    from ..types import ClusterSpec

    ran = ExecutedPlan.from_dict(summary["executed_plan"])
    spec = (plan.cluster or ClusterSpec(machines=1)).replace(
        machines=ran.machines, workers_per_machine=ran.workers_per_machine, local_aggregation=ran.local_aggregation)
    steps = summary.get("measured_steps") or []
    steps_text = f"steps {steps[0]}-{steps[1]}" if len(steps) == 2 and steps[1] > steps[0] else \
        (f"step {steps[-1]}" if steps else "no step")
    try:
        check = check_step_time(profile, ran, spec, summary["step_time_s_median"], steps_text, calibration,
                                **recorded_settings(summary))
    except ParallaxError as e:   # a --profile of another model: the run itself succeeded
        return f"step time: no prediction ({e.message})"
    return check.line() if check is not None else "step time: no step was measured"


def _rank_main(args) -> int:
    from ..job import load_job
    from ..failures import report_rank_failure
    from ..runtime.context import configure_threads, rank_info

    try:
        configure_threads()
        info = rank_info()  # Horovod up and this rank's GPU chosen before the user's module runs
        job = load_job(args.job)
        if info.rank == 0:     # the start-up phases, as the notebook shows them
            from .. import progress

            progress.listen(progress.terminal_listener(prefix="parallax_nb run:"))
        plan, profile = _plan_on_rank(job, args, info)
        plan = apply_sync_flags(plan, args)   # on every rank alike: the same plan or the same error
        search = None
        if args.partitions == "auto":
            from ..runtime.partition_search import search_partitions

            search = search_partitions(job, plan)
            if info.rank == 0:
                print(f"parallax_nb run: {search}", file=sys.stderr, flush=True)
            plan = plan.with_methods({}, partitions={n: search.best for n in plan.ps_variables})
        elif args.partitions is not None:
            plan = plan.with_methods({}, partitions={n: int(args.partitions) for n in plan.ps_variables})
        _train_and_write(job, plan, args, info, search, profile)
    except BaseException as exc:  # noqa: BLE001 - report, then let mpirun stop the other ranks
        report_rank_failure(exc, os.environ.get(ERROR_DIR_ENV))
        sys.stderr.flush()
        os._exit(1)
    from ..runtime.context import shutdown

    shutdown()
    return 0


def _train_and_write(job, plan, args, info, search, profile=None) -> None:
    from ..jsonfile import atomic_write_text
    from ..runtime.context import horovod
    from ..runtime.trainer import train

    checkpoints = os.path.join(args.output, "checkpoints")
    result = train(job, plan, args.steps, checkpoint_dir=checkpoints,
                   checkpoint_every=args.checkpoint_every, resume=args.resume or args.resume_if_present,
                   step_timeout_s=args.step_timeout,
                   workers_per_machine=args.workers_per_machine)
    rows = [dict(record.to_row(), rank=info.rank) for record in result.history]
    if info.size > 1:
        rows = [r for part in horovod().allgather_object(rows, name="px_cli_history") for r in part]
    if info.rank != 0:
        return
    os.makedirs(args.output, exist_ok=True)
    model_file = save_trained_model(result.single_device_model(), args.output, args.job)
    buffer = io.StringIO()
    columns = ["step", "rank", "loss", "examples_per_s", "step_time_s", "bytes_sent", "bytes_received"]
    if not plan.sync:
        columns.append("steps_ahead")
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        writer.writerow({c: row[c] for c in columns})
    atomic_write_text(os.path.join(args.output, "history.csv"), buffer.getvalue())
    summary = result.summary()
    if search is not None:
        summary["partition_search"] = search.to_dict()
    summary["job"] = job.name
    summary["model_file"] = model_file
    if summary["batch_norm"]["statistics"] == "per rank":
        print(f"parallax_nb run: note: BatchNorm layers {summary['batch_norm']['layers']} normalised with each "
              "rank's own batch (Job(sync_batch_norm=False)): not the single-device run on the global batch",
              file=sys.stderr, flush=True)
    for change in result.executed_plan.change_lines() if result.executed_plan is not None else ():
        print(f"parallax_nb run: the run changed the plan: {change}", file=sys.stderr, flush=True)
    atomic_write_text(os.path.join(args.output, "run.json"), json.dumps(summary, indent=2))
    if result.staleness is not None:
        print(f"parallax_nb run: {result.executed_plan.describe_sync()}; {result.staleness.describe()}",
              file=sys.stderr, flush=True)
    print(f"parallax_nb run: {step_time_summary(profile, plan, summary)}", file=sys.stderr, flush=True)
    plan.to_json(os.path.join(args.output, "plan.json"))


def save_trained_model(model, output: str, job_spec: str) -> str:
    """Write ``model.keras`` in ``output``; when Keras cannot serialise the model (e.g. a
    subclassed model without ``get_config``), write its weights to ``model.weights.h5``
    instead and say how to load them. Either file is written under a temporary name and
    renamed, so no partial file is left. Returns the file name written."""
    tmp = os.path.join(output, ".tmp-model.keras")
    try:
        model.save(tmp)
        os.replace(tmp, os.path.join(output, "model.keras"))
        return "model.keras"
    except Exception as e:  # noqa: BLE001 - any serialisation failure: keep the weights instead
        first_paragraph = str(e).strip().split("\n\n")[0]
        reason = f"{type(e).__name__}: {' '.join(first_paragraph.split())}"
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    weights = os.path.join(output, "model.weights.h5")
    tmp = os.path.join(output, ".tmp-model.weights.h5")
    try:
        model.save_weights(tmp)
        os.replace(tmp, weights)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"parallax_nb run: warning: Keras cannot save the whole model ({reason}); the trained weights are in "
          f"{weights}. Load them into your model with:\n"
          f"    import parallax_nb as px\n"
          f"    model = px.load_job({job_spec!r}).build_model()   # your builder, variables created\n"
          f"    model.load_weights({weights!r})", file=sys.stderr, flush=True)
    return "model.weights.h5"
