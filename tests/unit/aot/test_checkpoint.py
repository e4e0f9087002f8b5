"""torch.utils.checkpoint in compiled code (#28): the region is inlined by capture between marker
nodes, aot tags its aten nodes, and the partitioner recomputes them in the backward (saving only
what leaves a region, like eager). Values and grads equal eager; counts; the saved set."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import ember
from ember import regions
from ember.aot import aot_compile


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.n = torch.nn.LayerNorm(d)
        self.l1 = torch.nn.Linear(d, 4 * d)
        self.l2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.l2(F.gelu(self.l1(self.n(x))))


class Net(torch.nn.Module):
    def __init__(self, d=16, n=3, reentrant=False, ck=True):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.reentrant, self.ck = reentrant, ck

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.reentrant) if self.ck else b(x)
        return x.square().mean()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_one_graph_grads_equal(backend, reentrant):
    ember.reset()
    torch.manual_seed(0)
    m = Net(reentrant=reentrant)
    mc = copy.deepcopy(m)
    cm = ember.compile(mc, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 16, requires_grad=True)
        xc = x.detach().clone().requires_grad_()
        ref, out = m(x), cm(xc)
        ref.backward()
        out.backward()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(xc.grad, x.grad, rtol=1e-4, atol=1e-6)
        for p, q in zip(m.parameters(), mc.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
        m.zero_grad()
        mc.zero_grad()
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks") and not st.get("fallbacks"), st


def _region(x, w1, w2):
    regions.checkpoint_enter()
    h = torch.mm(torch.mm(x, w1).relu(), w2)
    regions.checkpoint_exit()
    regions.checkpoint_enter()
    y = torch.mm(torch.mm(h, w2.t()).tanh(), w2)
    regions.checkpoint_exit()
    return (y.sum(),)


def test_partition_saves_only_region_outputs_and_recomputes_lazily():
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    w1, w2 = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    run = lambda gm, ex: gm.forward  # noqa: E731
    rt = aot_compile(_region, [x, w1, w2], fw_compiler=run, bw_compiler=run, decompositions={})
    saved = rt.part.saved_values
    # only h (the first region's output) crosses: the mm/relu/tanh inside are recomputed
    assert len(saved) == 1 and tuple(saved[0].meta["val"].shape) == (8, 8), saved
    bw_mm = [n for n in rt.part.bw.nodes if n.target is torch.ops.aten.mm.default]
    assert len(bw_mm) >= 3           # recomputed matmuls plus the grads' own
    (out,) = rt(x, w1, w2)
    g = torch.autograd.grad(out, [w1, w2])
    ref = torch.autograd.grad(_region(x, w1, w2)[0], [w1, w2])
    for a, b in zip(g, ref):
        torch.testing.assert_close(a, b)


def test_context_fn_other_than_selective_policy_breaks():
    ember.reset()
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    def f(x, w):
        return checkpoint(lambda a: (a @ w).relu(), x, use_reentrant=False,
                          context_fn=lambda: create_selective_checkpoint_contexts([])).sum()

    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)
    with pytest.raises(ember.errors.Unsupported, match="context_fn"):
        ember.compile(f, backend="aot_eager", fullgraph=True)(x, w)


def _save_mm(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else \
        CheckpointPolicy.PREFER_RECOMPUTE


class SelectiveNet(torch.nn.Module):
    def __init__(self, policy, d=16):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(d, 4 * d) / d ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(4 * d, d) / d ** 0.5)
        self.policy = policy

    def block(self, x):
        return x + torch.mm(torch.mm(x, self.w1).sin(), self.w2).tanh()

    def forward(self, x):
        import functools
        from torch.utils.checkpoint import create_selective_checkpoint_contexts
        for _ in range(2):
            ctx = None if self.policy is None else \
                functools.partial(create_selective_checkpoint_contexts, self.policy)
            x = checkpoint(self.block, x, use_reentrant=False,
                           **({} if ctx is None else {"context_fn": ctx}))
        return x.square().sum()


def _bw_mms(policy, backend="aot_eager"):
    """Compile SelectiveNet(policy); check values and grads against eager; return the number of
    mm nodes in the backward graph (recomputed forward matmuls + the gradients' own)."""
    ember.reset()
    torch.manual_seed(0)
    ref = SelectiveNet(policy)
    m = copy.deepcopy(ref)
    bws = []

    def record(gm, example_inputs):         # aot_eager that keeps the backward graph
        def bw(g, ex):
            bws.append(g)
            return g.forward
        return aot_compile(gm, example_inputs, fw_compiler=lambda g, ex: g.forward,
                           bw_compiler=bw)
    ember.compile(m, backend=record, fullgraph=True)
    x = torch.randn(8, 16)
    out, out_ref = m(x), ref(x)
    out.backward(), out_ref.backward()
    torch.testing.assert_close(out, out_ref)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert ember.stats()["counts"]["graphs"] == 1
    (bw,) = bws
    return sum(n.target is torch.ops.aten.mm.default for n in bw.graph.nodes)


def test_selective_checkpoint_policy_saves_what_it_names():
    full = _bw_mms(None)                            # plain checkpoint: both mms recomputed
    by_fn = _bw_mms(_save_mm)
    by_list = _bw_mms([torch.ops.aten.mm.default])
    assert by_fn == by_list == full - 4, (full, by_fn, by_list)     # 2 blocks x 2 mms saved
