"""ember/aot uses no PyTorch compiler internals (the project's hard rule), checked with ast."""
import ast
import pathlib

FORBIDDEN = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp", "torch._refs",
             "torch._prims", "torch._subclasses", "torch.fx.experimental.proxy_tensor",
             "torch.export", "torch.compiler", "torch.func")
FORBIDDEN_CALLS = ("torch.compile", "make_fx", "FakeTensorMode", "FunctionalTensorMode")

ROOT = pathlib.Path(__file__).resolve().parents[3] / "ember"
FILES = sorted((ROOT / "aot").glob("*.py")) + [ROOT / "backends" / "aot_eager.py"]


def _dotted(node):
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    if isinstance(node, ast.Name):
        return node.id
    return None


def test_no_forbidden_imports_or_calls():
    assert len(FILES) >= 6
    bad = []
    for path in FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, (ast.Attribute, ast.Name)):
                d = _dotted(node)
                names = [d] if d else []
            for name in names:
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN) or \
                        any(name == c or name.endswith("." + c) for c in FORBIDDEN_CALLS):
                    bad.append(f"{path.name}:{node.lineno}: {name}")
    assert not bad, bad
