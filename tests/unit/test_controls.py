"""The controls torch.compile users know: set_stance, error_on_graph_break, mark_static,
nested_compile_region. Each against eager, with counts of graphs / backend calls / recompiles."""
from __future__ import annotations

import copy

import pytest
import torch

import ember

GRAPHS: list = []


def _counting(gm, example_inputs):
    """aot_eager, recording each graph's ops (by target name) as the backend receives it."""
    GRAPHS.append([getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
                   if n.op in ("call_function", "call_method", "call_module")])
    return ember.get_backend("aot_eager")(gm, example_inputs)


ember.register_backend("test-controls", _counting)


@pytest.fixture(autouse=True)
def _clean():
    GRAPHS.clear()
    yield
    ember.set_stance("default")


def _counts():
    return ember.stats()["counts"]


def _fn():
    @ember.compile(backend="test-controls", dynamic=False)
    def f(x):
        return torch.sin(x) * 2 + 1
    return f


def _ref(x):
    return torch.sin(x) * 2 + 1


# ---- set_stance ------------------------------------------------------------------------------
def test_force_eager_as_context_manager_plain_call_and_decorator():
    f, x = _fn(), torch.randn(3)
    with ember.set_stance("force_eager"):
        torch.testing.assert_close(f(x), _ref(x))
    assert GRAPHS == [] and _counts().get("graphs", 0) == 0
    torch.testing.assert_close(f(x), _ref(x))              # default again: compiles
    assert len(GRAPHS) == 1

    ember.set_stance("force_eager")                          # a plain call: on until changed
    y = torch.randn(5)
    torch.testing.assert_close(f(y), _ref(y))
    ember.set_stance("default")
    assert len(GRAPHS) == 1                                  # the size-5 calls compiled nothing

    @ember.set_stance("force_eager")
    def run(t):
        return f(t)
    torch.testing.assert_close(run(torch.ones(7)), _ref(torch.ones(7)))
    assert len(GRAPHS) == 1
    f(torch.ones(7))                                         # the decorator left "default" on
    assert len(GRAPHS) == 2


def test_force_eager_module_runs_forward_eagerly():
    torch.manual_seed(0)
    m = ember.compile(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()),
                      backend="test-controls")
    x = torch.randn(2, 4)
    with ember.set_stance("force_eager"):
        out = m(x)
    torch.testing.assert_close(out, torch.relu(m[0](x)))
    assert GRAPHS == []


def test_eager_on_recompile_uses_cached_entries_and_never_compiles_again():
    f, x3, x4 = _fn(), torch.randn(3), torch.randn(4)
    f(x3)
    assert len(GRAPHS) == 1
    with ember.set_stance("eager_on_recompile"):
        torch.testing.assert_close(f(x3), _ref(x3))
        eager_before = _counts().get("eager_calls", 0)
        torch.testing.assert_close(f(x4), _ref(x4))         # would recompile: eager instead
        assert _counts()["eager_calls"] == eager_before + 1
    assert len(GRAPHS) == 1 and _counts().get("recompiles", 0) == 0
    f(x4)                                                    # default: recompiles now
    assert len(GRAPHS) == 2 and _counts()["recompiles"] == 1


def test_fail_on_recompile_raises_naming_the_guard():
    f, x3 = _fn(), torch.randn(3)
    f(x3)
    with ember.set_stance("fail_on_recompile"):
        torch.testing.assert_close(f(x3), _ref(x3))         # a cache hit is fine
        with pytest.raises(ember.RecompileError, match=r"fail_on_recompile.*failed guard:.*x"):
            f(torch.randn(4))
        g = ember.compile(lambda t: t + 1, backend="test-controls")
        torch.testing.assert_close(g(x3), x3 + 1)           # a first compile is not a recompile
    assert issubclass(ember.RecompileError, RuntimeError)
    assert len(GRAPHS) == 2


def test_set_stance_rejects_bad_input():
    with pytest.raises(ValueError, match="valid stances: default, force_eager, "
                                         "eager_on_recompile, fail_on_recompile"):
        ember.set_stance("sometimes")
    with pytest.raises(TypeError, match="stance must be a str"):
        ember.set_stance(None)
    with pytest.raises(TypeError, match="decorates a function"):
        ember.set_stance("default")(3)


# ---- error_on_graph_break --------------------------------------------------------------------
def _breaking():
    @ember.compile(backend="test-controls")
    def f(x):
        y = x * 2
        print("graph break here")                # an eager call: the graph splits around it
        return y + 1
    return f


def test_error_on_graph_break_scopes_fullgraph(capsys):
    f, x = _breaking(), torch.randn(3)
    with ember.error_on_graph_break(True):
        with pytest.raises(ember.Unsupported, match="print"):
            f(x)
        with ember.error_on_graph_break(False):            # an inner False allows breaks again
            torch.testing.assert_close(f(x), x * 2 + 1)
    assert _counts()["graph_breaks"] == 1 and len(GRAPHS) == 2

    g = _breaking()
    torch.testing.assert_close(ember.error_on_graph_break(False)(g)(x), x * 2 + 1)
    ember.reset()      # it applies where a frame compiles: the cached entry above would serve
    with pytest.raises(ember.Unsupported):
        ember.error_on_graph_break()(_breaking())(x)        # default True, as a decorator
    with pytest.raises(TypeError, match="True or False"):
        ember.error_on_graph_break("yes")


# ---- mark_static -----------------------------------------------------------------------------
def test_mark_static_keeps_automatic_dynamic_off_that_dim():
    @ember.compile(backend="aot_eager")          # automatic dynamic (a user backend: static)
    def f(x):
        return x.sum(0) * 2

    for n in (3, 4, 5):
        x = torch.randn(n, 2)
        ember.mark_static(x, 0)
        torch.testing.assert_close(f(x), x.sum(0) * 2)
    assert _counts()["graphs"] == 3              # without the mark: 2 (dim 0 goes dynamic)
    ember.reset()
    for n in (3, 4, 5):
        x = torch.randn(n, 2)
        torch.testing.assert_close(f(x), x.sum(0) * 2)
    assert _counts()["graphs"] == 2


def test_mark_static_wins_over_dynamic_true_and_mark_dynamic():
    @ember.compile(backend="test-controls", dynamic=True)
    def f(x):
        return x * 3

    for n in (3, 4):
        x = torch.randn(n)
        ember.mark_dynamic(x, 0)
        ember.mark_static(x, 0)
        torch.testing.assert_close(f(x), x * 3)
    assert len(GRAPHS) == 2 and _counts()["recompiles"] == 1


def test_mark_static_rejects_bad_input():
    with pytest.raises(ValueError, match=r"valid: -2 \.\. 1"):
        ember.mark_static(torch.randn(2, 2), 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ember.mark_static([1, 2], 0)
    with pytest.raises(TypeError, match="does not specialize modules"):
        ember.mark_static(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="int or a list of ints"):
        ember.mark_static(torch.randn(2), "0")


# ---- nested_compile_region -------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Stack(torch.nn.Module):
    def __init__(self, n=6, d=16):
        super().__init__()
        self.inp = torch.nn.Linear(d, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        x = torch.tanh(self.inp(x))
        for b in self.blocks:
            x = b(x)
        return x


def _layer_norms() -> int:
    return sum(ops.count("layer_norm") for ops in GRAPHS)


def _train_and_compare(region: bool, fullgraph: bool = False):
    torch.manual_seed(0)
    ref = Stack()
    m = copy.deepcopy(ref)
    if region:
        for b in m.blocks:
            ember.nested_compile_region(b)
    ember.compile(m, backend="test-controls", fullgraph=fullgraph)
    for step in range(2):
        x = torch.randn(4, 16)
        out, expected = m(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_region_blocks_compile_once_with_eager_values_and_grads():
    _train_and_compare(region=True)
    assert _layer_norms() == 1                   # six instances, one compiled block
    assert _counts().get("recompiles", 0) == 0
    ember.reset()
    GRAPHS.clear()
    _train_and_compare(region=False)
    assert _layer_norms() == 6                   # inlined: each instance traced and compiled


def test_region_is_inlined_where_the_graph_may_not_split():
    _train_and_compare(region=True, fullgraph=True)
    assert len(GRAPHS) == 1 and _layer_norms() == 6


def test_region_class_and_function_forms():
    @ember.nested_compile_region
    def mlp(x, w):
        return torch.sin(x @ w) + 1

    @ember.compile(backend="test-controls")
    def f(x, w1, w2):
        return mlp(mlp(x, w1), w2) * 3

    x, w1, w2 = torch.randn(2, 8), torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(f(x, w1, w2), (torch.sin((torch.sin(x @ w1) + 1) @ w2) + 1) * 3)
    assert sum(ops.count("sin") for ops in GRAPHS) == 1
    GRAPHS.clear()
    torch.testing.assert_close(mlp(x, w1), torch.sin(x @ w1) + 1)  # outside compiled code: eager
    assert GRAPHS == []

    class Marked(Block):
        pass
    assert ember.nested_compile_region(Marked) is Marked
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[Marked() for _ in range(3)])
    ref = copy.deepcopy(blocks)
    ember.compile(blocks, backend="test-controls")
    x = torch.randn(3, 16, requires_grad=True)
    torch.testing.assert_close(blocks(x), ref(x))
    assert _layer_norms() == 1


def test_region_rejects_bad_input():
    with pytest.raises(TypeError, match="Python function, an nn.Module or an nn.Module subclass"):
        ember.nested_compile_region(42)
    with pytest.raises(TypeError, match="got builtin_function_or_method"):
        ember.nested_compile_region(len)
