"""The loop IR's home (ember.loopir): a declared op vocabulary, the printer, the frozen plan and
the debug dump of every stage between the aten graph and the C++."""
import ast
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ember.loopir.ops import OPS, CountHandler, OpsHandler, ops, set_handler

from .helpers import compile_fn

ROOT = Path(__file__).resolve().parents[3] / "ember"


def _ops_names(path: Path):
    """(line, name) of every `ops.<name>` and `getattr(ops, "<name>")` in a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "ops":
            yield node.lineno, node.attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "ops" \
                and isinstance(node.args[1], ast.Constant):
            yield node.lineno, node.args[1].value


@pytest.mark.parametrize("package", ["lower", "schedule", "loopir", "codegen"])
def test_every_op_used_is_declared_on_the_handler_base(package):
    files = sorted((ROOT / package).rglob("*.py"))
    used = [(f, line, name) for f in files for line, name in _ops_names(f)]
    assert package in ("schedule", "codegen") or used      # the scan finds the calls
    bad = [f"{f}:{line}: ops.{name}" for f, line, name in used
           if name not in OPS or not callable(getattr(OpsHandler, name, None))]
    assert not bad, "not declared in ember/loopir/ops.py:\n" + "\n".join(bad)


def test_unknown_op_names_raise_at_once():
    with pytest.raises(AttributeError, match="not a loop-IR op"):
        ops.exq                                         # noqa: B018 - a misspelled op
    with pytest.raises(AttributeError):
        CountHandler().exq
    h = CountHandler()
    with set_handler(h):
        ops.exp(ops.load("buf0", 0))
    assert (h.loads, h.ops, h.transcendental) == (1, 1, 1)
    with pytest.raises(NotImplementedError, match="does not handle ops.exp"):
        OpsHandler().exp(None)


def _layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b).relu()


def test_layernorm_prints_from_loop_ir_to_plan(tmp_path, monkeypatch):
    """Through the debug dir alone: aten graph, loop IR, plan, C++ and wrapper of one graph, each
    once, in the order the stages ran; the printed loop IR names every buffer the C++ uses."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    x, w, b = torch.randn(8, 32), torch.randn(32), torch.randn(32)
    run, stats = compile_fn(_layernorm, x, w, b)
    torch.testing.assert_close(run(x, w, b)[0], _layernorm(x, w, b), atol=1e-5, rtol=1e-5)
    (folder,) = (tmp_path / "debug").iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["01_aot.py", "02_lower.py", "03_schedule.py", "04_kernels.cpp",
                     "05_wrapper.py"], names
    lowered = (folder / "02_lower.py").read_text()
    first = lowered.splitlines()[0]
    assert first.startswith("# after lower: ") and "2 reductions" in first, first
    assert "ops.load('arg0'" in lowered and "# reduction sum" in lowered
    plan = (folder / "03_schedule.py").read_text()
    assert plan.startswith(f"# after schedule: {stats['kernels']} kernels, 0 externs"), plan
    assert "kernel0(" in plan and "reduction" in plan
    cpp = (folder / "04_kernels.cpp").read_text()
    assert cpp.startswith("// after kernels: 1 C++ kernels") and "void kernel0" in cpp
    assert stats["kernels"] == 1


def test_schedule_result_is_a_frozen_plan():
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.loopir.plan import Kernel, Plan
    from ember.lower.lowering import GraphLowering
    from ember.schedule import schedule

    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    gm = trace_aten(_layernorm, (x, w, b), decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, [x, w, b]).run())
    assert isinstance(plan, Plan) and len(plan.kernels) == 1 and not plan.externs
    assert isinstance(plan.steps[0], Kernel) and len(plan.reads) == len(plan.steps)
    assert set(plan.reads[0]) == {"arg0", "arg1", "arg2"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps = ()
