"""simulator/ has no import cycle: its modules import each other as a layered graph
(docs/design.md section 1), counting every import a module makes, at its top, inside a function,
or under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "simulator"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name``'s code imports (``from a import b`` counts a.b
    when that is a module, else a)."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m in known and m != name}


def import_graph() -> nx.DiGraph:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    names = {_module_name(f): f for f in files}
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    for name, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in _imported(tree, name, path.name == "__init__.py", set(names)):
            if not name.startswith(target + "."):  # a package's submodule reaching its parent is no edge back
                graph.add_edge(name, target)
    return graph


def _cycles_between_modules(graph: nx.DiGraph) -> list[list[str]]:
    """Cycles of the graph without the package __init__ files (which re-export their submodules and so
    sit above them)."""
    packages = {n for n in graph if (ROOT / n.replace(".", "/") / "__init__.py").exists()}
    return list(nx.simple_cycles(graph.subgraph(set(graph) - packages)))


def test_simulator_has_no_import_cycle():
    cycles = _cycles_between_modules(import_graph())
    assert not cycles, "import cycles in simulator/: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:10])


def test_the_graph_sees_known_edges():
    graph = import_graph()
    assert graph.has_edge("simulator.job", "simulator.runtime_spec")
    assert graph.has_edge("simulator.cost.rank_view", "simulator.job")  # under TYPE_CHECKING: counted
    assert graph.has_edge("simulator.analytic.batch.estimate", "simulator.cost.fsdp2_sync")
