"""The last few values the cost model made, kept while the same inputs come back.

A planner asks for the same pricing, fused-call sizes and AUTO choice several times per change
(the plan, then its estimate beside AR, PS and HYBRID; local aggregation on and off), and a
profile or a variable tuple is large and immutable, so it is keyed by identity: ``id(owner)``
in the key, and a value is handed back only while ``owner`` is the very object it was made
for (an id is reused once its object is gone). The oldest value goes first.
"""
from __future__ import annotations

from typing import Any, Hashable


class Kept:
    """Up to ``size`` values, each with the object it was made for (first in, first out)."""

    def __init__(self, size: int = 2):
        self.size = size
        self._values: dict = {}

    def get(self, key: Hashable, owner: Any, default: Any = None) -> Any:
        """The value kept under ``key`` for ``owner`` itself, else ``default``."""
        kept = self._values.get(key)
        return kept[1] if kept is not None and kept[0] is owner else default

    def put(self, key: Hashable, owner: Any, value: Any) -> Any:
        """Keep ``value`` (made for ``owner``) under ``key``, dropping the oldest past ``size``; returns it."""
        if key not in self._values and len(self._values) >= self.size:
            self._values.pop(next(iter(self._values)))
        self._values[key] = (owner, value)
        return value

    def values(self) -> list:
        return [value for _, value in self._values.values()]

    def clear(self) -> None:
        self._values.clear()
