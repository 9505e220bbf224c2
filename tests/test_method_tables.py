"""The two method tables stay in step: every (Method, Kind) the cost side prices has exactly
one exchange on the runtime side, and each exchange says which key it serves. A new method
(as asynchronous PS, keyed ``ASYNC_PS``) that is added to one table only fails here."""
from __future__ import annotations

from parallax_nb.cost.methods import METHOD_COSTS
from parallax_nb.runtime.exchanges import EXCHANGES
from parallax_nb.types import ASYNC_PS, Kind, Method


def test_cost_and_runtime_tables_have_the_same_keys():
    assert set(METHOD_COSTS) == set(EXCHANGES), (
        f"priced but not run: {sorted(set(METHOD_COSTS) - set(EXCHANGES))}; "
        f"run but not priced: {sorted(set(EXCHANGES) - set(METHOD_COSTS))}")


def test_each_exchange_serves_the_key_it_is_filed_under():
    for (method, kind), exchange in EXCHANGES.items():
        assert (isinstance(method, Method) or method == ASYNC_PS) and isinstance(kind, Kind)
        assert (exchange.method, exchange.kind) == (method, kind), exchange.__name__


def _runtime_collectives(key, machines: int, workers_per_machine: int, local_aggregation: bool) -> list:
    """What the runtime's exchange for ``key`` says one step issues for one variable (one
    lookup for sparse PS). ``collectives()`` reads only the machine shape of the run, so the
    two-level case gets a stand-in holding G and N instead of a Horovod-initialised
    ``Hierarchy`` (which needs live ranks); everything else is the real exchange."""
    from types import SimpleNamespace

    from parallax_nb.runtime.accounting import ByteLedger
    from parallax_nb.runtime.exchanges import Wire
    from parallax_nb.runtime.topology import Topology

    ranks = machines * workers_per_machine
    hierarchy = SimpleNamespace(G=workers_per_machine, N=machines) if local_aggregation else None
    wire = Wire(ranks, 0, ByteLedger(), Topology.blocks(ranks, workers_per_machine), hierarchy)
    exchange = EXCHANGES[key](wire, [])
    if hasattr(exchange, "router"):
        exchange.router.lookups = 1
    else:
        exchange.served = ["one_variable"]
    return exchange.collectives()


def test_both_tables_describe_the_same_collectives_per_step():
    """The cost side prices the collectives the runtime issues: for one variable of each key,
    flat (4 machines x 1) and with local aggregation (2 machines x 2, and one machine of 4), both
    sides name the same calls, counts and participants ("all" and "cross" coincide for one rank
    per machine); a variable alone in a grouped call issues the group's call."""
    from parallax_nb.types import ClusterSpec
    from test_cost import dense_var, sparse_var

    variables = {Kind.DENSE: dense_var(), Kind.SPARSE: sparse_var(unions=[1000, 1900])}
    for machines, g, aggregated in ((4, 1, False), (2, 2, True), (1, 4, True)):
        cluster = ClusterSpec(machines=machines, workers_per_machine=g, local_aggregation=aggregated)
        for key, cost in METHOD_COSTS.items():
            entry = cost(variables[key[1]], cluster)
            priced = sorted((c.op, c.count, c.participants) for c in entry.collectives + entry.grouped if c.count)
            issued = sorted((c.op, c.count, c.participants)
                            for c in _runtime_collectives(key, machines, g, aggregated))
            assert priced == issued, f"{key} on {machines} x {g}: cost side {priced}, runtime {issued}"
