"""Guards, cache, explain, logging and the import rule of the capture stage."""
from __future__ import annotations

import ast
import logging
import pathlib

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture
from ember.capture.guards import Guard
from ember.capture.sources import LocalSource

x3 = torch.randn(3)

FORBIDDEN = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp", "torch._refs",
             "torch._prims", "torch._subclasses", "torch.fx.experimental.proxy_tensor",
             "torch.export", "torch.compiler")


def test_capture_imports_no_forbidden_torch_internals():
    root = pathlib.Path(ember.__file__).parent / "capture"
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Attribute):
                names = [ast.unparse(node)]
            for n in names:
                assert not n.startswith(FORBIDDEN) and "torch.compile(" not in n, (path, n)
        assert "set_eval_frame" not in path.read_text(), path


def test_guard_expressions_are_printable_data():
    g = Guard("TENSOR", LocalSource("x", 0), (torch.Tensor, torch.float32, torch.device("cpu"),
                                              (3,), (1,), False, False))
    ns = {}

    def bind(o):
        ns[f"k{len(ns)}"] = o
        return f"k{len(ns) - 1}"
    expr = g.expr(bind)
    assert "L0.shape" in expr and "L0.is_cpu" in expr
    assert "shape=[3]" in g.describe()


def test_explain_reports_graphs_ops_guards():
    def f(x, n):
        return (x * n).relu()
    e = capture.explain(f, x3, 2)
    assert len(e.graphs) == 1 and e.ops_per_graph == [2] and e.breaks == [] and e.recompiles == 0
    assert e.fallbacks == 0
    text = str(e)
    assert "graphs: 1" in text and "TENSOR: L['x']" in text and "EQ: L['n'] 2" in text
    node = next(n for n in e.graphs[0].graph.nodes if n.op == "call_function")
    assert node.meta["example_value"].device.type == "meta"
    # ember.explain is the same
    assert len(ember.explain(f, x3, 2).graphs) == 1


def test_explain_counts_frames_that_ran_eagerly(monkeypatch):
    monkeypatch.setenv("EMBER_STRICT", "0")

    def f(x):
        y = x * 2
        ctx = torch.no_grad()   # a context object in a local: no resumable break (v1)
        print("mid")
        with ctx:
            return y + 1
    ember.reset()
    with pytest.warns(UserWarning, match="(?s)runs eagerly.*print.*no graph break here"):
        e = ember.explain(f, x3)
    assert e.fallbacks == 1 and e.graphs == [] and "fallbacks: 1" in str(e)
    torch.testing.assert_close(e.result, x3 * 2 + 1)


def test_graph_is_clean_fx_with_tensor_placeholders():
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ember.compile(m, backend=backend, fullgraph=True)
    m(torch.randn(2, 4))
    gm, ex = seen[0]
    assert isinstance(gm, torch.fx.GraphModule)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(ex) == 2 + 5 + 1          # linear w,b; bn w,b,mean,var,count; input
    assert all(isinstance(t, torch.Tensor) for t in ex)
    assert not any(n.op in ("call_module", "get_attr", "call_method") for n in gm.graph.nodes)
    assert all("example_value" in n.meta for n in gm.graph.nodes if n.op != "output")


def test_cache_mru_and_counts():
    def f(x):
        return x * 2
    cf = ember.compile(f, backend="eager", fullgraph=True)
    a, b = torch.randn(2), torch.randn(3)
    for t in (a, b, a, b, a):
        torch.testing.assert_close(cf(t), t * 2)
    st = capture.stats()
    assert st["graphs"] == 2 and st["recompiles"] == 1


def test_recompile_log_names_failed_guard(monkeypatch, caplog):
    monkeypatch.setenv("EMBER_LOGS", "recompiles,guards")
    from ember.logging import get_logger
    lg = get_logger("recompiles")
    lg.propagate = True
    get_logger("guards").propagate = True

    def f(x):
        return x + 1
    cf = ember.compile(f, backend="eager", fullgraph=True)
    with caplog.at_level(logging.INFO, logger="ember"):
        cf(torch.randn(2))
        cf(torch.randn(2, 2))
    assert any("guard failed" in r.getMessage() and "shape=[2]" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    lg.propagate = False
    get_logger("guards").propagate = False


def test_guard_failure_on_dtype_requires_grad_and_none():
    def f(x, y=None):
        return x + 1 if y is None else x + y
    cf = ember.compile(f, backend="eager", fullgraph=True)
    cf(torch.randn(2))
    cf(torch.randn(2, dtype=torch.float64))
    cf(torch.randn(2, requires_grad=True))
    cf(torch.randn(2), torch.randn(2))
    assert capture.stats()["recompiles"] == 3


def test_module_mutation_epoch_and_state_dict_roundtrip():
    m = nn.Linear(3, 3)
    ember.compile(m, backend="eager", fullgraph=True)
    m(x3)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        m.weight.mul_(0)
    torch.testing.assert_close(m(x3), m.bias)        # in-place param change is seen
    m.load_state_dict(sd)
    torch.testing.assert_close(m(x3), torch.nn.functional.linear(x3, sd["weight"], sd["bias"]))
    assert type(m) is nn.Linear and list(m.state_dict()) == ["weight", "bias"]
    assert capture.stats().get("recompiles", 0) == 0


def test_reset_drops_caches():
    def f(x):
        return x - 1
    cf = ember.compile(f, backend="eager", fullgraph=True)
    cf(x3)
    ember.reset()
    cf(x3)
    assert capture.stats()["graphs"] == 1 and capture.stats().get("recompiles", 0) == 0


def test_unsupported_message_names_construct_and_hint():
    def f(x):
        return x.tolist()
    with pytest.raises(ember.Unsupported) as ei:
        ember.compile(f, backend="eager", fullgraph=True)(x3)
    msg = str(ei.value)
    assert "test_guards_cache.py:" in msg and "tolist" in msg and "hint:" in msg


def test_closure_cell_change_is_seen():
    scale = [2.0]

    def make(s):
        def f(x):
            return x * s
        return f
    f2, f3 = make(2.0), make(3.0)
    c2 = ember.compile(f2, backend="eager", fullgraph=True)
    c3 = ember.compile(f3, backend="eager", fullgraph=True)
    torch.testing.assert_close(c2(x3), x3 * 2)
    torch.testing.assert_close(c3(x3), x3 * 3)
    del scale
