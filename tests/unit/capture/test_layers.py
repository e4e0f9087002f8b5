"""Capture's layers (issue 25): the interpreter core never imports the residual-code layer
(breaks) or the cache layer (entry), and breaks never imports entry, function-local imports
included; the cache layer hands breaks what it needs (the Runner: trace, make_entry, route)."""
from __future__ import annotations

import ast
import pathlib

import ember.capture

PKG = pathlib.Path(ember.capture.__file__).parent
UPPER = {"entry": {"explain"}, "breaks": {"entry", "explain"}}   # module -> modules above it


def _imports(path: pathlib.Path) -> set[str]:
    """Sibling capture modules `path` imports anywhere in its body (relative imports)."""
    out = set()
    depth = len(path.relative_to(PKG).parts)          # 1: capture/x.py, 2: capture/handlers/x.py
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == depth and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == depth and not node.module:
            out.update(a.name for a in node.names)
    return out


def test_core_does_not_import_upper_layers():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        name = path.stem if path.parent == PKG else f"handlers.{path.stem}"
        if name in ("__init__", "entry", "explain"):
            continue
        upper = UPPER["breaks"] if name == "breaks" else {"breaks", "entry", "explain"}
        hits = _imports(path) & upper
        if hits:
            bad.append(f"{path.relative_to(PKG)} imports {sorted(hits)}")
    assert not bad, bad
