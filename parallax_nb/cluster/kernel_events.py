"""Let widget clicks reach the kernel while a notebook cell blocks in ``Run.wait()``.

A Jupyter kernel handles widget events (``comm_msg`` on the shell channel) only between
cells, so a Stop button would do nothing while ``px.run(...)`` waits. While waiting,
:func:`handle_widget_messages` is called every 0.2 s: it pulls pending shell messages into
the kernel's queue, handles ``comm_msg`` ones (button clicks) at once, and puts every other
message (a queued cell, ...) back, in order, for the kernel to run after this cell.

Works with ipykernel 6 (``Kernel.msg_queue`` / ``schedule_dispatch``); anywhere else (plain
Python, IPython terminal, other kernels) it does nothing.
"""
from __future__ import annotations

import asyncio


def current_kernel():
    """The running ipykernel Kernel, or None outside a kernel (or in an unsupported one)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "msg_queue") or getattr(kernel, "shell_stream", None) is None:
        return None
    return kernel


def handle_widget_messages(kernel) -> int:
    """Handle pending ``comm_msg`` messages now; defer the rest. Returns how many were handled."""
    import zmq

    kernel.shell_stream.flush(zmq.POLLIN)           # -> kernel.schedule_dispatch -> msg_queue
    pending = []
    while True:
        try:
            pending.append(kernel.msg_queue.get_nowait())
        except (asyncio.QueueEmpty, Exception):
            break
    handled, deferred = 0, []
    for item in pending:
        _, dispatch, args = item
        message = _comm_message(kernel, args) if getattr(dispatch, "__name__", "") == "dispatch_shell" else None
        if message is None:
            deferred.append(item)
            continue
        idents, msg = message
        handler = kernel.shell_handlers.get("comm_msg")
        try:
            handler(kernel.shell_stream, idents, msg)
        except Exception:
            kernel.log.error("widget message failed while a cell waited", exc_info=True)
        handled += 1
    for item in deferred:
        kernel.msg_queue.put_nowait(item)
    if deferred:
        kernel.io_loop.add_callback(lambda: None)   # wake the loop for them after this cell
    return handled


def _comm_message(kernel, args):
    """(idents, deserialized msg) if the raw shell message is a comm_msg, else None."""
    raw = args[0] if args else None
    if raw is None:
        return None
    try:
        idents, parts = kernel.session.feed_identities(list(raw), copy=False)
        header = kernel.session.unpack(parts[1].bytes if hasattr(parts[1], "bytes") else parts[1])
        if header.get("msg_type") != "comm_msg":
            return None
        return idents, kernel.session.deserialize(parts, content=True, copy=False)
    except Exception:
        return None
