"""aot joint graph + autograd.Function runtime: grads, buffers and params match eager."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import aot_compile

from .helpers import GraphRecorder


def _leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def _compile(fn, inputs, rec, partitioner="min_cut"):
    return aot_compile(fn, inputs, fw_compiler=rec.fw_compiler, bw_compiler=rec.bw_compiler,
                       decompositions={}, partitioner=partitioner)


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_mlp_grads_and_lazy_backward(partitioner):
    def f(x, w1, b1, w2):
        return (F.linear(torch.tanh(F.linear(x, w1, b1)), w2).sum(),)

    x, params = torch.randn(6, 4), [_leaf(8, 4), _leaf(8), _leaf(3, 8)]
    rec = GraphRecorder()
    compiled = _compile(f, [x] + params, rec, partitioner)
    (loss,) = compiled(x, *params)
    assert len(rec.fw) == 1 and len(rec.bw) == 0          # backward compiled lazily
    grads = torch.autograd.grad(loss, params)
    assert len(rec.bw) == 1
    (ref,) = f(x, *params)
    for g, r in zip(grads, torch.autograd.grad(ref, params)):
        torch.testing.assert_close(g, r)
    compiled(x, *params)[0].backward()
    assert len(rec.bw) == 1                                   # compiled once


def test_outputs_without_grad_int_bool_and_unused_tangents():
    def f(x, w):
        y = x @ w
        return (y, y.argmax(1), y > 0, y.detach() * 2, (w * 3).sum())

    x, w = torch.randn(5, 4), _leaf(4, 3)
    rec = GraphRecorder()
    out = _compile(f, [x, w], rec)(x, w)
    ref = f(x, w)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
        assert a.requires_grad == b.requires_grad and a.dtype == b.dtype
    # only y and the last output feed the loss: the detached output's tangent is None → zeros
    (g,) = torch.autograd.grad(out[0].sum() + out[4], [w])
    (r,) = torch.autograd.grad(ref[0].sum() + ref[4], [w])
    torch.testing.assert_close(g, r)


def test_input_gradient_unused_is_none():
    def f(x, w, unused):
        return ((x * w).sum(),)

    x, w, u = _leaf(3), _leaf(3), _leaf(3)
    out = _compile(f, [x, w, u], GraphRecorder())(x, w, u)
    gx, gw, gu = torch.autograd.grad(out[0], [x, w, u], allow_unused=True)
    torch.testing.assert_close(gx, w.detach())
    torch.testing.assert_close(gw, x.detach())
    assert gu is None


def test_double_backward_raises_clearly():
    def f(x):
        return ((x ** 3).sum(),)

    x = _leaf(4)
    (y,) = _compile(f, [x], GraphRecorder())(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y, [x], create_graph=True)


def test_inference_under_no_grad_skips_joint():
    def f(x, w):
        return (torch.relu(x @ w),)

    x, w = torch.randn(3, 4), _leaf(4, 2)
    rec = GraphRecorder()
    with torch.no_grad():
        out = _compile(f, [x, w], rec)(x, w)
    assert len(rec.fw) == 1 and not rec.bw
    output = next(n for n in rec.fw[0].graph.nodes if n.op == "output")
    assert len(output.args[0]) == 1                          # no saved activations
    assert not out[0].requires_grad
    torch.testing.assert_close(out[0], torch.relu(x @ w.detach()))


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.ln = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        with torch.no_grad():
            scale = h.abs().mean() + 1          # a no_grad region inside the graph
        h = self.ln(h) * scale + h.detach() * 0.5
        return F.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


def _train(model, steps, opt_cls, compile_it, accumulate=1, **opt_kw):
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (3, 5))
    if compile_it:
        run = torch.compile(model, backend=ember.get_backend("aot_eager"), dynamic=False)
    else:
        run = model
    opt = opt_cls(model.parameters(), **opt_kw)
    losses = []
    for _ in range(steps):
        for _ in range(accumulate):
            loss = run(ids)
            loss.backward()
            losses.append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                        (torch.optim.AdamW, {"lr": 0.01})])
def test_tied_weights_detach_no_grad_training_with_accumulation(opt_cls, kw):
    torch.manual_seed(0)
    ref = _TiedLM()
    ours = copy.deepcopy(ref)
    ours.head.weight = ours.emb.weight
    ref_losses = _train(ref, 3, opt_cls, False, accumulate=2, **kw)
    our_losses = _train(ours, 3, opt_cls, True, accumulate=2, **kw)
    torch.testing.assert_close(torch.stack(our_losses), torch.stack(ref_losses))
    assert ours.head.weight is ours.emb.weight
    # Adam divides by sqrt(v): a 1-ulp difference in a near-zero grad (tied-weight grads are
    # summed in the graph, eager accumulates them) moves a parameter by up to ~lr/40 per step
    tol = {"atol": 1e-3, "rtol": 1e-3} if opt_cls is torch.optim.AdamW else {}
    for (name, a), b in zip(ref.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b, a, msg=name, **tol)
        assert b.grad is None                                  # zero_grad(set_to_none=True)


def test_non_contiguous_output_tangent_and_debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path))

    def f(x, w):
        y = x @ w
        return (y.t(), y.sum(0))

    x, w = torch.randn(5, 4), _leaf(4, 3)
    out = _compile(f, [x, w], GraphRecorder())(x, w)
    ref = f(x, w)
    assert out[0]._base is not None and not out[0].is_contiguous()
    gy = torch.randn(3, 5).t().contiguous().t()              # a non-contiguous incoming grad
    (g,) = torch.autograd.grad((out[0] * gy).sum() + out[1].sum(), [w])
    (r,) = torch.autograd.grad((ref[0] * gy).sum() + ref[1].sum(), [w])
    torch.testing.assert_close(g, r)
    dumps = sorted(p.name for p in tmp_path.rglob("*.py"))     # aot on its own opens a folder
    assert any("aot_forward" in d for d in dumps) and any("aot_backward" in d for d in dumps)
