"""Capture reuses the meta result of an eval-mode norm for the same argument metadata
(interpreter._META_MEMO): the captured graph's example values are those of the real meta
kernels, and a training-mode batch_norm (which writes its running stats) is never reused."""
import torch
import torch.nn.functional as F

import ember
from ember.capture import interpreter


def _norms(x, rm, rv, w, b):
    y = F.batch_norm(x, rm, rv, w, b, False)
    z = F.batch_norm(y, rm, rv, w, b, False)
    g = F.group_norm(z, 2, w, b)
    return g, F.layer_norm(g, g.shape[-2:]), F.group_norm(g, 2, w, b)    # the same metadata


def _captured_metas(fn, args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    ember.reset()
    ember.compile(fn, backend=backend)(*args)
    return [(n.name, tuple(v.shape), v.stride(), v.dtype) for n in graphs[0].graph.nodes
            if isinstance(v := n.meta.get("example_value"), torch.Tensor)]


def test_reused_meta_results_are_the_meta_kernels(monkeypatch):
    x = torch.randn(2, 4, 5, 6).to(memory_format=torch.channels_last)
    args = (x, torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4))
    with monkeypatch.context() as m:
        m.setattr(interpreter, "_MEMO_FNS", {})
        ref = _captured_metas(_norms, args)
    interpreter._META_MEMO.clear()
    first = _captured_metas(_norms, args)
    n = len(interpreter._META_MEMO)
    assert n >= 3                                   # batch_norm, group_norm, layer_norm
    assert _captured_metas(_norms, args) == first == ref
    assert len(interpreter._META_MEMO) == n         # every result reused
    ember.reset()
    for o, r in zip(ember.compile(_norms)(*args), _norms(*args)):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)


def test_training_batch_norm_is_not_reused():
    def f(x, rm, rv):
        return F.batch_norm(x, rm, rv, training=True) + F.batch_norm(x, rm, rv, training=True)
    x, rm, rv = torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3)
    interpreter._META_MEMO.clear()
    rm2, rv2 = rm.clone(), rv.clone()
    out = ember.compile(f)(x, rm, rv)
    assert not interpreter._META_MEMO
    torch.testing.assert_close(out, f(x, rm2, rv2))
    torch.testing.assert_close((rm, rv), (rm2, rv2))
