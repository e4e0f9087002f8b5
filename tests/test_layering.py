"""The tree's boundaries, checked with `ast` over every import, function-local ones included: no
forbidden torch internals in product code, imports between stage packages flow one way (capture →
backends → aot → decomp → lower → schedule → codegen → runtime), the kernel backend's stages
(lower, schedule, codegen, runtime) share only the loop IR (ember.loopir) and never import each
other (ember.backends.ember runs them in turn), and no import cycles."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "ember"
STAGES = ["capture", "backends", "aot", "decomp", "lower", "schedule", "codegen", "runtime"]
SHARED = {"config", "errors", "logging", "counters", "progress", "debug"}
#: the loop IR: what lower produces, schedule plans, codegen prints and runtime launches
IR = "loopir"
BACKEND_STAGES = ("lower", "schedule", "codegen", "runtime")
# Tooling that may use anything (benchmarks measure against torch.compile); nothing imports it.
TOOLING = {"bench"}
TOP = {"__init__", "api", "cli", "__main__"}   # the public surface and its entry points
FORBIDDEN = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp", "torch._refs",
             "torch._prims", "torch._subclasses", "torch.fx.experimental.proxy_tensor",
             "torch.export", "torch.compiler", "torch.func.functionalize")
FORBIDDEN_CALLS = ("torch.compile", "torch.compiler", "torch.func.functionalize", "torch.export")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, top_level_only: bool = False):
    """(line, imported module name) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if ROOT in path.parents:
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    else:
        package = ""
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for alias in node.names:  # `from torch import _dynamo`, `from .. import aot`
                yield node.lineno, f"{mod}.{alias.name}"


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


PRODUCT_FILES = [p for p in sorted(ROOT.rglob("*.py")) if _area(_module_name(p)) not in TOOLING]


def test_tree_is_nonempty():
    assert len(PRODUCT_FILES) > 10


@pytest.mark.parametrize("path", PRODUCT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_forbidden_torch_internals(path):
    bad = [f"{path}:{line}: imports {mod}" for line, mod in _imports(path)
           if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN)]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and any(name == f or name.startswith(f + ".") for f in FORBIDDEN_CALLS):
                bad.append(f"{path}:{node.lineno}: uses {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", PRODUCT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
    src_area = _area(_module_name(path))
    if src_area in TOP:
        return  # the public surface may use every stage
    bad = []
    for line, mod in _imports(path):
        if not mod.startswith("ember."):  # bare `ember` is `from ember import x`: x is checked
            continue
        dst_area = _area(mod)
        if dst_area == src_area or dst_area in SHARED:
            continue
        if dst_area == IR:
            if src_area not in BACKEND_STAGES + ("backends",):
                bad.append(f"{path}:{line}: {src_area} imports the loop IR ({mod})")
            continue
        if src_area == IR:
            bad.append(f"{path}:{line}: the loop IR imports {mod} (it imports shared modules only)")
            continue
        if src_area in BACKEND_STAGES and dst_area in BACKEND_STAGES:
            bad.append(f"{path}:{line}: {src_area} imports {dst_area} ({mod}); the kernel "
                       "backend's stages share only ember.loopir")
            continue
        if dst_area in TOOLING or dst_area in TOP:
            bad.append(f"{path}:{line}: product code imports {mod}")
        elif src_area in SHARED:
            bad.append(f"{path}:{line}: shared module imports stage {mod}")
        elif src_area in STAGES and dst_area in STAGES and STAGES.index(dst_area) < STAGES.index(src_area):
            bad.append(f"{path}:{line}: stage {src_area} imports earlier stage {dst_area} ({mod})")
    assert not bad, "\n".join(bad)


def _import_graph() -> nx.DiGraph:
    """module -> modules it imports, anywhere in the file (function-local imports too)."""
    names = {_module_name(p) for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for path in ROOT.rglob("*.py"):
        src = _module_name(path)
        for _, mod in _imports(path):
            # `from pkg import name` may name a submodule or an attribute; keep real modules only.
            if mod in names and mod != src and not src.startswith(mod + "."):
                graph.add_edge(src, mod)
    return graph


def _cycles(graph, inside: str | None = None, outside: str | None = None) -> list:
    out = []
    for scc in nx.strongly_connected_components(graph):
        if len(scc) < 2:
            continue
        areas = {_area(m) for m in scc}
        if (inside and areas != {inside}) or (outside and outside in areas):
            continue
        out.append(sorted(scc))
    return out


def test_no_import_cycles_outside_capture():
    cycles = _cycles(_import_graph(), outside="capture")
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_capture_cache_and_residual_layers_sit_above_the_interpreter():
    """The interpreter core may be one cycle (opcode handlers call back into it); the layers
    built on it (entry: cache and guards; breaks: residual code) must not be part of it."""
    layers = {"ember.capture.entry", "ember.capture.breaks"}
    bad = [c for c in _cycles(_import_graph(), inside="capture") if layers & set(c)]
    assert not bad, f"capture layers in an import cycle: {bad}"


def test_checker_catches_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch._dynamo\nfrom torch.fx.experimental import proxy_tensor\n")
    found = [mod for _, mod in _imports(bad)]
    assert "torch._dynamo" in found and "torch.fx.experimental.proxy_tensor" in found
