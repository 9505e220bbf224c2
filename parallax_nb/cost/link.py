"""Link bytes as a machine's kernel counters see them: payload, framing and coordination.

The cost model's bytes (:mod:`.model`) are **payload**: what the collectives hand to MPI and
what crosses the machine's link on their behalf. The link also carries

* the headers of every TCP segment and of the ACKs that answer them. On Ethernet with a
  1,500-byte MTU a segment carries at most ``MSS = 1500 - 20 (IPv4) - 32 (TCP with the
  timestamps option Linux sends) = 1,448`` payload bytes under ``H = 14 (Ethernet) + 20 + 32 =
  66`` header bytes as the interface counters count a frame (no preamble, no FCS), and the
  receiver ACKs every second full segment (delayed ACK) with a frame of ``H`` bytes::

      framing_factor = 1 + H * (1 + 1 / SEGMENTS_PER_ACK) / MSS = 1 + 66 * 1.5 / 1448 = 1.0684

  Segments are assumed full: many small messages (a recommender's short alltoalls) carry
  more headers per payload byte, segmentation offload fewer;
* Horovod's coordination: its background loop negotiates across the links every cycle
  (``HOROVOD_CYCLE_TIME``, 1 ms by default) once Horovod runs, whether or not a step needs
  it. How often it gets to do so depends on the cores: on an idle emulated 1 Gbit/s link of
  2 x 2 ranks on 2 cores it carried 780 KB/s at a 1 ms cycle and 5.9 MB/s at 0.1 ms, but
  only 3-43 KB/s while every rank computed (the loop's thread waits for a core). Measured
  link bytes of LM steps (2026-11-24, 0.1 ms cycle, 135-270 ms steps) carried 0.996-1.042 x
  the payload, with no trend in the step time: idle rate x step would have added 0.8-1.6 MB
  (20-40 %). So the rate charged is the calibration's **busy** rate
  (:attr:`~parallax_nb.calibration.Calibration.step_coordination_bytes_per_s`, bytes per
  second received + sent by one machine, measured while every rank computes; the idle rate
  for calibrations without it), for the step's duration. Without a calibration it is 0 and
  the prediction says "uncalibrated".

So, per machine per step (bytes received + sent; seconds)::

    link_bytes = payload_bytes * framing_factor + step_coordination_bytes_per_s * step_time_s

**Calibrated** (a calibration with link fits, :attr:`~parallax_nb.calibration.Calibration.link_fits`:
``px.calibrate`` read each machine's link counters around its timed calls), the measured
figures replace the assumed ones::

    link_bytes = sum over op/scope of payload_bytes[op/scope] * framing_factor[op/scope]
               + sum over the step's calls of the call's measured overhead_bytes
               + step_coordination_bytes_per_s * step_time_s

``payload_bytes[op/scope]`` is the payload the calls of one op and scope carry across machines
(:func:`.timing.payload_by_call`); ``framing_factor[op/scope]`` the link bytes that op and scope
measured per byte the model says crosses (:meth:`~parallax_nb.calibration.LinkFit.framing_factor`):
on the emulated network's veth links, whose counters see segmentation-offloaded super-frames,
1.00 for alltoall and allreduce, not 1.0684, and 0.98-0.99 for Open MPI's allgatherv, whose
payload the model counts as its algorithm moves it (:mod:`parallax_nb.allgatherv`; against
direct sends the allgatherv read 1.06 among 8 ranks on 4 machines, Bruck's algorithm, and
0.77-1.17 by size on 2 x 2 ranks). Payload no call names (asynchronous
point-to-point traffic) takes the median factor over the scopes. A call's ``overhead_bytes``
(:class:`~parallax_nb.calibration.LinkFit`) is what the link carried per call besides its
payload: the headers and ACKs of its messages and Horovod's negotiation while it runs
(measured on 2 x 2 ranks at 1 Gbit/s, Horovod's 1 ms cycle: about 2.4 KB per alltoall across
machines; 0.8 KB per call inside a machine, where no payload crosses: Horovod's negotiation
during its ~1 ms). On payload alone a recommender's many short calls were predicted 8-18 %
low. Counted, they scattered from -11 % to +6 % (9 cluster starts, 2 x 2 ranks at 1 Gbit/s)
while the overhead was read around chains of 3 calls: a call's bytes rise with its duration
at about the idle loop's rate, and the first call of a chain waits for the loop's next cycle.
Read around chains of 12 (:mod:`parallax_nb.runtime.calibrate`), they come out at -2.1 % to
+2.5 % (14 runs, 2026-11-25), against a run's own 152-160 KB per step. ``calls`` names every
call a rank issues per step by op and scope (``{"alltoall/cross": 6, ...}``, the runtime's
own listing, :mod:`.timing`), inside a machine too.

Pure Python.
"""
from __future__ import annotations

import math

from ..errors import ConfigError
from ..types import LinkBytes

ETHERNET_HEADER_BYTES = 14
IPV4_HEADER_BYTES = 20
TCP_HEADER_BYTES = 32          # 20 + the 12-byte timestamps option
MTU_BYTES = 1500
TCP_SEGMENT_BYTES = MTU_BYTES - IPV4_HEADER_BYTES - TCP_HEADER_BYTES      # MSS, 1,448
FRAME_HEADER_BYTES = ETHERNET_HEADER_BYTES + IPV4_HEADER_BYTES + TCP_HEADER_BYTES   # 66
SEGMENTS_PER_ACK = 2


def framing_factor(segment_bytes: int = TCP_SEGMENT_BYTES, header_bytes: int = FRAME_HEADER_BYTES,
                   segments_per_ack: int = SEGMENTS_PER_ACK) -> float:
    """Link bytes per payload byte: ``1 + header_bytes * (1 + 1 / segments_per_ack) / segment_bytes``
    (1.0684 for full 1,448-byte segments under 66 header bytes, one ACK per two segments)."""
    for name, value in (("segment_bytes", segment_bytes), ("header_bytes", header_bytes),
                        ("segments_per_ack", segments_per_ack)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "header_bytes" else 1):
            raise ConfigError(f"framing_factor: {name} must be a whole number >= "
                              f"{0 if name == 'header_bytes' else 1}, got {value!r}")
    return 1.0 + header_bytes * (1.0 + 1.0 / segments_per_ack) / segment_bytes


def predict_link_bytes(payload_bytes_per_step: float, step_time_s: float, calibration=None,
                       calls: dict | None = None, payload_calls: dict | None = None) -> LinkBytes:
    """What one machine's link carries per step, received + sent (module docstring).

    ``payload_bytes_per_step``: the cost model's bytes per machine per step
    (``Estimate.bytes_per_machine_per_step``); ``step_time_s``: the step's duration, seconds;
    ``calibration``: a :class:`~parallax_nb.calibration.Calibration` whose
    ``step_coordination_bytes_per_s`` is charged and whose link fits, when it has them, price
    the framing and the ``calls`` (``{"op/scope": calls per step}``), or None (no
    coordination, "uncalibrated"). ``payload_calls`` (``{"op/scope": payload bytes}``, at
    most the payload; :func:`.timing.payload_by_call`) frames each call's payload at its own
    op and scope's measured factor; the rest at the median factor.
    """
    for name, value in (("payload_bytes_per_step", payload_bytes_per_step), ("step_time_s", step_time_s)):
        if not _finite_at_least_0(value):
            raise ConfigError(f"predict_link_bytes: {name} must be a finite number >= 0, got {value!r}",
                              hint="pass the estimate's bytes per machine per step and a step time in seconds")
    payload = float(payload_bytes_per_step)
    rate = float(getattr(calibration, "step_coordination_bytes_per_s", 0.0) or 0.0)
    factor = getattr(calibration, "payload_framing_factor", None) if calibration is not None else None
    call_bytes, count = 0.0, 0
    calls = tuple(sorted((str(k), int(n)) for k, n in (calls or {}).items()))
    if calibration is None:
        source = "uncalibrated: Horovod's coordination not counted (0 B/s)"
    elif not getattr(calibration, "measured", True):
        source = "uncalibrated defaults: Horovod's coordination not counted (0 B/s)"
    else:
        source = f"coordination {rate / 1e3:.0f} KB/s, {calibration.label}"
    for key, value in (payload_calls or {}).items():
        if not _finite_at_least_0(value):
            raise ConfigError(f"predict_link_bytes: the payload of {key!r} must be a finite number of bytes >= 0, "
                              f"got {value!r}")
    shares = tuple(sorted((str(k), float(v)) for k, v in (payload_calls or {}).items() if v > 0))
    if factor is None:
        framing = payload * (framing_factor() - 1.0)
    else:
        framing = _measured_framing(payload, shares, max(1.0, factor), calibration)
        for key, n in calls:
            op, _, scope = key.partition("/")
            fit = calibration.link_fit(op, scope)
            if fit is not None:
                call_bytes += n * fit.overhead_bytes
                count += n
        overall = 1.0 + framing / payload if payload > 0 else max(1.0, factor)
        source = f"framing x{overall:.3f} and {count} calls' overhead as measured; " + source
    return LinkBytes(payload_bytes=payload, framing_bytes=framing,
                     coordination_bytes=rate * float(step_time_s), step_time_s=float(step_time_s),
                     coordination=source, call_bytes=call_bytes, calls=calls, payload_calls=shares)


def _finite_at_least_0(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _measured_framing(payload: float, shares: tuple, median_factor: float, calibration) -> float:
    """Framing bytes of ``payload`` under a calibration's link fits: each ``(op/scope, bytes)``
    share at its fit's own factor (each op's link bytes per byte of the payload the model
    counts; the allgatherv's as its algorithm moves it), the
    payload no share names at ``median_factor``. A factor below 1 is the counters' noise: a
    link carries at least the payload."""
    framing, named = 0.0, 0.0
    for key, part in shares:
        op, _, scope = key.partition("/")
        factor = calibration.link_framing(op, scope)
        if factor is not None:
            framing += part * (max(1.0, factor) - 1.0)
            named += part
    return framing + max(0.0, payload - named) * (median_factor - 1.0)
