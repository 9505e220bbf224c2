"""``--async [--max-staleness K]``: the plan's sync flag as the command line (``plan``, ``run``)
and the ``%parallax plan`` / ``%parallax run`` magics spell it, one set of flags for both.

The flags are checked before anything starts (:func:`check_sync_flags`) and applied to a plan
with :func:`apply_sync_flags`, which leaves the checking of the plan itself to
:class:`~parallax_nb.plan.Plan` (async refused for any AllReduce variable) and only restates
its hint in the flags' terms (:func:`flag_hint`). The flags decide: ``--async`` without
``--max-staleness`` is unbounded even for a plan file that had a bound; without ``--async`` a
plan file's own setting stands.
"""
from __future__ import annotations

import argparse

from .errors import ConfigError, PlanError

ASYNC_HINT = "plan with --arch ps (every variable on the parameter servers), or drop --async"


def add_sync_arguments(parser: argparse.ArgumentParser) -> None:
    """``--async`` (``args.asynchronous``) and ``--max-staleness K`` (``args.max_staleness``)."""
    parser.add_argument("--async", dest="asynchronous", action="store_true",
                        help="train the PS variables asynchronously (every variable must be PS: --arch ps)")
    parser.add_argument("--max-staleness", type=int, default=None, metavar="K",
                        help="with --async: a worker waits when it is more than K steps ahead of the slowest "
                             "(0: lock-step; default: unbounded)")


def check_sync_flags(args) -> None:
    """Refuse ``--max-staleness`` without ``--async`` and a negative K."""
    k = args.max_staleness
    if k is None:
        return
    if k < 0:
        raise ConfigError(f"--max-staleness must be a whole number >= 0, got {k}",
                          hint="0 is lock-step, K lets a worker run K steps ahead of the slowest; "
                               "leave it out for unbounded staleness")
    if not args.asynchronous:
        raise ConfigError(f"--max-staleness {k} applies to asynchronous training, and --async was not given",
                          hint=f"add --async to train asynchronously with --max-staleness {k}, or drop --max-staleness")


def apply_sync_flags(plan, args):
    """``plan`` as the flags ask: unchanged without ``--async``, else asynchronous with the bound
    (the plan's PlanError, with a command-line hint, when it has AllReduce variables)."""
    if not args.asynchronous:
        return plan
    try:
        return plan.with_sync(False, args.max_staleness)
    except PlanError as e:
        raise flag_hint(e) from None


def flag_hint(error: PlanError) -> PlanError:
    """The plan's refusal of asynchronous training, its hint in the flags' terms."""
    return PlanError(error.message, hint=ASYNC_HINT)
