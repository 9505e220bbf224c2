"""Phases of long operations, announced to whoever listens: a notebook view, a terminal, an engine.

A wait over a couple of seconds with nothing on screen looks like a hang. So every long
operation names what it is doing as it goes: ``phase("profile", "step 3 of 20", done=3,
total=20)``, ``phase("cluster", "engines 1 of 2 ready", done=1, total=2)``,
``phase("run", "building the model")``. The operation knows nothing about displays; the
notebook (``widgets.progress_view``), the command line (:func:`terminal_listener`) and an
engine publishing to the notebook each register a listener. No listener, no cost.

``task(name, title)`` brackets an operation: listeners see a ``begin`` event, its phases and
an ``end`` event with the elapsed time, so a view can open, tick and close. Tasks nest (a
run starts a cluster); ``Event.depth`` says how deep.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

BEGIN, PHASE, END = "begin", "phase", "end"


@dataclass(frozen=True)
class Event:
    """One announcement: ``kind`` is begin | phase | end; ``done`` of ``total`` when countable;
    ``elapsed_s`` since the task began (at the end: its whole duration); ``error`` on a failed end."""

    kind: str
    task: str
    text: str
    depth: int = 0
    done: Optional[int] = None
    total: Optional[int] = None
    elapsed_s: float = 0.0
    error: Optional[str] = None


Listener = Callable[[Event], None]
_listeners: list[Listener] = []
_lock = threading.Lock()
_local = threading.local()


def listen(listener: Listener) -> Listener:
    with _lock:
        _listeners.append(listener)
    return listener


def unlisten(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _emit(event: Event) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:   # a broken display must never break the work it reports on
            pass


def phase(task: str, text: str, done: int | None = None, total: int | None = None) -> None:
    """Announce that ``task`` is now doing ``text`` (optionally ``done`` of ``total``)."""
    stack = _stack()
    started = next((t for name, t in reversed(stack) if name == task), None)
    elapsed = time.monotonic() - started if started is not None else 0.0
    depth = max(len(stack) - 1, 0)
    _emit(Event(PHASE, task, text, depth, done, total, elapsed))


@contextlib.contextmanager
def task(name: str, title: str):
    """Bracket a long operation: ``begin`` now, ``end`` (with elapsed time, or the error) after."""
    stack = _stack()
    t0 = time.monotonic()
    stack.append((name, t0))
    _emit(Event(BEGIN, name, title, len(stack) - 1))
    try:
        yield
    except BaseException as e:
        stack.pop()
        _emit(Event(END, name, title, len(stack), elapsed_s=time.monotonic() - t0,
                    error=f"{type(e).__name__}: {getattr(e, 'message', e)}"))
        raise
    stack.pop()
    _emit(Event(END, name, title, len(stack), elapsed_s=time.monotonic() - t0))


def terminal_listener(stream=None, prefix: str = "[parallax_nb]", every_s: float = 1.0) -> Listener:
    """A listener printing phases to the terminal with the time since it was made (the command
    line shows the same phases the notebook does); counted phases (step 3 of 20) at most every
    ``every_s`` seconds, and the last one."""
    t0 = time.monotonic()
    last_count = {"at": -1e9}

    def write(event: Event) -> None:
        if event.kind == BEGIN:
            line = f"{prefix} {event.text} ..."
        elif event.kind == END:
            line = (f"{prefix} {event.text}: failed after {event.elapsed_s:.1f} s ({event.error})" if event.error
                    else f"{prefix} {event.text}: done in {event.elapsed_s:.1f} s")
        else:
            if event.total:
                now = time.monotonic()
                if event.done != event.total and now - last_count["at"] < every_s:
                    return
                last_count["at"] = now
            line = f"{prefix}   {event.text} ({time.monotonic() - t0:.1f} s)"
        print(line, file=stream or sys.stderr, flush=True)
    return write
