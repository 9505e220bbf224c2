"""The two method tables stay in step: every (Method, Kind) the cost side prices has exactly
one exchange on the runtime side, and each exchange says which key it serves. A new method
(e.g. asynchronous PS) that is added to one table only fails here."""
from __future__ import annotations

from parallax_nb.cost.methods import METHOD_COSTS
from parallax_nb.runtime.exchanges import EXCHANGES
from parallax_nb.types import Kind, Method


def test_cost_and_runtime_tables_have_the_same_keys():
    assert set(METHOD_COSTS) == set(EXCHANGES), (
        f"priced but not run: {sorted(set(METHOD_COSTS) - set(EXCHANGES))}; "
        f"run but not priced: {sorted(set(EXCHANGES) - set(METHOD_COSTS))}")


def test_each_exchange_serves_the_key_it_is_filed_under():
    for (method, kind), exchange in EXCHANGES.items():
        assert isinstance(method, Method) and isinstance(kind, Kind)
        assert (exchange.method, exchange.kind) == (method, kind), exchange.__name__
