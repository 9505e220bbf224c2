"""``%parallax``: the whole journey as IPython line magics (``%load_ext parallax_nb``).

Names (``job``, ``profile``, ``planner.plan``) resolve in the notebook's namespace; a job may
also be a ``module:name`` spec. Results are stored in the namespace (``-o NAME`` picks the
name) and the last profile, plan and run are remembered, so later subcommands need no
arguments. Bad arguments and missing names are reported in one line (a ``UsageError``),
never as a traceback. ``%parallax?`` shows :data:`USAGE`; ``%parallax SUBCOMMAND --help``
each subcommand's options with their defaults. There is no cell magic.
"""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .errors import ParallaxError, PlanError
from .sync_flags import apply_sync_flags, check_sync_flags, flag_hint

SUBCOMMANDS = ("profile", "plan", "run", "report", "cluster", "calibrate", "help")
DEFAULT_MACHINES = 2
DEFAULT_BANDWIDTH = "10Gbit/s"
DEFAULT_LATENCY_US = 25.0

USAGE = f"""%parallax SUBCOMMAND [options]: profile, plan, run and report from one line magic.

  %parallax profile JOB [--steps 20] [-o NAME]
      profile JOB on one device (per-variable kind, size, alpha) -> `profile`
  %parallax plan [PROFILE] [--machines {DEFAULT_MACHINES}] [--workers-per-machine 1]
                 [--bandwidth {DEFAULT_BANDWIDTH}] [--latency {DEFAULT_LATENCY_US:g}] [--arch auto]
                 [--async [--max-staleness K]] [--calibration FILE] [-o NAME]
      plan PROFILE for a cluster (latency in microseconds) -> `planner` and `plan`
  %parallax run JOB [--engines 2] [--steps 100] [--plan PLAN] [--arch hybrid] [--async [--max-staleness K]]
                [--checkpoint-dir DIR] [--checkpoint-every K] [--resume] [--calibration C] [-o NAME]
      train JOB on MPI engines with a live view (Stop button or Ctrl-C stops it) -> `run`
  %parallax report PATH [--profile P] [--plan P] [--run R] [--title T]
      write the cost report: PATH (HTML) and the .csv and .json beside it
  %parallax cluster start|stop|status [--engines 2] [--emulate 2x2@1Gbit/s]
      the notebook's shared MPI engines
  %parallax calibrate [--job JOB] [-o NAME]
      measure the started cluster's collectives (and links, and JOB's compute) -> `calibration`

%parallax SUBCOMMAND --help lists every option of a subcommand with its default.
Results go to the notebook variable named in the arrow (-o NAME picks another).
"""


def _sync_options(fn):
    """``--async`` and ``--max-staleness K``, as on the command line (:mod:`parallax_nb.sync_flags`)."""
    fn = argument("--max-staleness", type=int, default=None, metavar="K",
                  help="with --async: a worker waits when it is more than K steps ahead of the slowest "
                       "(0: lock-step; default: unbounded)")(fn)
    return argument("--async", dest="asynchronous", action="store_true",
                    help="train the PS variables asynchronously (every variable must be PS: --arch ps)")(fn)


def _output_option(default: str):
    return argument("-o", "--output", metavar="NAME", default=default,
                    help=f"store the result in this notebook variable (default: {default})")


@magic_arguments("%parallax profile")
@argument("job", metavar="JOB", help="a parallax_nb.Job in the notebook (or module:name)")
@argument("--steps", type=int, default=20, help="single-device steps to measure (default: 20)")
@_output_option("profile")
def _profile_args(line):
    """Profile JOB on one device: per-variable kind, size, alpha (rows touched per step)."""


@magic_arguments("%parallax plan")
@argument("profile", metavar="PROFILE", nargs="?", default=None,
          help="a Profile in the notebook (default: the last one profiled)")
@argument("--machines", type=int, default=DEFAULT_MACHINES,
          help=f"machines in the target cluster (default: {DEFAULT_MACHINES}; 1 machine has no network traffic)")
@argument("--workers-per-machine", "--gpus", dest="workers_per_machine", type=int, default=1,
          help="workers (GPUs) per machine (default: 1)")
@argument("--bandwidth", default=DEFAULT_BANDWIDTH,
          help=f"network bandwidth per machine, e.g. 100Gbit/s or 1.25GB/s (default: {DEFAULT_BANDWIDTH})")
@argument("--latency", type=float, default=DEFAULT_LATENCY_US, metavar="MICROSECONDS",
          help=f"time per message in microseconds (default: {DEFAULT_LATENCY_US:g})")
@argument("--no-local-aggregation", dest="local_aggregation", action="store_const", const=False, default="auto",
          help="do not combine a machine's gradients before they cross the network (default: AUTO chooses, "
               "other architectures combine)")
@argument("--arch", default="auto",
          help="ar | ps | hybrid | auto (default: auto, the least estimated step time per variable)")
@argument("--calibration", default=None, metavar="FILE",
          help="a calibration .json of this cluster, or a Calibration in the notebook (default: the documented "
               "defaults; estimates marked uncalibrated)")
@_sync_options
@_output_option("planner")
def _plan_args(line):
    """Plan PROFILE for a cluster; stores the Planner (-o) and its Plan as `plan`."""


@magic_arguments("%parallax run")
@argument("job", metavar="JOB", help="a parallax_nb.Job in the notebook (or module:name)")
@argument("--plan", default=None, help="a Plan or Planner in the notebook, or a plan .json file "
                                        "(default: planned from the last profile with --arch)")
@argument("--arch", default=None, help="ar | ps | hybrid | auto: plan the job this way (default: hybrid; ps "
                                        "with --async)")
@_sync_options
@argument("--engines", type=int, default=2, help="MPI engines (ranks) to train on (default: 2)")
@argument("--steps", type=int, default=100, help="training steps (default: 100)")
@argument("--resume", action="store_true", help="continue from the last checkpoint in --checkpoint-dir")
@argument("--checkpoint-dir", default=None, help="folder for checkpoints")
@argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every K steps (0: at the end only)")
@argument("--step-timeout", type=float, default=None, help="fail the run when one step takes longer (seconds)")
@argument("--calibration", default=None, metavar="C",
          help="a Calibration in the notebook or a calibration .json of these engines, for the predictions the "
               "run view shows beside its measurements (default: the last %%parallax calibrate, if any)")
@_output_option("run")
def _run_args(line):
    """Train JOB on MPI engines with a live view (Ctrl-C or the Stop button stops every engine)."""


@magic_arguments("%parallax report")
@argument("path", metavar="PATH", help="where to write the HTML report (a .csv and .json are written beside it)")
@argument("--profile", default=None, help="a Profile in the notebook (default: the last one)")
@argument("--plan", default=None, help="a Plan or Planner in the notebook (default: the last one)")
@argument("--run", default=None, help="a Run in the notebook (default: the last finished one; 'none' for none)")
@argument("--title", default=None, help="title at the top of the report")
def _report_args(line):
    """Write the cost report of a plan (and of a run, measured against it)."""


@magic_arguments("%parallax cluster")
@argument("action", metavar="ACTION", choices=["start", "stop", "status"], help="start | stop | status")
@argument("--engines", type=int, default=None, help="engines (MPI ranks) to start (default: 2)")
@argument("--emulate", default=None, metavar="MxG@BANDWIDTH",
          help="start the engines on an emulated network of M machines x G engines, e.g. 2x2@1Gbit/s "
               "(network namespaces on shaped links; needs root)")
def _cluster_args(line):
    """Start, stop or show the notebook's shared cluster of MPI engines."""


@magic_arguments("%parallax calibrate")
@argument("--job", default=None, metavar="JOB",
          help="also measure this job's compute per step on every engine at once (a Job in the notebook "
               "or module:name; default: collectives and links only)")
@argument("--timeout", type=float, default=300.0, metavar="SECONDS",
          help="give up (and restart the engines) after this long (default: 300)")
@_output_option("calibration")
def _calibrate_args(line):
    """Calibrate the notebook's started cluster on its own engines (px.calibrate(cluster=...))."""


_PARSERS = {"profile": _profile_args, "plan": _plan_args, "run": _run_args, "report": _report_args,
            "cluster": _cluster_args, "calibrate": _calibrate_args}


def _help_text() -> str:
    """USAGE, then every subcommand's options (``%parallax help``)."""
    parts = [USAGE]
    for fn in _PARSERS.values():
        parts.append(fn.parser.format_help().strip())
        parts.append("")
    return "\n".join(parts)


def _positive(name: str, value, minimum: int = 1):
    if value is not None and value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")
    return value


@magics_class
class ParallaxMagics(Magics):
    """The ``%parallax`` line magic; state: the last profile, plan and run."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.last: dict = {"profile": None, "plan": None, "run": None, "calibration": None}

    # ----- helpers -----------------------------------------------------------------------------
    def resolve(self, expression: str, what: str):
        """Look up ``name`` or ``name.attr...`` in the notebook namespace; UsageError if missing."""
        ns = self.shell.user_ns
        head, *attrs = expression.split(".")
        if not head.isidentifier() or not all(a.isidentifier() for a in attrs):
            raise UsageError(f"{what} {expression!r} is not a variable name")
        if head not in ns:
            raise UsageError(f"{what} {head!r} is not defined in the notebook namespace; "
                             f"define it first or check the spelling")
        value = ns[head]
        for attr in attrs:
            if not hasattr(value, attr):
                raise UsageError(f"{what} {expression!r}: {type(value).__name__} has no attribute {attr!r}")
            value = getattr(value, attr)
        return value

    def store(self, name: str, value) -> None:
        if not name.isidentifier():
            raise UsageError(f"-o needs a variable name, got {name!r}")
        self.shell.user_ns[name] = value

    def job(self, expression: str):
        from .job import Job, load_job

        if ":" in expression:
            return load_job(expression)
        value = self.resolve(expression, "job")
        if not isinstance(value, Job):
            raise UsageError(f"job {expression!r} is a {type(value).__name__}, not a parallax_nb.Job")
        return value

    @staticmethod
    def _as_plan(value, expression: str):
        from .plan import Plan

        value = getattr(value, "plan", value) if not isinstance(value, Plan) else value
        if not isinstance(value, Plan):
            raise UsageError(f"plan {expression!r} is a {type(value).__name__}, not a Plan or Planner")
        return value

    def plan_from(self, expression: str):
        import os

        from .plan import Plan

        if expression.endswith(".json") and os.path.exists(expression) and expression not in self.shell.user_ns:
            return Plan.from_json(expression)
        return self._as_plan(self.resolve(expression, "plan"), expression)

    def _display(self, obj) -> None:
        from IPython.display import display

        display(obj)

    # ----- the magic ---------------------------------------------------------------------------
    @line_magic
    def parallax(self, line: str = ""):
        """(replaced by USAGE below)"""
        words = line.strip().split(None, 1)
        if not words or words[0] in ("-h", "--help"):
            print(USAGE)
            return None
        if words[0] == "help":
            print(_help_text())
            return None
        command, rest = words[0], (words[1] if len(words) > 1 else "")
        if command not in _PARSERS:
            raise UsageError(f"unknown %parallax subcommand {command!r}; choose one of: {', '.join(SUBCOMMANDS)}")
        if rest.strip() in ("-h", "--help"):
            print(_PARSERS[command].parser.format_help())
            return None
        args = parse_argstring(_PARSERS[command], rest)
        try:
            getattr(self, f"_do_{command}")(args)
        except ParallaxError as e:
            raise UsageError(str(e).replace("\n  -> ", " -> ")) from None
        return None

    parallax.__doc__ = USAGE

    def _do_profile(self, args) -> None:
        from .profile import profile_job

        _positive("--steps", args.steps)
        job = self.job(args.job)
        prof = profile_job(job, steps=args.steps)
        self.store(args.output, prof)
        self.last["profile"] = prof
        try:
            from .widgets import ProfileView

            self._display(ProfileView(prof))
        except ImportError:
            self._display(prof)

    def _do_plan(self, args) -> None:
        from .planner import plan as make_planner

        _positive("--machines", args.machines)
        _positive("--workers-per-machine", args.workers_per_machine)
        if not 0 <= args.latency < float("inf"):
            raise UsageError(f"--latency must be a finite number of microseconds >= 0, got {args.latency:g}")
        if args.profile is None:
            prof = self.last["profile"]
            if prof is None:
                raise UsageError("no profile yet: run `%parallax profile JOB` first or name one: %parallax plan PROFILE")
        else:
            prof = self.resolve(args.profile, "profile")
        from .types import Profile

        if not isinstance(prof, Profile):
            raise UsageError(f"profile {args.profile!r} is a {type(prof).__name__}, not a parallax_nb Profile")
        from .types import parse_bandwidth

        parse_bandwidth(args.bandwidth)   # a clear one-line error before the planner starts
        check_sync_flags(args)
        calibration = self._calibration(args.calibration) if args.calibration else None
        try:
            planner = make_planner(prof, architecture=args.arch, machines=args.machines,
                                   workers_per_machine=args.workers_per_machine, bandwidth=args.bandwidth,
                                   latency_s=args.latency / 1e6, local_aggregation=args.local_aggregation,
                                   calibration=calibration, sync=not args.asynchronous,
                                   max_staleness=args.max_staleness)
        except PlanError as e:
            if not args.asynchronous:
                raise
            raise flag_hint(e) from None
        self.store(args.output, planner)
        if args.output != "plan":
            self.store("plan", planner.plan)
        self.last["profile"], self.last["plan"] = prof, planner
        self._display(planner)

    def _calibration(self, expression: str):
        """A Calibration in the notebook named ``expression``, else the calibration file at that path."""
        from .calibration import Calibration

        value = self.shell.user_ns.get(expression) if expression.isidentifier() else None
        if isinstance(value, Calibration):
            return value
        return Calibration.from_json(expression)

    def _run_plan(self, args, job):
        """The plan to run: --plan, else planned for the run's engines from the last profile
        (with --arch, else hybrid, else ps with --async); asynchronous with --async."""
        return apply_sync_flags(self._planned_run(args, job), args)

    def _planned_run(self, args, job):
        from .plan import make_plan
        from .types import Architecture, ClusterSpec

        if args.plan is not None:
            plan = self.plan_from(args.plan)
            if args.arch is not None and Architecture.parse(args.arch) is not plan.architecture:
                raise UsageError(f"--plan {args.plan} is a {plan.architecture.value} plan but --arch is {args.arch}; "
                                 "give one of them")
            return plan
        architecture = Architecture.parse(args.arch or ("ps" if args.asynchronous else "hybrid"))
        prof = self.last["profile"]
        if prof is not None and prof.model_name == job.name:
            return make_plan(prof, ClusterSpec(machines=args.engines), architecture)
        from .runtime.reference import default_plan

        return default_plan(job, architecture.value, ranks=args.engines)

    def _do_run(self, args) -> None:
        from .cluster import dispatch

        _positive("--engines", args.engines)
        _positive("--steps", args.steps)
        _positive("--checkpoint-every", args.checkpoint_every, minimum=0)
        if args.step_timeout is not None and args.step_timeout <= 0:
            raise UsageError(f"--step-timeout must be > 0 seconds, got {args.step_timeout}")
        if not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, got {args.output!r}")
        check_sync_flags(args)
        job = self.job(args.job)
        plan = self._run_plan(args, job)
        prof = self.last["profile"]
        profile = prof if prof is not None and prof.model_name == job.name else None
        calibration = self._calibration(args.calibration) if args.calibration else self.last["calibration"]
        the_run = dispatch.run(job, plan, engines=args.engines, steps=args.steps,
                               checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                               resume=args.resume, step_timeout_s=args.step_timeout, wait=False, display=True,
                               profile=profile, calibration=calibration)
        self.store(args.output, the_run)
        self.last["run"] = the_run
        if args.plan is None:
            self.last["plan"] = plan
        the_run.wait()

    def _do_report(self, args) -> None:
        from .report import report
        from .types import Profile

        prof = self.resolve(args.profile, "profile") if args.profile else self.last["profile"]
        if prof is None:
            raise UsageError("no profile for the report: run `%parallax profile JOB` or pass --profile NAME")
        if not isinstance(prof, Profile):
            raise UsageError(f"--profile {args.profile!r} is a {type(prof).__name__}, not a parallax_nb Profile")
        plan = self.plan_from(args.plan) if args.plan else self.last["plan"]
        if plan is None:
            raise UsageError("no plan for the report: run `%parallax plan` or pass --plan NAME")
        plan = self._as_plan(plan, args.plan or "plan")
        if args.run and args.run.lower() == "none":
            the_run = None
        elif args.run:
            the_run = self.resolve(args.run, "run")
        else:
            the_run = self.last["run"]
            if the_run is not None and getattr(the_run, "_summary", None) is None:
                the_run = None     # the last run has no summary (failed or still running)
        files = report(prof, plan, the_run, title=args.title).save(args.path)
        print("report written: " + ", ".join(str(p) for p in (files if isinstance(files, tuple) else [files])))

    def _do_calibrate(self, args) -> None:
        from .calibrate import calibrate, fits_table
        from .cluster import cluster as cluster_module

        if not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, got {args.output!r}")
        if not args.timeout > 0:
            raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
        c = cluster_module.current_default_cluster()
        if c is None or not c.running:
            raise UsageError("no cluster is running: start one with %parallax cluster start [--engines N] "
                             "[--emulate MxG@BANDWIDTH], then calibrate it")
        job = self.job(args.job) if args.job else None
        calibration = calibrate(cluster=c, job=job, timeout_s=args.timeout)
        self.store(args.output, calibration)
        self.last["calibration"] = calibration
        print(f"{calibration.label} ({calibration.shape}) -> `{args.output}`\n{fits_table(calibration)}")

    def _do_cluster(self, args) -> None:
        from .cluster import cluster as cluster_module

        _positive("--engines", args.engines)
        if args.action == "start":
            default_n = cluster_module._default.n if cluster_module._default and args.emulate is None else None
            c = cluster_module.default_cluster(args.engines or default_n or (None if args.emulate else 2),
                                               start=False, emulate=args.emulate)
            was_running = c.running and c.alive()
            c.start()
            how = "reused" if was_running else f"started in {c.start_time_s:.1f} s"
            print(f"{c.status()} ({how})")
        elif args.action == "stop":
            had = cluster_module.current_default_cluster()
            cluster_module.stop_default_cluster()
            print("cluster stopped" if had is not None else "no cluster was running")
        else:
            c = cluster_module.current_default_cluster()
            print(c.status() if c is not None else "cluster: none started (use %parallax cluster start)")


def load_ipython_extension(ipython) -> None:
    """``%load_ext parallax_nb``: register ``%parallax``, short ParallaxErrors and phase displays."""
    from .widgets.ipython import install

    ipython.register_magics(ParallaxMagics)
    install(ipython)


def unload_ipython_extension(ipython) -> None:
    magics = ipython.magics_manager.registry.get("ParallaxMagics")
    if magics is not None:
        ipython.magics_manager.magics["line"].pop("parallax", None)
