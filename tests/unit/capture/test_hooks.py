"""Module hooks (capture/hooks.py): forward pre/post hooks, with and without kwargs, on the
compiled module itself and on its submodules are traced into the graph; values, grads, the order
the hooks run in and their side effects equal eager's; a hook added or removed after compiling is
seen. Full backward hooks on the compiled module run around its compiled forward; on submodules,
and global hooks: test_backward_hooks.py."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture

x = torch.randn(3, 4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 2)

    def forward(self, t, scale=1.0):
        return self.lin2(self.lin(t).relu() * scale)


def _hooks(m, log):
    """Pre/post hooks of every form; each logs its name and some change what flows through."""
    m.lin.register_forward_pre_hook(lambda mod, a: (log.append("pre"), (a[0] * 2,))[1])
    m.lin.register_forward_hook(lambda mod, a, o: (log.append("post"), o + a[0].sum())[1])
    m.lin2.register_forward_pre_hook(
        lambda mod, a, kw: (log.append("pre_kw"), None)[1], with_kwargs=True)
    m.lin2.register_forward_hook(
        lambda mod, a, kw, o: (log.append(f"post_kw:{len(a)}"), o * 3)[1], with_kwargs=True)
    m.register_forward_pre_hook(
        lambda mod, a, kw: (log.append("root_pre"), (a, {**kw, "scale": 0.5}))[1],
        with_kwargs=True)
    m.register_forward_hook(lambda mod, a, o: (log.append("root_post"), o.sum(-1))[1])


def _pair():
    torch.manual_seed(0)
    eager = Net()
    return eager, copy.deepcopy(eager)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_forward_hooks_root_and_submodules_in_one_graph(backend):
    eager, compiled = _pair()
    log_e, log_c = [], []
    _hooks(eager, log_e), _hooks(compiled, log_c)
    ember.compile(compiled, backend=backend, fullgraph=True)
    for _ in range(3):
        log_e.clear(), log_c.clear()
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_e, out_c = eager(xe), compiled(xc)
        torch.testing.assert_close(out_c, out_e)
        assert log_c == log_e == ["root_pre", "pre", "post", "pre_kw", "post_kw:1", "root_post"]
        out_e.sum().backward(), out_c.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
        for pe, pc in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(pc.grad, pe.grad)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0 and st.get("fallbacks", 0) == 0, st


def test_hook_added_and_removed_after_compile_is_seen():
    eager, compiled = _pair()
    ember.compile(compiled, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), eager(x))
    handles = [m.lin.register_forward_hook(lambda mod, a, o: o * 0) for m in (eager, compiled)]
    handles += [m.register_forward_pre_hook(lambda mod, a: (a[0] + 1,)) for m in (eager, compiled)]
    torch.testing.assert_close(compiled(x), eager(x))
    handles[1].remove(), handles[0].remove()          # the submodule's hook only
    torch.testing.assert_close(compiled(x), eager(x))
    handles[3].remove(), handles[2].remove()
    torch.testing.assert_close(compiled(x), eager(x))
    st = capture.stats()
    assert st.get("fallbacks", 0) == 0 and st["graphs"] == 3, st   # no hooks, both, root's only


def test_hook_closure_state_is_read_per_call():
    eager, compiled = _pair()
    factor = {"k": 2.0}
    for m in (eager, compiled):
        m.lin.register_forward_hook(lambda mod, a, o: o * factor["k"])
    ember.compile(compiled, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), eager(x))
    factor["k"] = -1.0
    torch.testing.assert_close(compiled(x), eager(x))


def test_full_backward_hook_on_root_runs_around_compiled_forward():
    eager, compiled = _pair()
    seen_e, seen_c = [], []
    for m, seen in ((eager, seen_e), (compiled, seen_c)):
        m.register_full_backward_pre_hook(lambda mod, go, s=seen: s.append(("bpre", go[0].clone())))
        m.register_full_backward_hook(
            lambda mod, gi, go, s=seen: (s.append(("b", gi[0].clone(), go[0].clone())),
                                         (gi[0] * 2,))[1])
        m.register_forward_hook(lambda mod, a, o, s=seen: s.append(("f",)))
    ember.compile(compiled, backend="aot_eager")
    for _ in range(2):
        seen_e.clear(), seen_c.clear()
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager(xe).pow(2).sum().backward()
        compiled(xc).pow(2).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
        assert [s[0] for s in seen_c] == [s[0] for s in seen_e] == ["f", "bpre", "b"]
        for a, b in zip(seen_c, seen_e):
            for u, v in zip(a[1:], b[1:]):
                torch.testing.assert_close(u, v)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("fallbacks", 0) == 0, st


# ---- Tensor.register_hook inside forward ----------------------------------------------------
def _double(g):
    return g * 2


def _hooked(x, w):
    h = x @ w
    h.register_hook(_double)
    y = h.relu()
    y.register_hook(lambda g: g.clamp(-0.1, 0.1))
    return (y * h).sum()


def _unhooked(x, w):
    h = x @ w
    return (h.relu() * h).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_tensor_hooks_in_forward_are_traced_into_the_backward(backend):
    cf = ember.compile(_hooked, backend=backend, fullgraph=True)
    xs, w = torch.randn(3, 4), torch.randn(4, 5)
    grads = {}
    for name, fn in (("eager", _hooked), ("ember", cf), ("no hooks", _unhooked)):
        wr = w.clone().requires_grad_()
        fn(xs, wr).backward()
        grads[name] = wr.grad
    torch.testing.assert_close(grads["ember"], grads["eager"])
    assert not torch.allclose(grads["eager"], grads["no hooks"])     # the hooks change grads
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st


SEEN = []


def _record(x, w):
    h = x @ w
    h.register_hook(lambda g, k=2.0: (SEEN.append(g.clone()), g * k)[1])   # a side effect
    return h.tanh().sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_tensor_hook_with_side_effect_runs_per_backward_in_one_graph(backend):
    """The hook appends to a list: not traced into the joint graph, but called per backward by
    an opaque op of the backward graph; its gradient replacement applies as eagerly."""
    cf = ember.compile(_record, backend=backend, fullgraph=True)
    xs, w = torch.randn(3, 4), torch.randn(4, 5)
    for _ in range(2):
        SEEN.clear()
        we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
        _record(xs, we).backward()
        cf(xs, wc).backward()
        assert len(SEEN) == 2
        torch.testing.assert_close(SEEN[1], SEEN[0])
        torch.testing.assert_close(wc.grad, we.grad)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st


def test_tensor_hook_after_an_earlier_use_runs_the_frame_eagerly():
    def used_before(x, w):
        h = x @ w
        a = h.sin()
        h.register_hook(_double)            # eager doubles a's gradient path too
        return (a + h.cos()).sum()
    xs, w = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.raises(ember.Unsupported, match="already used"):
        ember.compile(used_before, backend="eager", fullgraph=True)(xs, w.clone().requires_grad_())
    ember.reset()
    we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    used_before(xs, we).backward()
    ember.compile(used_before, backend="aot_eager")(xs, wc).backward()
    torch.testing.assert_close(wc.grad, we.grad)


def test_torch_own_forward_hooks_run_eagerly():
    """spectral_norm's forward pre-hook (torch's code, as FSDP's are) updates buffers and sets
    the weight: never traced; on a submodule it breaks there, on the root it runs eagerly around
    the compiled forward."""
    eager, _ = _pair()
    torch.nn.utils.spectral_norm(eager.lin)
    torch.nn.utils.spectral_norm(eager.lin2)
    sub, root = copy.deepcopy(eager), copy.deepcopy(eager.lin)
    eager_root = copy.deepcopy(eager.lin)
    c = ember.compile(copy.deepcopy(eager), backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported, match="forward hook from torch"):
        c(x)
    ember.compile(sub, backend="aot_eager")
    ember.compile(root, backend="aot_eager")
    for _ in range(2):                 # training mode: each call moves the power iteration
        torch.testing.assert_close(sub(x), eager(x))
        torch.testing.assert_close(root(x), eager_root(x))
    torch.testing.assert_close(sub.lin.weight_u, eager.lin.weight_u)
    torch.testing.assert_close(root.weight_u, eager_root.weight_u)
    assert capture.stats().get("fallbacks", 0) == 0
