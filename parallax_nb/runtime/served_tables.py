"""What one rank of an asynchronous PS serves: its partitions of every PS variable and their
optimizer slots, and what an owner does with them: read rows, copy partitions, apply a push,
take or replace the whole state. Plain numpy, no MPI and no lock: :class:`.async_ps.AsyncPS`
calls it under the rank's lock, from the worker or the serving thread.

Rows are owned as in the synchronous PS (:mod:`.partitioning`): row ``i`` of a variable split
into ``P`` partitions lives in partition ``p = i mod P`` at local row ``i div P``, owned by
rank ``p mod N``. The state's keys are the checkpoint's: a variable's partitions under its
name, a slot's under ``"<name>:<slot>"``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, PlanError
from .partitioning import RowPartitioning


@dataclass
class ServedTable:
    """One PS variable as this rank serves it: how it is partitioned, one row's shape and dtype,
    and the partitions this rank owns (``parts[p]``: rows ``p, p + P, ...`` of the variable, as
    :meth:`RowPartitioning.split`; none on a rank that owns nothing when P < N). ``slots``:
    the optimizer's slots of those partitions (slot -> partition -> array, as ``parts``),
    filled with the rule's initial values by :class:`ServedTables` where not given."""

    name: str
    partitioning: RowPartitioning
    row_shape: tuple[int, ...]
    dtype: np.dtype
    parts: dict[int, np.ndarray]
    slots: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def from_array(cls, name: str, array: np.ndarray, partitions: int, ranks: int, rank: int) -> "ServedTable":
        """The partitions ``rank`` owns of a whole ``array`` split into ``partitions``."""
        array = np.asarray(array)
        part = RowPartitioning(len(array), partitions, ranks)
        return cls(name, part, tuple(array.shape[1:]), array.dtype,
                   {p: part.split(array, p).copy() for p in part.owned_by(rank)})

    @classmethod
    def from_shard(cls, shard, slots: dict[str, dict[int, object]] | None = None) -> "ServedTable":
        """The partitions a :class:`~.sharded.ShardedVariable` holds on this rank, and their
        optimizer ``slots`` (slot -> partition -> array), copied: the served arrays are the
        parameters from then on; the shard's variables are not updated."""
        return cls(shard.name, shard.partitioning, shard.row_shape, np.dtype(shard.dtype.as_numpy_dtype),
                   {p: np.array(v) for p, v in shard.values().items()},
                   {slot: {p: np.array(v) for p, v in parts.items()} for slot, parts in (slots or {}).items()})

    def slots_of(self, p: int) -> dict[str, np.ndarray]:
        """Partition ``p``'s slot arrays (slot -> array)."""
        return {slot: parts[p] for slot, parts in self.slots.items()}

    def arrays(self) -> dict[str, dict[int, np.ndarray]]:
        """The served arrays themselves: the partitions under the variable's name, every slot's
        under ``"<name>:<slot>"``."""
        return {self.name: self.parts, **{f"{self.name}:{slot}": parts for slot, parts in self.slots.items()}}

    def state(self) -> dict[str, dict[int, np.ndarray]]:
        """Copies of :meth:`arrays`."""
        return {key: {p: a.copy() for p, a in parts.items()} for key, parts in self.arrays().items()}


def sum_duplicates(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One entry per distinct id, its gradients summed in the order they came (ids ascending)."""
    unique, inverse = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        order = np.argsort(ids, kind="stable")
        return ids[order], grads[order]
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(unique)))
    return unique, np.add.reduceat(grads[order], starts, axis=0)


class ServedTables:
    """Rank ``rank`` of ``ranks``: its :class:`ServedTable` of every variable, updated by
    ``update`` (an :class:`~.owner_optimizers.OwnerRule`). Not thread-safe: the caller holds
    the rank's lock."""

    def __init__(self, tables: list[ServedTable], update, rank: int, ranks: int):
        self.rank, self.ranks, self.update = rank, ranks, update
        self.tables = {t.name: t for t in tables}
        for t in tables:
            self._check(t)
            if any(slot not in t.slots for slot in update.slots):
                initial = {p: update.initial_slots(part) for p, part in t.parts.items()}
                for slot in update.slots:
                    t.slots.setdefault(slot, {p: initial[p][slot] for p in t.parts})

    def _check(self, table: ServedTable) -> None:
        part = table.partitioning
        if part.ranks != self.ranks:
            raise PlanError(f"variable {table.name!r} is partitioned over {part.ranks} ranks, "
                            f"this job has {self.ranks}", hint="partition it with ranks = the job's size")
        if sorted(table.parts) != part.owned_by(self.rank):
            raise PlanError(f"rank {self.rank} was given partitions {sorted(table.parts)} of {table.name!r}, "
                            f"it owns {part.owned_by(self.rank)}")

    def table(self, name: str) -> ServedTable:
        if name not in self.tables:
            raise ConfigError(f"no variable {name!r} is served asynchronously", hint=f"served: {sorted(self.tables)}")
        return self.tables[name]

    def owners(self, table: ServedTable, ids: np.ndarray) -> np.ndarray:
        """The rank owning each of ``ids`` (refused when one is outside the variable)."""
        part = table.partitioning
        if len(ids) and (ids.min() < 0 or ids.max() >= part.rows):
            raise ConfigError(f"row ids of {table.name!r} must be in [0, {part.rows}), got {ids.min()}..{ids.max()}")
        return (ids % part.partitions) % self.ranks

    def _local(self, table: ServedTable, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        P = table.partitioning.partitions
        partitions = ids % P
        if len(ids) and not np.all(partitions % self.ranks == self.rank):   # partition p is rank p mod N's
            raise PlanError(f"rank {self.rank} was asked for rows of {table.name!r} it does not own")
        return partitions, ids // P

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of this rank's partitions of ``name``."""
        table = self.tables[name]
        partitions, local = self._local(table, ids)
        if len(table.parts) == 1:
            return next(iter(table.parts.values()))[local]
        rows = np.empty((len(ids),) + table.row_shape, table.dtype)
        for p, part in table.parts.items():
            mine = partitions == p
            rows[mine] = part[local[mine]]
        return rows

    def whole(self, name: str) -> dict[int, np.ndarray]:
        """Copies of this rank's partitions of ``name``."""
        return {p: part.copy() for p, part in self.tables[name].parts.items()}

    def split_whole(self, table: ServedTable, grads) -> dict[int, dict[int, np.ndarray]]:
        """A whole variable's gradient as owner -> partition -> its rows' gradients."""
        part = table.partitioning
        grads = np.asarray(grads, dtype=table.dtype)
        if grads.shape != (part.rows,) + table.row_shape:
            raise ConfigError(f"the gradient of {table.name!r} has shape {grads.shape}, the variable "
                              f"{(part.rows,) + table.row_shape}")
        out: dict[int, dict[int, np.ndarray]] = {}
        for p in range(part.partitions):
            out.setdefault(part.owner(p), {})[p] = part.split(grads, p)
        return out

    def apply(self, step: int, items: list[tuple]) -> None:
        """One push's update of this rank's partitions, ``(name, ids, grads)`` per variable
        (ids None: ``grads`` maps each partition to its whole gradient), by a worker that had
        finished ``step`` steps: every part is checked before any is applied, so a refused
        push changes nothing."""
        located = []
        for name, ids, grads in items:
            table = self.table(name)
            if ids is None:
                for p, grad in grads.items():
                    if p not in table.parts or grad.shape != table.parts[p].shape:
                        raise PlanError(f"rank {self.rank} was sent a gradient of shape {grad.shape} for partition "
                                        f"{p} of {table.name!r}, it serves {sorted(table.parts)}")
                located.append((table, None, None, grads))
            else:
                located.append((table, *self._local(table, ids), grads))
        for table, partitions, local, grads in located:
            if partitions is None:
                for p, grad in grads.items():
                    self.update(table.name, table.parts[p], slice(None), grad, table.slots_of(p), step)
                continue
            for p, part in table.parts.items():
                mine = partitions == p
                if np.any(mine):
                    self.update(table.name, part, local[mine], grads[mine], table.slots_of(p), step)

    def state(self) -> dict[str, dict[int, np.ndarray]]:
        """Copies of this rank's partitions and slots of every variable:
        ``{name: {p: array}, "name:slot": {p: array}}``."""
        out = {}
        for table in self.tables.values():
            out.update(table.state())
        return out

    def replace(self, given: dict[str, dict[int, np.ndarray]]) -> None:
        """Serve ``given`` (keys as :meth:`state`) instead: every key of every table, every
        partition this rank owns, each of its shape; all checked before anything is replaced."""
        replaced = []
        for table in self.tables.values():
            for key, held in table.arrays().items():
                parts = given.get(key, {})
                if sorted(parts) != sorted(held):
                    raise PlanError(f"rank {self.rank} was given partitions {sorted(parts)} of {key!r} to "
                                    f"serve, it owns {sorted(held)}")
                for p, target in held.items():
                    array = np.asarray(parts[p], dtype=table.dtype)
                    if array.shape != target.shape:
                        raise PlanError(f"partition {p} of {key!r} has shape {array.shape}, rank {self.rank} "
                                        f"serves it with shape {target.shape}")
                    replaced.append((target, array))
        for target, array in replaced:
            target[...] = array
