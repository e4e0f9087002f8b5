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
