"""The import structure of lmlab: no circles between modules or between packages, and data flows
one way (text -> tokens -> objective -> model -> loss -> engine). Every ``import`` counts, the ones
inside functions too: a lazy import still ties the two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

import lmlab

SRC = Path(lmlab.__file__).parent


def module_names() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the lmlab modules it imports (``from a.b import c`` counts a.b.c when that is a
    module, else a.b)."""
    mods = module_names()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets = []
            ours = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmlab")
            if ours and node.level == 0:
                targets = [resolve(f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names if a.name.startswith("lmlab")]
            graph[m].update(t for t in targets if t and t != m)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        for t in targets:
            a, b = package_of(m), package_of(t)
            if a != b and a != "lmlab":
                out.setdefault(a, set()).add(b)
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_packages_form_layers():
    assert cycles(package_graph(import_graph())) == []


# lower layer -> packages it must never import (the data flow, and what sits above models)
FORBIDDEN = {
    "lmlab.tokenizers": {"lmlab.data", "lmlab.objectives", "lmlab.models", "lmlab.train", "lmlab.finetune"},
    "lmlab.data": {"lmlab.objectives", "lmlab.models", "lmlab.train", "lmlab.finetune", "lmlab.lab"},
    "lmlab.models": {"lmlab.adapt", "lmlab.interop", "lmlab.objectives", "lmlab.train", "lmlab.finetune",
                     "lmlab.lab", "lmlab.loading", "lmlab.cli"},
    "lmlab.objectives": {"lmlab.train", "lmlab.finetune", "lmlab.lab", "lmlab.cli"},
    "lmlab.interop": {"lmlab.adapt", "lmlab.train", "lmlab.finetune", "lmlab.lab", "lmlab.loading"},
    "lmlab.adapt": {"lmlab.finetune", "lmlab.lab", "lmlab.loading", "lmlab.cli"},
    "lmlab.train": {"lmlab.finetune", "lmlab.align", "lmlab.lab", "lmlab.cli"},
    "lmlab.finetune": {"lmlab.align", "lmlab.lab", "lmlab.cli"},
    "lmlab.align": {"lmlab.lab", "lmlab.cli"},
}


def test_lower_layers_do_not_reach_up():
    packages = package_graph(import_graph())
    reaching_up = {low: sorted(packages.get(low, set()) & high) for low, high in FORBIDDEN.items()}
    assert {k: v for k, v in reaching_up.items() if v} == {}


def test_the_machine_policy_sits_below_the_models():
    """lmlab.runtime (device, threads, precision) imports only lmlab's errors, so any module, the
    models included, may use it; and the models draw no native code of their own."""
    graph = import_graph()
    assert graph["lmlab.runtime"] == {"lmlab.errors"}
    assert not any(m.startswith("lmlab.native") for m in graph)
    # plain PyTorch: nothing is compiled at run time or loaded through ctypes
    assert sorted(SRC.rglob("*.c")) == []
    assert [f.name for f in SRC.rglob("*.py") if "ctypes" in f.read_text(encoding="utf-8")] == []
