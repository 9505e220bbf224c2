"""The package's rooms import only leftwards, and no modules import each other in a circle.

Every ``import`` and ``from ... import`` of every module under ``parallax_nb/`` is read with
``ast`` (also those inside functions: a lazy import is still a dependency), resolved to the
module it names, and checked against the room order of DESIGN.md §4:

    base -> job -> profile -> cost/plan -> runtime -> cluster -> widgets -> report -> face

A module may import its own room and rooms to its left, except the edges in
:data:`FORBIDDEN`. The face is what a user calls: the package's ``__init__``, the command line
and the ``%parallax`` magics, which drive every room (``%parallax report`` writes a report).
Pure Python; no module is imported.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "parallax_nb"

ROOMS = ("base", "job", "profile", "cost", "runtime", "cluster", "widgets", "report", "face")

# module or package (dotted, under parallax_nb) -> room; the longest matching prefix wins
ROOM_OF = {
    "errors": "base", "types": "base", "version": "base", "labels": "base", "jsonfile": "base", "progress": "base",
    "devices": "base", "environment": "base", "svg": "base", "failures": "base", "calibration": "base",
    "allgatherv": "base",
    "ops": "job", "job": "job", "job_checks": "job", "workloads": "job",
    "profile": "profile",
    "cost": "cost", "plan": "cost", "executed": "cost", "planner": "cost", "staleness": "cost",
    "runtime": "runtime",
    "launch": "cluster", "calibrate": "cluster", "cluster": "cluster", "netem": "cluster",
    "widgets": "widgets",
    "report": "report",
    "": "face", "__main__": "face", "cli": "face", "magics": "face", "sync_flags": "face",
}

# (room, room) pairs that may not import each other although the order allows it
FORBIDDEN = {
    ("runtime", "profile"): "the ranks run the plan; the job's checks live in parallax_nb.job_checks",
}

# modules that may not import these third-party packages, whatever their room
NO_THIRD_PARTY = {
    "cluster": ("tensorflow", "keras", "horovod", "ipywidgets"),
    "cost": ("tensorflow", "keras", "horovod", "ipywidgets", "numpy"),
    "plan": ("tensorflow", "keras", "horovod", "ipywidgets"),
    "types": ("tensorflow", "keras", "horovod", "ipywidgets"),
    "calibration": ("tensorflow", "keras", "horovod", "ipywidgets", "numpy"),
    "executed": ("tensorflow", "keras", "horovod", "ipywidgets"),
    "staleness": ("tensorflow", "keras", "horovod", "ipywidgets", "numpy"),
    "planner": ("tensorflow", "keras", "horovod", "ipywidgets"),
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def room(name: str) -> str:
    parts = name.split(".") if name else []
    for n in range(len(parts), -1, -1):
        prefix = ".".join(parts[:n])
        if prefix in ROOM_OF:
            return ROOM_OF[prefix]
    raise AssertionError(f"module parallax_nb.{name} has no room in tests/test_imports.py: add it to ROOM_OF")


def imports_of(name: str) -> tuple[set[str], set[str]]:
    """(package modules, top-level third-party names) that module ``name`` imports."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    here = name.split(".") if name else []
    if not is_package(name):
        here = here[:-1]
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "parallax_nb" or alias.name.startswith("parallax_nb."):
                    inside.add(alias.name.removeprefix("parallax_nb").lstrip("."))
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module == "parallax_nb" or node.module.startswith("parallax_nb.")):
                    outside.add(node.module.split(".")[0])
                    continue
                base = node.module.removeprefix("parallax_nb").lstrip(".")
            else:
                anchor = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                inside.add(sub if sub in MODULES else base)
    return {m for m in inside if m != name}, outside


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_room_and_imports_exist():
    for name, (inside, _) in GRAPH.items():
        room(name)
        unknown = sorted(m for m in inside if m not in MODULES)
        assert not unknown, f"parallax_nb.{name} imports modules that do not exist: {unknown}"


def test_rooms_import_only_leftwards():
    wrong = []
    for name, (inside, _) in GRAPH.items():
        mine = ROOMS.index(room(name))
        for target in sorted(inside):
            why = FORBIDDEN.get((room(name), room(target)))
            if ROOMS.index(room(target)) > mine or why:
                wrong.append(f"parallax_nb.{name or '__init__'} ({room(name)}) imports "
                             f"parallax_nb.{target or '__init__'} ({room(target)})" + (f": {why}" if why else ""))
    assert not wrong, "imports against the flow " + " -> ".join(ROOMS) + ":\n" + "\n".join(wrong)


@pytest.mark.parametrize("prefix", sorted(NO_THIRD_PARTY))
def test_pure_rooms_leave_heavy_packages_alone(prefix):
    wrong = []
    for name, (_, outside) in GRAPH.items():
        if name == prefix or name.startswith(prefix + "."):
            wrong += [f"parallax_nb.{name} imports {pkg}" for pkg in sorted(outside & set(NO_THIRD_PARTY[prefix]))]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Depth-first search over module -> imported module; any back edge is a cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH[node][0]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(f"parallax_nb.{m or '__init__'}" for m in c)
                                                      for c in cycles)


def test_the_checker_sees_a_forbidden_edge_and_a_cycle(monkeypatch):
    """The checks above would fail on a planted cycle and a planted rightward import."""
    fake = dict(GRAPH)
    fake["cost.estimate"] = (GRAPH["cost.estimate"][0] | {"widgets"}, set())
    fake["widgets"] = (GRAPH["widgets"][0] | {"cost.estimate"}, set())
    monkeypatch.setitem(globals(), "GRAPH", fake)
    with pytest.raises(AssertionError, match="imports parallax_nb.widgets"):
        test_rooms_import_only_leftwards()
    fake["runtime.trainer"] = (GRAPH["runtime.trainer"][0] | {"profile.profiler"}, set())
    with pytest.raises(AssertionError, match="runtime.trainer .runtime. imports parallax_nb.profile.profiler"):
        test_rooms_import_only_leftwards()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()
