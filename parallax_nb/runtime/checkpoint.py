"""Checkpoints in single-device layout, written atomically by rank 0.

A checkpoint is a directory ``ckpt-<step, 8 digits>/``:

* ``meta.json``: schema ``parallax_nb.checkpoint`` v2, step, ranks, architecture, the file of
  every array, the SHA-256 of every file (``sha256``) and of the manifest itself
  (``manifest_sha256``: of the JSON of everything else, keys sorted);
* ``arrays/*.npy``: every model variable by path (PS variables gathered whole from their
  owners) and the optimizer state in single-device layout: the slots of each variable
  (``"<path>:<slot>"``, e.g. ``"embedding/embeddings:momentum"``, gathered whole for PS) and
  the optimizer's own variables (``":iteration"``, ...);
* ``model.weights.h5``: the user's single-device model with these weights
  (``model.load_weights(...)``).

It is written into a temporary directory ``.tmp-ckpt-<step>-<pid>`` next to the target and
renamed, so a crash leaves either no checkpoint or a whole one; the temporary directories of
dead writers are removed when the next run starts. Nothing non-finite is written, and a disk
without room for it is refused before writing (the bytes needed and free are named), so the
previous checkpoint always stays. Resuming verifies the checksums and falls back to the
newest checkpoint that verifies, naming the ones it skipped (v1 checkpoints, without
checksums, are read unverified). Resuming reads the arrays memory-mapped and each owner
takes only its partitions' rows, so a resumed PS run never loads the full table on one rank;
the data position is the step (each rank skips ``step`` batches of its shard), so a resumed
run continues exactly where the interrupted one stopped.

Asynchronous training (``plan.sync`` False) writes the same files the same way (``meta.json``
says ``"sync": false``), and they load into the single-device model alike. What a checkpoint
of step ``c`` holds is *consistent*: exactly the pushes of every worker's steps ``0 .. c-1``,
each applied once, and none of any worker's later steps (the owners copy their partitions at
a barrier of all workers at ``c``, :meth:`.async_ps.AsyncPS.snapshot`); a worker that stopped
after ``d < c`` steps contributes its ``d`` steps (a resume skips its batches ``d .. c-1``). That is the state synchronous training
reaches after ``c`` steps when no update depends on the parameters read (the exactly-once
tests); in general the gradients of a step were computed from parameters up to
``max_staleness`` steps old, so the values are those of one asynchronous run, not of the
synchronous run. Resuming from it starts every worker at step ``c`` from exactly that state,
each reading its shard from batch ``c`` on: no push is lost or applied twice, and the
resumed run keeps the SSP bound. It is exact in that sense; it does not replay the
interrupted run's timing (which pull saw which push), which no asynchronous run repeats.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time

import numpy as np
import psutil

from ..errors import CheckpointError
from ..jsonfile import atomic_write_text, load_json

CHECKPOINT_SCHEMA = "parallax_nb.checkpoint"
CHECKPOINT_SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
_NAME = re.compile(r"^ckpt-(\d{8})$")
_TEMPORARY = re.compile(r"^\.tmp-ckpt-\d{8}-(\d+)$")
#: room kept free beyond the checkpoint's arrays, for meta.json and HDF5's own structure
HEADROOM_BYTES = 1 << 20


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}"


def checkpoint_folders(directory: str) -> list[str]:
    """Every ``ckpt-XXXXXXXX`` folder in ``directory``, newest first, complete or not."""
    if not directory or not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, name)) for name in os.listdir(directory)
             if (m := _NAME.match(name))]
    return [path for _, path in sorted(found, reverse=True)]


def latest_checkpoint(directory: str) -> str | None:
    """The complete checkpoint with the highest step in ``directory`` (None when there is none)."""
    if not directory or not os.path.isdir(directory):
        return None
    found = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m and os.path.exists(os.path.join(directory, name, "meta.json")):
            found.append((int(m.group(1)), os.path.join(directory, name)))
    return max(found)[1] if found else None


def slot_map(optimizer, variables) -> tuple[dict[int, dict[str, object]], dict[str, object]]:
    """Which optimizer variables are slots of which model variables.

    Keras names a slot ``<variable path with / as _>_<slot>`` with the variable's shape; the
    longest matching prefix wins. Returns ({id(variable): {slot: optimizer variable}}, {name:
    optimizer variable that is no slot, e.g. the iteration counter}).
    """
    prefixes = [(v.path.replace("/", "_") + "_", v) for v in variables]
    slots: dict[int, dict[str, object]] = {}
    misc: dict[str, object] = {}
    for ov in optimizer.variables:
        best = None
        for prefix, v in prefixes:
            if ov.name.startswith(prefix) and tuple(ov.shape) == tuple(v.shape):
                if best is None or len(prefix) > len(best[0]):
                    best = (prefix, v)
        if best is None:
            misc[ov.name] = ov
        else:
            slots.setdefault(id(best[1]), {})[ov.name[len(best[0]):]] = ov
    return slots, misc


def _optimizer_state(trainer) -> dict[str, np.ndarray]:
    """Optimizer state in single-device layout (collective: PS slots are gathered)."""
    hvd = trainer.hvd
    opt_vars = [v for s in trainer.syncs for v in s.optimizer_variables]
    slots, misc = slot_map(trainer.optimizer, opt_vars)
    state = {f":{name}": np.array(v.numpy()) for name, v in misc.items()}
    for i, sync in enumerate(trainer.syncs):
        if sync.shard is None:
            for slot, ov in slots.get(id(sync.variable), {}).items():
                state[f"{sync.name}:{slot}"] = np.array(ov.numpy())
            continue
        parts = sync.shard.parts
        names = sorted(slots.get(id(parts[0]), {})) if parts else []
        if trainer.ranks > 1:
            names = hvd.broadcast_object(names, root_rank=0, name=f"px_slotnames_{i}")
        for slot in names:
            local = {p: slots[id(v)][slot].numpy() for p, v in zip(sync.shard.owned, parts)}
            full = trainer.gather_partitions(sync, local, f"s{i}_{slot}")
            state[f"{sync.name}:{slot}"] = full
    return state


def save(trainer, directory: str, weights: dict | None = None, step: int | None = None) -> str:
    """Write a checkpoint of ``trainer`` at ``step`` (default its current step); collective,
    rank 0 writes. ``weights``: the full single-device values to write (an asynchronous
    run's snapshot), default :meth:`Trainer.weights`. Returns the checkpoint's path (on every
    rank). Every rank refuses non-finite values alike
    (:class:`~parallax_nb.errors.NumericError`) before anything is written."""
    from .guards import check_finite_arrays

    step = trainer.step if step is None else step
    weights = trainer.weights() if weights is None else weights
    optimizer = _optimizer_state(trainer)
    check_finite_arrays(weights, step, "checkpoint")
    check_finite_arrays(optimizer, step, "checkpoint (optimizer state)")
    path = os.path.join(os.path.abspath(directory), checkpoint_name(step))
    if trainer.rank == 0:
        _write(path, trainer, weights, optimizer, step)
    from .context import barrier

    barrier(f"ckpt_{step}")  # nobody reads a checkpoint before it is complete
    return path


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _manifest_sha256(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _needed_bytes(weights: dict, optimizer: dict) -> int:
    """Arrays once as .npy, the weights again in model.weights.h5, plus headroom."""
    w = sum(np.asarray(a).nbytes for a in weights.values())
    return 2 * w + sum(np.asarray(a).nbytes for a in optimizer.values()) + HEADROOM_BYTES


def _check_room(path: str, needed: int) -> None:
    free = shutil.disk_usage(os.path.dirname(path)).free
    if needed > free:
        raise CheckpointError(f"no room for checkpoint {path}: it needs about {needed} bytes ({needed / 2**20:.1f} MiB), "
                              f"the disk has {free} bytes ({free / 2**20:.1f} MiB) free",
                              hint="free disk space or point the checkpoints elsewhere; the previous checkpoint is kept")


def remove_stale_temporaries(directory: str) -> list[str]:
    """Remove ``.tmp-ckpt-*-<pid>`` folders whose writer is no longer running; their paths."""
    removed = []
    if not directory or not os.path.isdir(directory):
        return removed
    for name in os.listdir(directory):
        m = _TEMPORARY.match(name)
        if m and (int(m.group(1)) == os.getpid() or not psutil.pid_exists(int(m.group(1)))):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
            removed.append(os.path.join(directory, name))
    return removed


def _write(path: str, trainer, weights: dict, optimizer: dict, step: int | None = None) -> None:
    step = trainer.step if step is None else step
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.path.basename(path)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    needed = _needed_bytes(weights, optimizer)
    _check_room(path, needed)
    try:
        _write_into(tmp, trainer, weights, optimizer, step)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(e):
            free = shutil.disk_usage(directory).free
            raise CheckpointError(f"the disk filled up while writing checkpoint {path}: it needs about {needed} bytes "
                                  f"({needed / 2**20:.1f} MiB), {free} bytes are free",
                                  hint="free disk space; the previous checkpoint is kept") from None
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}",
                              hint="check that the checkpoint folder is writable; the previous checkpoint is kept") \
            from None
    if os.path.exists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)


def _write_into(tmp: str, trainer, weights: dict, optimizer: dict, step: int) -> None:
    os.makedirs(os.path.join(tmp, "arrays"))
    files: dict[str, dict[str, str]] = {"weights": {}, "optimizer": {}}
    digests: dict[str, str] = {}
    for section, arrays in (("weights", weights), ("optimizer", optimizer)):
        for i, (key, array) in enumerate(sorted(arrays.items())):
            name = f"arrays/{section[0]}{i:05d}.npy"
            np.save(os.path.join(tmp, name), np.asarray(array))
            files[section][key] = name
            digests[name] = _sha256(os.path.join(tmp, name))
    model = trainer.job.build_model()
    for v in model.variables:
        v.assign(weights[v.path])
    model.save_weights(os.path.join(tmp, "model.weights.h5"))
    digests["model.weights.h5"] = _sha256(os.path.join(tmp, "model.weights.h5"))
    meta = {"schema": CHECKPOINT_SCHEMA, "schema_version": CHECKPOINT_SCHEMA_VERSION, "step": step,
            "ranks": trainer.ranks, "architecture": trainer.plan.architecture.value,
            "sync": not getattr(trainer, "asynchronous", False),
            "job": trainer.job.name, "created_unix_s": time.time(), **files, "sha256": digests}
    meta["manifest_sha256"] = _manifest_sha256(meta)
    atomic_write_text(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1))


class Checkpoint:
    """A checkpoint opened for reading; arrays are memory-mapped on access."""

    def __init__(self, path: str):
        self.path = path
        meta_path = os.path.join(path, "meta.json")
        if not os.path.exists(meta_path):
            raise CheckpointError(f"no checkpoint at {path!r} (meta.json missing)",
                                  hint="pass a ckpt-XXXXXXXX directory written by parallax_nb")
        try:
            meta = load_json(meta_path, what="checkpoint meta")
        except Exception as e:  # noqa: BLE001 - any unreadable meta is a corrupted checkpoint
            raise CheckpointError(f"checkpoint {path!r} is corrupted: {e}") from None
        if meta.get("schema") != CHECKPOINT_SCHEMA or meta.get("schema_version") not in READABLE_VERSIONS:
            raise CheckpointError(f"{path!r} is not a parallax_nb checkpoint of version {CHECKPOINT_SCHEMA_VERSION}")
        if meta.get("schema_version", 1) >= 2 and meta.get("manifest_sha256") != _manifest_sha256(meta):
            raise CheckpointError(f"checkpoint {path!r} is corrupted: meta.json does not match its checksum",
                                  hint="resume falls back to an older checkpoint; delete this one")
        self.meta = meta
        self.step = int(meta["step"])

    def verify(self) -> None:
        """Check every file against its SHA-256 in the manifest (v2); raise CheckpointError
        naming the first file that is missing, truncated or altered."""
        for name, digest in self.meta.get("sha256", {}).items():
            file = os.path.join(self.path, name)
            if not os.path.exists(file):
                raise CheckpointError(f"checkpoint {self.path!r} is incomplete: {name} is missing")
            if _sha256(file) != digest:
                raise CheckpointError(f"checkpoint array {name} of {self.path!r} is unreadable: its SHA-256 does not "
                                      "match the manifest (the file is truncated or corrupted)",
                                      hint="resume falls back to an older checkpoint; delete this one")

    def _array(self, section: str, key: str) -> np.ndarray:
        try:
            name = self.meta[section][key]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.path!r} has no {section} entry {key!r}",
                                  hint="is it a checkpoint of another model or optimizer?") from None
        try:
            return np.load(os.path.join(self.path, name), mmap_mode="r")
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint array {name} of {self.path!r} is unreadable: {e}") from None

    def weight(self, path: str) -> np.ndarray:
        return self._array("weights", path)

    def optimizer(self, key: str) -> np.ndarray:
        return self._array("optimizer", key)

    @property
    def weight_names(self) -> list[str]:
        return list(self.meta["weights"])


def load(path: str, verify: bool = False) -> Checkpoint:
    """Open the checkpoint at ``path``; with ``verify``, check every file's checksum first."""
    ckpt = Checkpoint(path)
    if verify:
        ckpt.verify()
    return ckpt


def newest_valid_checkpoint(directory: str, report=None) -> str | None:
    """The newest checkpoint in ``directory`` that opens and verifies; None when there is none.

    Checkpoints skipped on the way (corrupted, incomplete) are named through ``report(text)``;
    when every checkpoint there is broken, raise CheckpointError naming them all rather than
    train from step 0 as if nothing had been saved."""
    problems = []
    for path in checkpoint_folders(directory):
        try:
            load(path, verify=True)
        except CheckpointError as e:
            problems.append(e.message)
            if report is not None:
                report(f"parallax_nb: skipping {e.message}")
            continue
        if problems and report is not None:
            report(f"parallax_nb: resuming from the newest valid checkpoint instead: {path}")
        return path
    if problems:
        raise CheckpointError(f"no valid checkpoint in {directory}: " + "; ".join(problems),
                              hint="delete the broken checkpoints to start from step 0, or restore them")
    return None


def _check_shape(ckpt: Checkpoint, key: str, array: np.ndarray, shape) -> None:
    if tuple(array.shape) != tuple(shape):
        raise CheckpointError(f"checkpoint {ckpt.path!r}: {key!r} has shape {tuple(array.shape)}, the model "
                              f"expects {tuple(shape)}", hint="is it a checkpoint of another model size?")


def restore(trainer, path: str) -> None:
    """Load a checkpoint into a distributed trainer (each rank reads only its own rows)."""
    ckpt = load(path)
    by_name = {s.name: s for s in trainer.syncs}
    for variable in trainer.model.variables:
        sync = by_name.get(variable.path)
        full = ckpt.weight(variable.path)
        _check_shape(ckpt, variable.path, full, variable.shape)
        if sync is not None and sync.shard is not None:
            P = sync.shard.partitioning.partitions
            flat = full.reshape(sync.shard.shape)
            for p, part in zip(sync.shard.owned, sync.shard.parts):
                part.assign(np.ascontiguousarray(flat[p::P]))
            if sync.ps_sparse:
                continue
        variable.assign(np.asarray(full))
    opt_vars = [v for s in trainer.syncs for v in s.optimizer_variables]
    slots, misc = slot_map(trainer.optimizer, opt_vars)
    for name, ov in misc.items():
        ov.assign(np.asarray(ckpt.optimizer(f":{name}")))
    for sync in trainer.syncs:
        if sync.shard is None:
            for slot, ov in slots.get(id(sync.variable), {}).items():
                ov.assign(np.asarray(ckpt.optimizer(f"{sync.name}:{slot}")))
            continue
        P = sync.shard.partitioning.partitions
        for p, part in zip(sync.shard.owned, sync.shard.parts):
            for slot, ov in slots.get(id(part), {}).items():
                full = ckpt.optimizer(f"{sync.name}:{slot}").reshape(sync.shard.shape)
                ov.assign(np.ascontiguousarray(full[p::P]))
    trainer.step = ckpt.step


def load_into_model(model, path: str, optimizer=None) -> int:
    """Load a checkpoint into the user's single-device ``model`` (and ``optimizer``, built
    over ``model.trainable_variables``, for exact continuation); returns the step. The
    checksums are verified first."""
    ckpt = load(path, verify=True)
    for variable in model.variables:
        full = ckpt.weight(variable.path)
        _check_shape(ckpt, variable.path, full, variable.shape)
        variable.assign(np.asarray(full))
    if optimizer is not None:
        optimizer.build(model.trainable_variables)
        slots, misc = slot_map(optimizer, model.trainable_variables)
        for name, ov in misc.items():
            ov.assign(np.asarray(ckpt.optimizer(f":{name}")))
        for variable in model.trainable_variables:
            for slot, ov in slots.get(id(variable), {}).items():
                ov.assign(np.asarray(ckpt.optimizer(f"{variable.path}:{slot}")))
    return ckpt.step
