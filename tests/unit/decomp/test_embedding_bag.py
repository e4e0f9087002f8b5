"""embedding_bag in training (aten._embedding_bag): torch's meta kernel and the CPU kernel give
its auxiliary outputs (offset2bag, bag_size, max_indices) different sizes, so the decomposition
computes them itself around eager's bag kernel. Checked against eager: the decomposition's
outputs and the CPU backward kernels fed with them (float64), and ember.compile'd training
(values, weight and per-sample-weight grads, one graph, nothing run eagerly)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.decomp import DECOMPS, indexing
from ember.testing.decomp_mode import DecompMode

aten = torch.ops.aten
MODES = {"sum": 0, "mean": 1, "max": 2}
# every config: mode, per_sample_weights, include_last_offset, padding_idx
CONFIGS = [(m, psw, last, pad) for m in MODES for psw in (False, True) for last in (False, True)
           for pad in (None, 3) if not (psw and m != "sum")]


def _inputs(last, dtype=torch.float32, n=20):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(12, 6, generator=g, dtype=dtype)
    indices = torch.randint(0, 12, (n,), generator=g)
    # empty bags first and in the middle; include_last_offset: the end offset is n (eager's own
    # float32 and float64 kernels disagree when it is not)
    offsets = torch.tensor([0, 0, 3, 3, 10] + ([n] if last else []))
    psw = torch.rand(n, generator=g, dtype=dtype)
    return weight, indices, offsets, psw


@pytest.mark.parametrize("mode,psw,last,pad", CONFIGS)
def test_decomposition_feeds_the_cpu_backward_kernels(mode, psw, last, pad, monkeypatch):
    monkeypatch.setattr(indexing, "_needs_backward", lambda *t: True)   # the training form
    weight, indices, offsets, w = _inputs(last, torch.float64)
    weight.requires_grad_()
    w = w.requires_grad_() if psw else None
    pad = -1 if pad is None else pad
    args = (weight, indices, offsets, False, MODES[mode], False, w, last, pad)
    ref = aten._embedding_bag.default(*args)
    grad = torch.randn_like(ref[0])
    wrt = [weight] + ([w] if psw else [])
    want = torch.autograd.grad(ref[0], wrt, grad)
    with torch.no_grad(), DecompMode() as dm:
        out, offset2bag, bag_size, max_indices = DECOMPS[aten._embedding_bag.default](*args)
    assert {str(op) for op in dm.non_prims()} <= {"aten._embedding_bag_forward_only.default"}
    torch.testing.assert_close(out, ref[0], rtol=0, atol=0)
    n_bags = offsets.shape[0] - last
    bag_of = torch.repeat_interleave(torch.arange(n_bags), torch.diff(
        torch.cat([offsets[:n_bags], torch.tensor([indices.shape[0]])])))
    assert torch.equal(offset2bag, bag_of)
    counted = torch.zeros(n_bags, dtype=torch.long).index_add_(0, bag_of, (indices != pad).long())
    assert torch.equal(bag_size, counted)
    if mode != "sum":                               # eager computes them in these modes
        assert torch.equal(bag_size, ref[2][:n_bags]) and torch.equal(offset2bag, ref[1])
    assert torch.equal(max_indices, ref[3]) if mode == "max" else max_indices.numel() == 0
    got = aten._embedding_bag_backward.default(grad, indices, offsets, offset2bag, bag_size,
                                               max_indices, weight.shape[0], False, MODES[mode],
                                               False, w, pad)
    torch.testing.assert_close(got, want[0])
    if psw:
        got_w = aten._embedding_bag_per_sample_weights_backward.default(
            grad, weight, indices, offsets, offset2bag, MODES[mode], pad)
        torch.testing.assert_close(got_w, want[1])


@pytest.mark.parametrize("mode,psw,last,pad", CONFIGS)
def test_compiled_training_matches_eager(mode, psw, last, pad):
    """The op sweep's embedding_bag/train row failed here ('input 4 changed size/stride')."""
    def f(weight, indices, offsets, w):
        bags = F.embedding_bag(indices, weight, offsets, mode=mode, per_sample_weights=w,
                               include_last_offset=last, padding_idx=pad)
        return (bags * bags).sum(1)
    ember.reset()
    weight, indices, offsets, w = _inputs(last)
    inputs = [weight.clone().requires_grad_(), indices, offsets,
              w.clone().requires_grad_() if psw else None]
    ref_inputs = [t.detach().clone().requires_grad_() if t is not None and t.is_floating_point()
                  else t for t in inputs]
    cf = ember.compile(f)
    for _ in range(2):                              # the second call runs the built kernels
        got, want = cf(*inputs), f(*ref_inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got.sum().backward()
        want.sum().backward()
    for a, b in zip(inputs, ref_inputs):
        if a is not None and a.is_floating_point():
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    counts = ember.stats()["counts"]
    assert counts["graphs"] == 1 and not counts.get("fallbacks") and \
        not counts.get("graph_breaks")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_without_grad_the_op_and_its_auxiliary_outputs_are_eagers(mode):
    """No backward reads the auxiliary outputs, so the op stays eager's extern: a graph that
    returns them gives eager's (offset2bag is empty on CPU's sum fast path, max_indices has one
    row per bag; the training form's differ). Inductor's test_embedding_bag returned them."""
    import ember
    weight, indices, offsets, _ = _inputs(False, torch.float32)
    weight.requires_grad_()

    def f(w, i, o):
        return aten._embedding_bag.default(w, i, o, False, MODES[mode], False, None)
    with torch.no_grad():
        got, ref = ember.compile(f)(weight, indices, offsets), f(weight, indices, offsets)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r)
