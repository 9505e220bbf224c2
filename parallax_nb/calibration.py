"""A calibration of the user's own cluster: what one collective call and one step of compute cost.

The cost model turns bytes into time with these figures. ``px.calibrate`` and ``python -m
parallax_nb calibrate`` measure them on the actual ranks (this host, a hostfile, or an
emulated network); without a measurement :meth:`Calibration.defaults` derives them from a
:class:`~parallax_nb.types.ClusterSpec` and the estimate says "uncalibrated".

Time of one collective call, fitted per operation and scope from timed calls at a few sizes::

    t(call) = latency_s + bytes / (bandwidth_bps / 8)

``bytes`` is what **one rank hands to the call**: the tensor of an allreduce, the rank's own
slice of an allgather, everything the rank sends in an alltoall. ``op`` is one of
:data:`COLLECTIVE_OPS`; ``scope`` one of :data:`SCOPES`, the participants as in
:class:`~parallax_nb.types.Collective`: every rank ("all"), the ranks of one machine
("machine"), or one local index on every machine ("cross").

A calibration is for one cluster shape (machines x ranks per machine): a calibration of
another shape is refused by :meth:`Calibration.check_shape` with both shapes named.

It is also for one set of Horovod settings: Horovod's background loop negotiates once per
``HOROVOD_CYCLE_TIME`` (parallax_nb's ranks set :data:`RUNTIME_HOROVOD_CYCLE_TIME_MS` where
the environment sets none; Horovod alone runs :data:`DEFAULT_HOROVOD_CYCLE_TIME_MS`), which sets both
what an idle link carries and what a collective waits before it starts. The calibration
records the :data:`HOROVOD_TIMING_SETTINGS` its ranks ran with (``horovod_env``) and the cycle time
they give (``horovod_cycle_time_ms``); :meth:`Calibration.settings_mismatch` says when a run
used others. A file written before these were recorded loads with an empty ``horovod_env``
and Horovod's default cycle time (what ``px.calibrate`` ran under unless the shell set one),
and without a busy coordination rate (the idle rate stands in for it).

And for one placement: ``rank_cores``, the cores each rank could use while it was measured
(ranks that share a host's cores bind themselves to one each: :mod:`parallax_nb.devices`).
Bound or not, the same ranks compute and wait at other speeds (2 ranks of the tiny LM on 2
cores: about half the steps per second unbound), so a run whose ranks had other cores, or a
calibration that does not record them (written before 2026-11-27, when 2 ranks on 2 cores
were not bound yet), is named by :meth:`Calibration.settings_mismatch` too.

And for one way of pricing a step's small calls (``call_pricing``). A step issues its calls
one after another or side by side, and pays once for what starts them (the function's call,
the ranks arriving apart, the wait for Horovod's next cycle); a chain of three calls timed
after a barrier pays that start every three calls. Where every rank had a core of its own
(no more ranks on a host than the cores they could use), calls below 1 MiB are priced
:data:`CALL_PRICING_STRIDE`: what one more call adds to a chain already running. Where ranks
share cores, a call's progress waits for the other ranks' turns on them, and calls are priced
:data:`CALL_PRICING_CHAIN`, a short chain's mean. Measured with ``bench_predict.py
--calibrate`` (benchmarks/README.md, "A step's small calls in stride"): on 2 ranks with a core
each, over three invocations of each pricing in turn, the median step error went from 10.9 %
to 9.5 % and the largest from 60.6 % to 31.3 % (the recommender's from 38-56 % to 2-29 %);
priced in stride on 4 ranks of 2 x 2 on 2 cores, the recommender's steps ran 1.3 to 2.8 times
as long as predicted, where the chain's mean came within 40 %. Files written before the choice
was recorded priced the chain.

And for one speed of the cores: the compute is timed at the start of a calibration and again
at its end (``compute_recheck_time_s``). Where the two differ by more than
:data:`COMPUTE_DRIFT_NOTED`, the cores' speed moved while calibrating (other work on the
host, a shared or throttled machine: 2 bound ranks on 2 cores read the LM's compute at 26.5 to
49.8 ms within minutes), and every estimate made with it says so (:meth:`Calibration.compute_drift`).

Pure Python: no TensorFlow, no numpy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass, field

from .allgatherv import crossing_slices
from .errors import ConfigError
from .types import PLAIN_HOROVOD, SPARSE_AS_DENSE

CALIBRATION_SCHEMA = "parallax_nb.calibration"
CALIBRATION_SCHEMA_VERSION = 1
COLLECTIVE_OPS = ("allreduce", "allgather", "alltoall")
#: How a calibration prices calls below 1 MiB (module docstring): a short chain's mean per call
CALL_PRICING_CHAIN = "chain"
#: ... or what one more call adds to a chain already running
CALL_PRICING_STRIDE = "in stride"
CALL_PRICINGS = (CALL_PRICING_CHAIN, CALL_PRICING_STRIDE)
SCOPES = ("all", "machine", "cross")

# Defaults without a measurement: a call inside one machine (shared memory) and the per-call
# cost of a collective besides its wire latency (the framework's negotiation and launch).
DEFAULT_MACHINE_LATENCY_S = 50e-6
DEFAULT_MACHINE_BANDWIDTH_BPS = 40e9
DEFAULT_CALL_OVERHEAD_S = 200e-6
#: The call size whose allgatherv algorithm sets the defaults' allgather bandwidth: where the
#: bytes, not the latency, decide a call's time (the largest size ``px.calibrate`` times).
DEFAULT_BANDWIDTH_CALL_BYTES = 4 << 20
#: Relative difference of a calibration's two compute readings above which its estimates say
#: that the cores' speed moved while calibrating (their step times can miss by as much).
COMPUTE_DRIFT_NOTED = 0.10
#: Horovod's cycle time when ``HOROVOD_CYCLE_TIME`` is unset (Horovod >= 0.21), milliseconds:
#: what a calibration file that recorded no setting ran under.
DEFAULT_HOROVOD_CYCLE_TIME_MS = 1.0
#: The cycle time parallax_nb's ranks run Horovod with where the environment sets none
#: (:func:`parallax_nb.runtime.context.horovod`), milliseconds. A PS lookup is two dependent
#: rounds (ids, then rows), each waiting for a cycle: measured on 2 ranks, 2 cores, the tiny
#: LM's HYBRID step took 5.35-5.67 ms at Horovod's 1 ms and 2.85-2.92 ms at 0.1 ms, and its
#: Horovod and MPI threads used less CPU per step (1150-1250 us against 600-700 us; README,
#: "Horovod's cycle").
RUNTIME_HOROVOD_CYCLE_TIME_MS = 0.1
#: The Horovod variables that change how often its ranks negotiate and how a collective runs,
#: so what an idle link carries and what a call costs: a calibration records them.
HOROVOD_TIMING_SETTINGS = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_AUTOTUNE",
                           "HOROVOD_FUSION_THRESHOLD", "HOROVOD_DISABLE_GROUP_FUSION",
                           "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER",
                           "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_MPI_THREADS_DISABLE")


def horovod_settings(environ) -> dict:
    """``{name: value}`` of the :data:`HOROVOD_TIMING_SETTINGS` set in ``environ``."""
    return {k: str(environ[k]) for k in HOROVOD_TIMING_SETTINGS if k in (environ or {})}


def horovod_cycle_time_ms(environ) -> float | None:
    """The cycle time (ms) Horovod runs with under ``environ`` (a mapping of environment
    variables): ``HOROVOD_CYCLE_TIME`` when set, else :data:`DEFAULT_HOROVOD_CYCLE_TIME_MS`;
    None when it is set to something that is not a number >= 0."""
    text = (environ or {}).get("HOROVOD_CYCLE_TIME")
    if text is None or str(text).strip() == "":
        return DEFAULT_HOROVOD_CYCLE_TIME_MS
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _finite(name: str, value, minimum: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value <= minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"calibration {name} must be a finite number {bound}, got {value!r}",
                          hint="measure again with px.calibrate(...), or drop the calibration to use the defaults")
    return float(value)


def _baseline_compute(value) -> dict:
    """``{model: {baseline key: seconds > 0}}``, checked (Calibration's docstring)."""
    if not isinstance(value, dict) or not all(isinstance(b, dict) for b in value.values()):
        raise ConfigError(f"calibration baseline_compute_time_s must map a model to {{baseline: seconds}}, "
                          f"got {value!r}", hint="measure again with px.calibrate(...)")
    out = {}
    for model, by_key in value.items():
        unknown = sorted(set(by_key) - {PLAIN_HOROVOD, SPARSE_AS_DENSE})
        if unknown:
            raise ConfigError(f"calibration baseline_compute_time_s[{model!r}] names {unknown}, not a Horovod baseline",
                              hint=f"the keys are {PLAIN_HOROVOD!r} and {SPARSE_AS_DENSE!r}")
        out[str(model)] = {k: _finite(f"baseline_compute_time_s[{model!r}][{k!r}]", v, strict=True)
                           for k, v in by_key.items()}
    return out


def link_factor(op: str, scope: str, machines: int, workers_per_machine: int,
                bytes_per_rank: float | None = None) -> float:
    """Bytes crossing one machine's link in one direction per byte one rank hands to a call of
    ``op`` among ``scope``, all G ranks of every machine calling at once (N machines, W ranks):

    * allreduce: the machine's sum crosses as a two-level ring does, ``2 (N-1)/N`` (Open MPI's
      flat allreduce over ranks placed machine by machine measured so); "cross" runs G such
      rings side by side: ``G 2 (N-1)/N``;
    * allgather: what Open MPI's allgatherv algorithm for calls of ``bytes_per_rank`` moves
      across (:func:`parallax_nb.allgatherv.crossing_slices`: on 2 x 2 ranks 3 to 5 slices
      by size, where direct sends move 4); without a size, direct sends: each rank's slice to
      every rank on other machines, ``G (W-G)`` ("cross": ``G (N-1)``, every algorithm);
    * alltoall: a rank's tensor is spread over its peers, the share for other machines
      leaves: ``G (W-G)/W`` ("cross": ``G (N-1)/N``).
    """
    N, G = machines, workers_per_machine
    W = N * G
    if op == "allreduce":
        return 2.0 * (N - 1) / N * (G if scope == "cross" else 1)
    if op == "allgather":
        return G * crossing_slices(N, 1, bytes_per_rank) if scope == "cross" else crossing_slices(W, G, bytes_per_rank)
    return G * (W - G) / W if scope == "all" else G * (N - 1) / N


@dataclass(frozen=True)
class CollectiveFit:
    """``t = latency_s + bytes / (bandwidth_bps / 8)`` for one call of one op in one scope.

    ``samples`` timed sizes were fitted; ``max_relative_error`` is the largest
    ``|fit - measured| / measured`` among them (0 for defaults); ``points`` the measured
    ``(bytes per rank, seconds per call)`` pairs themselves (empty for defaults).
    """

    latency_s: float
    bandwidth_bps: float
    samples: int = 0
    max_relative_error: float = 0.0
    points: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "points", tuple((_finite("point bytes", b), _finite("point seconds", t))
                                                 for b, t in self.points))
        object.__setattr__(self, "latency_s", _finite("latency_s", self.latency_s))
        object.__setattr__(self, "bandwidth_bps", _finite("bandwidth_bps", self.bandwidth_bps, strict=True))
        object.__setattr__(self, "max_relative_error", _finite("max_relative_error", self.max_relative_error))

    def time_s(self, bytes_per_rank: float, calls: float = 1.0) -> float:
        """Seconds for ``calls`` calls that each hand ``bytes_per_rank`` bytes."""
        return calls * self.latency_s + calls * bytes_per_rank * 8.0 / self.bandwidth_bps


@dataclass(frozen=True)
class LinkFit:
    """What one machine's network link carries per call of one op in one scope, every rank
    calling at once, as the link's kernel counters count it (received + sent: payload,
    TCP/IP and Ethernet headers, ACKs, the MPI and Horovod messages that go with the call)::

        link_bytes(call) = overhead_bytes + bytes_per_handed_byte * bytes one rank hands

    ``points``: the measured ``(bytes one rank hands, link bytes per call, link packets per
    call)``, the mean over the machines' links.
    """

    overhead_bytes: float
    bytes_per_handed_byte: float
    points: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "overhead_bytes", _finite("link overhead_bytes", self.overhead_bytes))
        object.__setattr__(self, "bytes_per_handed_byte",
                           _finite("link bytes_per_handed_byte", self.bytes_per_handed_byte))
        object.__setattr__(self, "points", tuple(tuple(_finite("link point", v) for v in p) for p in self.points))

    def framing_factor(self, op: str, scope: str, machines: int, workers_per_machine: int) -> float:
        """Link bytes per payload byte crossing the link: the slope over the payload's share of
        a handed byte, both directions (``2 * link_factor``). The slope is measured between the
        two largest sizes (:func:`fit_link`), so the payload's share is taken at the largest
        (an allgatherv's algorithm, and what it moves across, changes with the size)."""
        largest = self.points[-1][0] if self.points else None
        return self.bytes_per_handed_byte / (2.0 * link_factor(op, scope, machines, workers_per_machine, largest))


@dataclass(frozen=True)
class Calibration:
    """Measured (or default) costs of one cluster shape; see the module docstring.

    ``fits`` maps ``"op/scope"`` (e.g. ``"alltoall/cross"``) to a :class:`CollectiveFit`.
    ``compute_time_s`` maps a model name to the seconds of one step's compute with every rank
    computing at once under the real placement (ranks sharing cores or devices), no
    communication. ``coordination_bytes_per_s`` and ``coordination_packets_per_s`` are what a
    machine's network link carries while Horovod runs but nothing trains and the cores are
    free (its background negotiation, idle); ``busy_coordination_bytes_per_s`` the same while
    every rank computes (the cores busy, as in a step: the loop then negotiates far less often;
    None when not measured, in files written before it was). All 0 on one machine or when no
    link counter could be read. ``measured`` is
    False for :meth:`defaults`; ``where`` says what was measured (``"loopback"``, a hostfile,
    ``"emulated 2x2@1Gbit/s"``) and ``created`` when (ISO 8601, UTC). ``horovod_env``: the
    ``HOROVOD_*`` environment variables the ranks ran with; ``horovod_cycle_time_ms`` the cycle
    time they give (module docstring). ``link_fits`` maps ``"op/scope"`` to a :class:`LinkFit`:
    what a machine's link carried per call (empty without link counters to read, and in files
    written before they were measured). ``baseline_compute_time_s`` maps a model name to
    ``{baseline key: seconds}``: the compute of the Horovod baselines (``"horovod"``,
    ``"sparse_as_dense"``), which run the model as Keras builds it (its ``Embedding`` layers
    copy the whole table on every read once a sparse update has written it), measured like
    ``compute_time_s``; ``{}`` for a model with no sparse gradient (they run the runtime's
    program); a model missing here was calibrated before they were measured.
    ``compute_recheck_time_s``: ``compute_time_s`` timed again at the end of the calibration
    (module docstring; empty in files written before it was). ``call_pricing``: how the
    ``fits`` price calls below 1 MiB, one of :data:`CALL_PRICINGS` (module docstring).
    """

    machines: int
    workers_per_machine: int
    fits: dict = field(default_factory=dict, hash=False)
    compute_time_s: dict = field(default_factory=dict, hash=False)
    coordination_bytes_per_s: float = 0.0
    coordination_packets_per_s: float = 0.0
    measured: bool = True
    where: str = ""
    created: str = ""
    horovod_env: dict = field(default_factory=dict, hash=False)
    busy_coordination_bytes_per_s: float | None = None
    link_fits: dict = field(default_factory=dict, hash=False)
    baseline_compute_time_s: dict = field(default_factory=dict, hash=False)
    rank_cores: int | None = None
    compute_recheck_time_s: dict = field(default_factory=dict, hash=False)
    call_pricing: str = CALL_PRICING_CHAIN

    def __post_init__(self):
        for name in ("machines", "workers_per_machine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"calibration {name} must be a whole number >= 1, got {value!r}")
        object.__setattr__(self, "fits", _by_op_scope(self.fits, CollectiveFit, "fit"))
        object.__setattr__(self, "_fit_of", {})   # (op, scope) -> fit, as fit() found it: not a field
        object.__setattr__(self, "link_fits", _by_op_scope(self.link_fits, LinkFit, "link fit"))
        object.__setattr__(self, "compute_time_s", {str(k): _finite(f"compute_time_s[{k!r}]", v, strict=True)
                                                    for k, v in dict(self.compute_time_s).items()})
        object.__setattr__(self, "baseline_compute_time_s", _baseline_compute(self.baseline_compute_time_s))
        recheck = self.compute_recheck_time_s
        if not isinstance(recheck, dict):
            raise ConfigError(f"calibration compute_recheck_time_s must map a model to seconds, got {recheck!r}")
        object.__setattr__(self, "compute_recheck_time_s",
                           {str(k): _finite(f"compute_recheck_time_s[{k!r}]", v, strict=True) for k, v in recheck.items()})
        for name in ("coordination_bytes_per_s", "coordination_packets_per_s"):
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        if self.busy_coordination_bytes_per_s is not None:
            object.__setattr__(self, "busy_coordination_bytes_per_s",
                               _finite("busy_coordination_bytes_per_s", self.busy_coordination_bytes_per_s))
        if not isinstance(self.horovod_env, dict) or not all(
                k in HOROVOD_TIMING_SETTINGS and isinstance(v, str) for k, v in self.horovod_env.items()):
            raise ConfigError(f"calibration horovod_env must map Horovod settings to strings, got {self.horovod_env!r}",
                              hint=f"names among {', '.join(HOROVOD_TIMING_SETTINGS)}")
        object.__setattr__(self, "horovod_env", dict(sorted(self.horovod_env.items())))
        if self.rank_cores is not None and (isinstance(self.rank_cores, bool) or not isinstance(self.rank_cores, int)
                                            or self.rank_cores < 1):
            raise ConfigError(f"calibration rank_cores must be a whole number >= 1 (the cores a rank could use), "
                              f"got {self.rank_cores!r}")
        if self.call_pricing not in CALL_PRICINGS:
            raise ConfigError(f"calibration call_pricing must be one of {CALL_PRICINGS}, got {self.call_pricing!r}")
        if horovod_cycle_time_ms(self.horovod_env) is None:
            raise ConfigError(f"calibration horovod_env has HOROVOD_CYCLE_TIME="
                              f"{self.horovod_env['HOROVOD_CYCLE_TIME']!r}, not a number of milliseconds >= 0")

    @property
    def step_coordination_bytes_per_s(self) -> float:
        """Horovod's coordination on a machine's link during a training step, bytes per second:
        the busy rate when measured, else (older files) the idle rate, an upper bound."""
        busy = self.busy_coordination_bytes_per_s
        return self.coordination_bytes_per_s if busy is None else busy

    @property
    def horovod_cycle_time_ms(self) -> float:
        """Horovod's cycle time (ms) during the calibration (module docstring)."""
        return horovod_cycle_time_ms(self.horovod_env)

    def settings_mismatch(self, run_horovod_env, run_rank_cores: int | None = None) -> str:
        """"" when a run whose environment held ``run_horovod_env`` (a mapping; None: not known)
        ran under this calibration's Horovod settings, and its ranks had ``run_rank_cores``
        cores each as the calibration's did (None: not known, not checked), else sentences
        naming the differences (the cycle time first: it sets the idle link traffic and the
        wait before each collective)."""
        if not self.measured:
            return ""
        horovod = self._horovod_mismatch(run_horovod_env) if run_horovod_env is not None else ""
        cores = self._cores_mismatch(run_rank_cores)
        if horovod and cores:
            return f"{horovod}. {cores[0].upper()}{cores[1:]}"
        return horovod or cores

    def _cores_mismatch(self, run_rank_cores) -> str:
        if run_rank_cores is None or run_rank_cores == self.rank_cores:
            return ""
        ours = ("not recorded in the calibration, written before ranks that share a host's cores bound "
                "themselves to one each" if self.rank_cores is None else f"{self.rank_cores} in the calibration")
        return (f"calibrated with other cores per rank than the run ({ours}; {run_rank_cores} in the run): "
                f"its compute and per-call times are not the run's; calibrate again on the run's ranks")

    def _horovod_mismatch(self, run_horovod_env) -> str:
        run = horovod_settings(run_horovod_env)
        differences = []
        ours, theirs = self.horovod_cycle_time_ms, horovod_cycle_time_ms(run)
        if theirs != ours:
            differences.append(f"HOROVOD_CYCLE_TIME {_ms(ours)} in the calibration, {_ms(theirs)} in the run")
        for key in sorted((set(self.horovod_env) | set(run)) - {"HOROVOD_CYCLE_TIME"}):
            if self.horovod_env.get(key) != run.get(key):
                differences.append(f"{key} {self.horovod_env.get(key, 'unset')!s} in the calibration, "
                                   f"{run.get(key, 'unset')!s} in the run")
        if not differences:
            return ""
        return ("calibrated under other Horovod settings than the run (" + "; ".join(differences)
                + "): its coordination traffic and per-call times are not the run's; calibrate with the "
                  "run's environment")

    @property
    def workers(self) -> int:
        return self.machines * self.workers_per_machine

    @property
    def shape(self) -> str:
        """``"2 machine(s) x 2 rank(s)"``: the cluster shape this calibration is for."""
        return f"{self.machines} machine(s) x {self.workers_per_machine} rank(s)"

    @property
    def label(self) -> str:
        """What an estimate made with this calibration says about its time figures."""
        if not self.measured:
            return "uncalibrated (defaults)"
        return (f"calibrated on {self.where or self.shape}, Horovod cycle {self.horovod_cycle_time_ms:g} ms"
                + (", small calls in stride" if self.call_pricing == CALL_PRICING_STRIDE else "")
                + (f", {self.created}" if self.created else ""))

    def fit(self, op: str, scope: str = "all") -> CollectiveFit:
        """The fit of ``op`` in ``scope``; a scope not measured falls back to "all"."""
        found = self._fit_of.get((op, scope))   # asked thousands of times per replan
        if found is not None:
            return found
        for key in (f"{op}/{scope}", f"{op}/all"):
            if key in self.fits:
                self._fit_of[op, scope] = self.fits[key]
                return self.fits[key]
        raise ConfigError(f"this calibration has no figure for {op!r} calls (scope {scope!r})",
                          hint=f"it holds {sorted(self.fits)}; measure again with px.calibrate(...)")

    def link_fit(self, op: str, scope: str = "all") -> "LinkFit | None":
        """The link fit of ``op`` in ``scope`` (a scope not measured falls back to "all"), or None."""
        return self.link_fits.get(f"{op}/{scope}") or self.link_fits.get(f"{op}/all")

    def link_framing(self, op: str, scope: str = "all") -> float | None:
        """Link bytes per payload byte of ``op`` in ``scope``, measured: the
        :meth:`LinkFit.framing_factor` of the fit :meth:`link_fit` falls back to, taken at that
        fit's own scope; None without one."""
        for measured in (scope, "all"):
            fit = self.link_fits.get(f"{op}/{measured}")
            if fit is not None:
                return fit.framing_factor(op, measured, self.machines, self.workers_per_machine)
        return None

    @property
    def payload_framing_factor(self) -> float | None:
        """Link bytes per payload byte that crosses a machine's link, measured: the median of
        the link fits' :meth:`LinkFit.framing_factor` over the scopes that cross machines
        ("all", "cross"); None without link fits (one machine, no counters, older files)."""
        factors = [fit.framing_factor(*key.split("/"), self.machines, self.workers_per_machine)
                   for key, fit in self.link_fits.items() if not key.endswith("/machine")]
        return statistics.median(factors) if self.machines > 1 and factors else None

    @functools.cached_property
    def link_bytes_per_s(self) -> float | None:
        """The pace a machine's link sustained in each direction, bytes per second, as the
        calibration read it: per op and scope that crosses machines, the link bytes of its
        largest timed call (received + sent, so halved) over that call's time; the median
        over them. None on one machine, and without link points (no counters, older files).

        A step whose bytes stream as a call's do moves them no faster than this, however few
        its calls (:func:`.cost.timing.link_floor_s`). Read off the largest calls because there
        the payload, not the per-call start, sets the time. The median, not the fastest op nor
        the link's stated bandwidth: on the emulated 2 x 2 network (2026-11-29) this pace read
        68-74 % of the bandwidth, and the LM's steps streamed near it at 100 Mbit/s (with this pace
        their predictions were within 0.6-10.7 %, with the bandwidth 23-47 % short). A step of
        many small flows at once can beat it: the recommender's plain Horovod carried 12.1-12.3
        MB/s each way at 100 Mbit/s against a pace read at 8.6-9.1, and ran 28.6-30.9 % faster
        than predicted in four invocations (2.3-5.2 % at the bandwidth)."""
        if self.machines < 2:
            return None
        paces = []
        for key, link in self.link_fits.items():
            fit = self.fits.get(key)
            if key.endswith("/machine") or fit is None or not link.points or not fit.points:
                continue
            handed, link_bytes = link.points[-1][0], link.points[-1][1]
            timed = [seconds for size, seconds in fit.points if size == handed]
            if timed and link_bytes > 0 and min(timed) > 0:
                paces.append(link_bytes / 2.0 / statistics.median(timed))
        return statistics.median(paces) if paces else None

    def with_link_pace(self, bytes_per_s: float, overhead_bytes: float = 0.0) -> "Calibration":
        """This calibration as if its calls across machines had been read at 256 B and 4 MiB a
        rank, their links carrying ``overhead_bytes`` a call besides twice the payload that
        crosses (:func:`link_factor`), the 4 MiB call at ``bytes_per_s`` each way: its
        :attr:`link_bytes_per_s` is then ``bytes_per_s``. A what-if for a link whose sustained
        pace is known; only those fits' points and the link fits change (the fits still price
        the calls). On one machine, unchanged."""
        if not (isinstance(bytes_per_s, (int, float)) and math.isfinite(bytes_per_s) and bytes_per_s > 0):
            raise ConfigError(f"a link's pace must be a positive number of bytes per second, got {bytes_per_s!r}")
        if self.machines < 2:
            return self
        large = 4 << 20
        fits, links = dict(self.fits), {}
        for key, fit in self.fits.items():
            op, scope = key.split("/")
            if scope == "machine":
                continue
            carried = [overhead_bytes + 2.0 * link_factor(op, scope, self.machines, self.workers_per_machine, b) * b
                       for b in (256, large)]
            fits[key] = dataclasses.replace(fit, points=((256, fit.time_s(256)), (large, carried[1] / 2.0 / bytes_per_s)))
            links[key] = fit_link([(256, carried[0]), (large, carried[1])])
        return dataclasses.replace(self, fits=fits, link_fits=links)

    def compute_for(self, model_name: str, baseline: str | None = None) -> float | None:
        """Seconds of compute per step of ``model_name`` under the real placement, if measured;
        with a Horovod ``baseline`` key, that baseline's own where measured (the runtime's
        where the model has no sparse gradient, or the calibration predates the baselines')."""
        if baseline is not None:
            own = self.baseline_compute_time_s.get(model_name, {}).get(baseline)
            if own is not None:
                return own
        return self.compute_time_s.get(model_name)

    def compute_drift(self, model_name: str) -> str:
        """A sentence when ``model_name``'s compute read more than :data:`COMPUTE_DRIFT_NOTED`
        apart at the start and the end of this calibration, else ``""``."""
        first, again = self.compute_time_s.get(model_name), self.compute_recheck_time_s.get(model_name)
        if first is None or again is None or abs(again - first) <= COMPUTE_DRIFT_NOTED * min(first, again):
            return ""
        return (f"compute drifted {100 * (again - first) / first:+.0f} % while calibrating ({first * 1e3:.1f} ms "
                f"at the start, {again * 1e3:.1f} ms at the end): the cores' speed moved, and step times can miss "
                f"by as much")

    def baseline_compute_known(self, model_name: str) -> bool:
        """Whether this calibration measured the Horovod baselines' compute of ``model_name``
        (or found it the runtime's program); False for files written before it did."""
        return model_name in self.baseline_compute_time_s

    def check_shape(self, machines: int, workers_per_machine: int) -> None:
        """Refuse a calibration taken on another cluster shape, naming both."""
        if (machines, workers_per_machine) != (self.machines, self.workers_per_machine):
            wanted = f"{machines} machine(s) x {workers_per_machine} rank(s)"
            raise ConfigError(
                f"this calibration was taken on {self.shape} ({self.where or 'unknown place'}), "
                f"but the plan is for {wanted}",
                hint=f"calibrate the cluster you plan for (python -m parallax_nb calibrate --np "
                     f"{machines * workers_per_machine} ...), or plan without a calibration (defaults)")

    @classmethod
    def defaults(cls, machines: int, workers_per_machine: int, bandwidth_bps: float,
                 latency_s: float) -> "Calibration":
        """Documented defaults from a cluster's link, in the units of a measured fit (bytes one
        rank hands to a call, every rank calling at once).

        Across machines a call pays :data:`DEFAULT_CALL_OVERHEAD_S` plus ``latency_s`` per
        message round (allreduce ``2 (n-1)``, allgather and alltoall ``n - 1``; ``n = W`` ranks
        for "all", ``N`` machines for "cross"), and moves its bytes at ``bandwidth_bps`` per
        direction of the link divided by :func:`link_factor` (how many bytes cross one
        machine's link, one way, per byte a rank hands; for an allgather, by Open MPI's
        algorithm for calls of :data:`DEFAULT_BANDWIDTH_CALL_BYTES`). Inside a machine (and on one
        machine) a call pays :data:`DEFAULT_MACHINE_LATENCY_S` plus the overhead and moves
        bytes at :data:`DEFAULT_MACHINE_BANDWIDTH_BPS`. No compute figure (the profile's step
        time is used)."""
        inside = CollectiveFit(DEFAULT_MACHINE_LATENCY_S + DEFAULT_CALL_OVERHEAD_S, DEFAULT_MACHINE_BANDWIDTH_BPS)
        participants = {"all": machines * workers_per_machine, "cross": machines}
        fits = {}
        for op in COLLECTIVE_OPS:
            fits[f"{op}/machine"] = inside
            for scope, n in participants.items():
                if machines == 1:
                    fits[f"{op}/{scope}"] = inside
                    continue
                rounds = (2 if op == "allreduce" else 1) * (n - 1)
                factor = link_factor(op, scope, machines, workers_per_machine, DEFAULT_BANDWIDTH_CALL_BYTES)
                fits[f"{op}/{scope}"] = CollectiveFit(DEFAULT_CALL_OVERHEAD_S + rounds * latency_s,
                                                      bandwidth_bps / factor)
        return cls(machines, workers_per_machine, fits, measured=False, where="defaults")

    def to_dict(self) -> dict:
        return {
            "schema": CALIBRATION_SCHEMA, "schema_version": CALIBRATION_SCHEMA_VERSION,
            "machines": self.machines, "workers_per_machine": self.workers_per_machine,
            "fits": {k: {"latency_s": f.latency_s, "bandwidth_bps": f.bandwidth_bps, "samples": f.samples,
                         "max_relative_error": f.max_relative_error, "points": [list(p) for p in f.points]}
                     for k, f in sorted(self.fits.items())},
            "compute_time_s": dict(sorted(self.compute_time_s.items())),
            "compute_recheck_time_s": dict(sorted(self.compute_recheck_time_s.items())),
            "baseline_compute_time_s": {m: dict(sorted(b.items())) for m, b in sorted(self.baseline_compute_time_s.items())},
            "coordination_bytes_per_s": self.coordination_bytes_per_s,
            "coordination_packets_per_s": self.coordination_packets_per_s,
            "busy_coordination_bytes_per_s": self.busy_coordination_bytes_per_s,
            "measured": self.measured, "where": self.where, "created": self.created,
            "horovod_env": dict(self.horovod_env), "horovod_cycle_time_ms": self.horovod_cycle_time_ms,
            "rank_cores": self.rank_cores, "call_pricing": self.call_pricing,
            "link_fits": {k: {"overhead_bytes": f.overhead_bytes, "bytes_per_handed_byte": f.bytes_per_handed_byte,
                              "points": [list(p) for p in f.points]} for k, f in sorted(self.link_fits.items())},
        }

    def to_json(self, path: str | None = None) -> str:
        from .jsonfile import dump_json
        return dump_json(self.to_dict(), path)

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        from .jsonfile import check_schema
        check_schema(d, CALIBRATION_SCHEMA, CALIBRATION_SCHEMA_VERSION, "calibration", ConfigError,
                     make_hint="make one with python -m parallax_nb calibrate --np N -o calibration.json",
                     version_hint="calibrate again with this version of parallax_nb")
        try:
            fits = d["fits"]
            if not isinstance(fits, dict) or not all(isinstance(f, dict) for f in fits.values()):
                raise ConfigError("calibration 'fits' must map 'op/scope' to {latency_s, bandwidth_bps}")
            return cls(machines=d["machines"], workers_per_machine=d["workers_per_machine"],
                       fits={k: CollectiveFit(**f) for k, f in fits.items()},
                       compute_time_s=d.get("compute_time_s", {}),
                       coordination_bytes_per_s=d.get("coordination_bytes_per_s", 0.0),
                       coordination_packets_per_s=d.get("coordination_packets_per_s", 0.0),
                       measured=bool(d.get("measured", True)), where=str(d.get("where", "")),
                       created=str(d.get("created", "")), horovod_env=d.get("horovod_env", {}),
                       busy_coordination_bytes_per_s=d.get("busy_coordination_bytes_per_s"),
                       link_fits=_link_fits(d.get("link_fits", {})),
                       baseline_compute_time_s=d.get("baseline_compute_time_s", {}),
                       rank_cores=d.get("rank_cores"),
                       compute_recheck_time_s=d.get("compute_recheck_time_s", {}),
                       call_pricing=d.get("call_pricing", CALL_PRICING_CHAIN))
        except KeyError as e:
            raise ConfigError(f"calibration lacks field {e.args[0]!r}",
                              hint="calibrate again: python -m parallax_nb calibrate --np N -o calibration.json") from None
        except TypeError as e:
            raise ConfigError(f"calibration has a malformed entry: {e}",
                              hint="calibrate again: python -m parallax_nb calibrate --np N -o calibration.json") from None

    @classmethod
    def from_json(cls, path_or_text: str) -> "Calibration":
        from .jsonfile import load_json
        return cls.from_dict(load_json(path_or_text, what="calibration"))


def _by_op_scope(entries, kind, what: str) -> dict:
    """``{"op/scope": kind}`` from a mapping of fits or their dicts; a ConfigError names a key
    that is not an op and a scope."""
    out = {}
    for key, fit in dict(entries).items():
        op, _, scope = str(key).partition("/")
        if op not in COLLECTIVE_OPS or scope not in SCOPES:
            raise ConfigError(f"calibration {what} {key!r} is not 'op/scope'",
                              hint=f"op one of {COLLECTIVE_OPS}, scope one of {SCOPES}")
        out[f"{op}/{scope}"] = fit if isinstance(fit, kind) else kind(**fit)
    return out


def _link_fits(entries) -> dict:
    """A file's ``link_fits`` as they are, once they are a mapping of dicts (the Calibration
    makes the :class:`LinkFit` values and checks the keys)."""
    if not isinstance(entries, dict) or not all(isinstance(f, dict) for f in entries.values()):
        raise ConfigError("calibration 'link_fits' must map 'op/scope' to {overhead_bytes, bytes_per_handed_byte}")
    return entries


def _ms(value: float | None) -> str:
    return "unreadable" if value is None else f"{value:g} ms"


def fit_collective(bytes_per_call, seconds_per_call) -> CollectiveFit:
    """Fit ``t = latency_s + bytes * 8 / bandwidth_bps`` to timed calls of one op and scope.

    Least squares on the *relative* error (each point weighted by ``1 / t_measured**2``), so
    the small calls that fix the latency count as much as the large ones that fix the
    bandwidth. Latency is kept >= 0: when the free fit gives a negative intercept, the line
    through the origin is fitted instead. A slope <= 0 (times that do not grow with size, only
    noise) gets the bandwidth at which the largest call's bytes take 1 % of the latency.
    Needs at least two distinct sizes.
    """
    points = [(float(b), float(s)) for b, s in zip(bytes_per_call, seconds_per_call)]
    if len({b for b, _ in points}) < 2 or any(not (s > 0 and math.isfinite(s)) or b < 0 for b, s in points):
        raise ConfigError(f"a collective fit needs >= 2 distinct sizes and positive finite times, got {points!r}")
    weights = [1.0 / (s * s) for _, s in points]
    sw = sum(weights)
    sx = sum(w * b for w, (b, _) in zip(weights, points))
    sy = sum(w * s for w, (_, s) in zip(weights, points))
    sxx = sum(w * b * b for w, (b, _) in zip(weights, points))
    sxy = sum(w * b * s for w, (b, s) in zip(weights, points))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    latency = (sy - slope * sx) / sw
    if latency < 0:
        latency, slope = 0.0, sxy / sxx
    largest = max(b for b, _ in points)
    if slope <= 0:
        latency = sy / sw
        slope = 0.01 * latency / largest
    fit = CollectiveFit(latency, 8.0 / slope)
    error = max(abs(fit.time_s(b) - s) / s for b, s in points)
    return CollectiveFit(latency, 8.0 / slope, samples=len(points), max_relative_error=error, points=tuple(points))


def fit_link(points) -> LinkFit:
    """Fit ``link_bytes = overhead_bytes + bytes_per_handed_byte * bytes`` to one op and scope's
    ``(bytes one rank hands, link bytes per call, link packets per call)`` points.

    The slope comes from the two largest sizes, where MPI moves the bytes by its bandwidth
    algorithms; the overhead is what the slope leaves at the smallest size (the link bytes a
    call carries besides its payload: headers, ACKs, MPI's and Horovod's messages while it
    runs), at least 0. The smallest size should be tiny (``px.calibrate`` times 256 bytes):
    there the payload, however an algorithm moves it, is small against the overhead, and a
    large call's counter noise (±2 % of megabytes) does not enter. A slope below 0 (no growth
    with size: only noise) is taken as 0. Needs at least two distinct sizes.
    """
    rows = sorted((float(p[0]), float(p[1]), float(p[2]) if len(p) > 2 else 0.0) for p in points)
    if len({b for b, _, _ in rows}) < 2 or any(not (math.isfinite(v) and v >= 0) for row in rows for v in row):
        raise ConfigError(f"a link fit needs >= 2 distinct sizes and finite link bytes >= 0, got {points!r}")
    (b1, l1, _), (b2, l2, _) = rows[-2], rows[-1]
    slope = max(0.0, (l2 - l1) / (b2 - b1)) if b2 > b1 else 0.0
    overhead = rows[0][1] - slope * rows[0][0]
    return LinkFit(max(0.0, overhead), slope, points=tuple(rows))
