"""The inference runtime returns graph outputs directly when there is nothing to rebuild
(no mutation, alias, constant or nested output), and rebuilds them otherwise."""
import torch

import ember
from ember.aot import aot_compile
from ember.aot.runtime import InferenceRuntime


def _run(fn, *args):
    gm = torch.fx.symbolic_trace(fn)
    rt = aot_compile(gm, list(args), fw_compiler=lambda g, ex: g)
    assert isinstance(rt, InferenceRuntime)
    return rt, rt(*args)


def test_plain_outputs_take_the_direct_path():
    x = torch.randn(3, 4)
    rt, out = _run(lambda x: (x.sin(), x + 1), x)
    assert rt.direct
    torch.testing.assert_close(out[0], x.sin())
    torch.testing.assert_close(out[1], x + 1)


def test_mutation_alias_and_nesting_are_rebuilt():
    x = torch.randn(3, 4)
    rt, out = _run(lambda x: (x.add_(1), x.view(-1)), x.clone())
    assert not rt.direct
    assert out[1]._base is out[0] or out[1].data_ptr() == out[0].data_ptr()
    rt, out = _run(lambda x: {"a": x * 2}, x)
    assert not rt.direct
    torch.testing.assert_close(out["a"], x * 2)
    ember.reset()


def test_flat_view_outputs_skip_the_pytree(monkeypatch):
    """A view output (global pooling's .flatten(1)) is rebuilt per call, but a flat tuple of
    outputs needs no pytree round trip (training too); nested outputs still take it."""
    from ember.aot import runtime

    def unflatten(*a):
        raise AssertionError("tree_unflatten called for flat outputs")
    x = torch.randn(2, 3, 4, 4)
    fn = lambda x: x.mean((2, 3), keepdim=True).flatten(1)  # noqa: E731
    rt, _ = _run(fn, x)
    assert not rt.direct and rt.outputs.source.endswith("return o0\n")
    monkeypatch.setattr(runtime, "tree_unflatten", unflatten)
    torch.testing.assert_close(rt(x), fn(x))
    rt, _ = _run(lambda x: (fn(x), x.flatten(2)), x)
    assert not rt.direct and "unflatten" not in rt.outputs.source
    out = rt(x)
    torch.testing.assert_close(out[0], fn(x))
    torch.testing.assert_close(out[1], x.flatten(2))
    xg = x.clone().requires_grad_()
    gm = torch.fx.symbolic_trace(fn)
    rt = aot_compile(gm, [xg], fw_compiler=lambda g, ex: g)
    out = rt(xg)
    out.sum().backward()
    torch.testing.assert_close(out, fn(x))
    torch.testing.assert_close(xg.grad, torch.full_like(x, 1 / 16))
    monkeypatch.undo()
    rt, out = _run(lambda x: {"a": x.flatten(1)}, x)
    assert "unflatten" in rt.outputs.source
    torch.testing.assert_close(out["a"], x.flatten(1))
    ember.reset()


def test_view_outputs_of_graph_values_are_tensor_method_views():
    """A view of a graph output is replayed per call with the Tensor method (the aten op's
    generic binding costs ~2 us more); its values, base and aliasing stay eager's: two views of
    one graph value alias each other, a write through one shows in the other."""
    from ember.aot import runtime
    x = torch.randn(2, 3, 4)
    rt, out = _run(lambda x: (lambda y: (y.view(6, 4), y.permute(2, 0, 1)))(x * 2), x)
    assert not rt.direct
    names = [v.__name__ for k, v in rt.outputs.__globals__.items() if k.startswith("V")]
    assert sorted(names) == ["permute", "view"]
    assert all(rt.outputs.__globals__[k] in runtime._VIEW_METHODS.values()
               for k in rt.outputs.__globals__ if k.startswith("V"))
    torch.testing.assert_close(out[0], (x * 2).view(6, 4))
    torch.testing.assert_close(out[1], (x * 2).permute(2, 0, 1))
    assert out[0]._base is out[1]._base and out[0]._base is not None
    out[0][0, 0] = 100.0
    assert out[1][0, 0, 0] == 100.0
    # a view of an input keeps the aten op (the input may be a subclass)
    rt, out = _run(lambda x: (x.view(6, 4), x + 1), x)
    assert [k for k in rt.outputs.__globals__ if k.startswith("V")] == ["V0_0"]
    assert rt.outputs.__globals__["V0_0"] is torch.ops.aten.view.default
    assert out[0]._base is x
    ember.reset()
