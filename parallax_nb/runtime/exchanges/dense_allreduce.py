"""AR, dense: one Horovod allreduce (average) per dense AR gradient, as
``hvd.DistributedGradientTape`` issues them by default: each starts as soon as its gradient
exists, so communication overlaps the rest of the backward pass, and Horovod's background
thread fuses those ready in the same cycle into one call (the cost model charges them as one
call of the summed bytes). The step's loss and health flags, which depend on every gradient,
take one small allreduce of their own, issued with the last gradients.

With local aggregation too: a machine's ranks hold consecutive ranks, and MPI's allreduce
over them already crosses machines about as a two-level ring would (on the emulated 2 x 2
network Open MPI's allreduce of the CNN's 0.33 MB carried 2.02 m per machine link against the
two-level 4 m (N - 1) / N = 2 m), while the two-level ring written as four chained alltoalls
cost the CNN twice its step time.

Bytes: each gradient's handed bytes ``s`` (read from the tensor) times the ring factor. On
M machines of G > 1 consecutive ranks a machine sends and receives ``2 (M - 1) / M * s`` each
way, ``1/G`` of it per rank, with local aggregation on or off (the allreduce is the same call,
and the link carried as much both ways: on the emulated 2 x 2 network the LM realistic's dense
gradients, charged ``2 (W - 1) / W * s * r`` per rank without local aggregation before, were
predicted 0.79 MB per machine and step above the link's counters). Otherwise (one rank per
machine, or ranks not placed machine by machine) a rank sends and receives
``2 (W - 1) / W * s`` each way, scaled by the share of its peers on other machines
``r = (W - G) / (W - 1)``.
"""
from __future__ import annotations

import tensorflow as tf

from ...types import Collective, Kind, Method
from ..accounting import ring_allreduce_bytes
from ..tensor_ops import op_tag
from .base import Exchange, handed_bytes


class DenseAllreduce(Exchange):
    method, kind = Method.AR, Kind.DENSE

    def gradients(self, items, carried=None):
        wire = self.wire
        dense = [(sync, grads[0]) for sync, grads in items if grads[0] is not None]
        if not dense:
            return [], None
        if wire.ranks > 1:
            hvd = wire.hvd
            reduced = [hvd.allreduce(g, op=hvd.Average, name=f"px_ar_{i}_{op_tag(sync.name)}", ignore_name_scope=True)
                       for i, (sync, g) in enumerate(dense)]
            if carried is not None:
                carried = hvd.allreduce(carried, op=hvd.Average, name="px_ar_carried", ignore_name_scope=True)
        else:
            reduced = [g for _, g in dense]
        for (sync, grad) in dense:
            sent, received = self._wire_bytes(handed_bytes(grad))
            wire.ledger.add(sync.name, sent, received)
        return [(g, sync.variable) for (sync, _), g in zip(dense, reduced)], carried

    def _wire_bytes(self, handed):
        t = self.wire.topology
        if t.uniform and t.machines > 1 and t.workers_per_machine > 1:
            # the machine's ring share among M machines, 1/G of it per rank: the one allreduce
            # over consecutive ranks crosses so whether local aggregation is on or off
            sent, received = ring_allreduce_bytes(handed, t.machines)
            return sent / t.workers_per_machine, received / t.workers_per_machine
        sent, received = ring_allreduce_bytes(handed, self.wire.ranks)
        return sent * self.wire.remote_share, received * self.wire.remote_share

    def collectives(self) -> list[Collective]:
        """The dense AR gradients' allreduces, fused by Horovod: one call (none without any)."""
        return [Collective("allreduce", 1)] if self.served else []
