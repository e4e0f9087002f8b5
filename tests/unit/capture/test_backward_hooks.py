"""Module backward hooks and global module hooks (capture/bwhooks.py, capture/hooks.py): a
submodule's full backward hooks and pre-hooks, and global forward/backward hooks, are traced
into one graph; the user's backward hooks run per backward as opaque ops of the backward graph.
Against eager: values, grads, the hooks' order, arguments and call counts, replaced gradients;
adding or removing a hook recompiles. torch.compile (the peer, measured in test_peer_counts)
breaks the graph at a submodule with backward hooks and refuses global backward hooks without
compiled autograd; it keeps global forward hooks in its graph."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture

x = torch.randn(3, 4)
BACKENDS = ["eager", "aot_eager", "ember"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 2)

    def forward(self, t):
        return self.lin2(self.lin(t).relu())


class Branches(nn.Module):
    """Two submodules on the same input, summed: the hooks' order is the autograd engine's."""
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, t):
        return self.c(self.a(t).tanh() + self.b(t).sigmoid())


def _pair(cls=Net):
    torch.manual_seed(0)
    m = cls()
    return m, copy.deepcopy(m)


def _record(log, name, replace=None):
    """A full backward hook that logs its name and (copies of) its gradients, and optionally
    returns replaced grad_input."""
    def hook(mod, gi, go):
        log.append((name, tuple(None if g is None else g.clone() for g in gi),
                    tuple(None if g is None else g.clone() for g in go)))
        return None if replace is None else tuple(None if g is None else g * replace for g in gi)
    return hook


def _record_pre(log, name, replace=None):
    def hook(mod, go):
        log.append((name, tuple(None if g is None else g.clone() for g in go)))
        return None if replace is None else tuple(g * replace for g in go)
    return hook


def _hook_both(pair, logs, name, pre=True):
    """A recording full backward hook (and pre-hook) on submodule `name` of eager and compiled."""
    for m, log in zip(pair, logs):
        m.get_submodule(name).register_full_backward_hook(_record(log, name))
        if pre:
            m.get_submodule(name).register_full_backward_pre_hook(_record_pre(log, name + ".pre"))


def _same_logs(got, want):
    assert [e[0] for e in got] == [e[0] for e in want]
    for a, b in zip(got, want):
        for ga, gb in zip(a[1:], b[1:]):
            assert len(ga) == len(gb)
            for u, v in zip(ga, gb):
                assert (u is None) == (v is None)
                if u is not None:
                    torch.testing.assert_close(u, v)


def _train_step(m, inp, requires_grad=True):
    t = inp.clone().requires_grad_(requires_grad)
    out = m(t)
    out.pow(2).sum().backward()
    return out, t.grad


def _check_equal(eager, compiled, logs, inp=x, steps=2, requires_grad=True):
    for _ in range(steps):
        for log in logs:
            log.clear()
        out_e, g_e = _train_step(eager, inp, requires_grad)
        out_c, g_c = _train_step(compiled, inp, requires_grad)
        torch.testing.assert_close(out_c, out_e)
        if requires_grad:
            torch.testing.assert_close(g_c, g_e)
        for pe, pc in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(pc.grad, pe.grad)
            pe.grad = pc.grad = None
        _same_logs(logs[1], logs[0])


def _counts():
    st = ember.stats()["counts"]
    return st.get("graphs", 0), st.get("graph_breaks", 0), st.get("recompiles", 0), \
        st.get("fallbacks", 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_submodule_full_backward_hooks_in_one_graph(backend):
    """Pre-hooks replacing grad_output, full hooks replacing grad_input or only recording, on two
    submodules: eager's order (lin2's hook, then lin's pre-hook, then lin's), arguments, one
    call per backward, and the replaced gradients reach the parameters and the input."""
    eager, compiled = _pair()
    logs = [[], []]
    for m, log in zip((eager, compiled), logs):
        m.lin.register_full_backward_pre_hook(_record_pre(log, "lin.pre", replace=2.0))
        m.lin.register_full_backward_hook(_record(log, "lin.full"))
        m.lin2.register_full_backward_hook(_record(log, "lin2.full", replace=3.0))
        m.lin2.register_full_backward_hook(_record(log, "lin2.full2"))  # sees the replaced ones
    ember.compile(compiled, backend=backend, fullgraph=True)
    _check_equal(eager, compiled, logs)
    assert [e[0] for e in logs[1]] == ["lin2.full", "lin2.full2", "lin.pre", "lin.full"]
    assert _counts() == (1, 0, 0, 0)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.branches = Net(), Branches()

    def forward(self, t):
        return self.branches(self.inner(t).repeat(1, 2))


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_parallel_branches_and_nested_modules_keep_eagers_hook_order(backend):
    eager, compiled = _pair(Nested)
    logs = [[], []]
    for name, _ in eager.named_modules():
        if name:
            _hook_both((eager, compiled), logs, name)
    ember.compile(compiled, backend=backend, fullgraph=True)
    _check_equal(eager, compiled, logs)
    assert len(logs[1]) == 14
    assert _counts() == (1, 0, 0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_without_grad_and_module_called_twice(backend):
    """No argument requires grad: eager calls the full hook from the output side with
    grad_input (None,) (and warns). A module called twice: its hooks run once per call."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, t):
            return self.lin(self.lin(t).tanh())

    eager, compiled = _pair(Twice)
    logs = [[], []]
    _hook_both((eager, compiled), logs, "lin", pre=False)
    ember.compile(compiled, backend=backend, fullgraph=True)
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        _check_equal(eager, compiled, logs, requires_grad=False)
    assert [e[0] for e in logs[1]] == ["lin", "lin"]
    assert logs[1][1][1] == (None,)            # the first call's input needs no grad
    assert _counts() == (1, 0, 0, 0)


def test_adding_and_removing_a_backward_hook_recompiles():
    eager, compiled = _pair()
    ember.compile(compiled, backend="aot_eager", fullgraph=True)
    logs = [[], []]
    _check_equal(eager, compiled, logs)
    handles = [m.lin2.register_full_backward_hook(_record(log, "lin2", replace=0.5))
               for m, log in zip((eager, compiled), logs)]
    _check_equal(eager, compiled, logs)
    assert len(logs[1]) == 1
    for h in handles:
        h.remove()
    _check_equal(eager, compiled, logs)
    assert logs[1] == []
    graphs, breaks, recompiles, fallbacks = _counts()
    assert graphs == 2 and breaks == 0 and fallbacks == 0    # no hook, then the hook (cached)


def test_tuple_output_with_a_non_tensor():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, t, k: int):
            y = self.lin(t)
            return y * k, 7, y.detach()

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Pair()

        def forward(self, t):
            a, n, d = self.p(t, 2)
            return a.sin() * n + d

    eager, compiled = _pair(Outer)
    logs = [[], []]
    _hook_both((eager, compiled), logs, "p")
    ember.compile(compiled, backend="aot_eager", fullgraph=True)
    _check_equal(eager, compiled, logs)
    assert logs[1][0][1][1:] == (None, None)     # grad_output of the int and the detached one
    assert logs[1][1][1][1] is None              # grad_input of the int argument
    assert _counts() == (1, 0, 0, 0)


def test_dict_output_hooks_never_run_as_in_eager():
    """eager hooks no output of a module returning a dict (it warns), so neither hook runs."""
    class D(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, t):
            return {"y": self.lin(t)}

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.d = D()

        def forward(self, t):
            return self.d(t)["y"].tanh()

    eager, compiled = _pair(Outer)
    logs = [[], []]
    _hook_both((eager, compiled), logs, "d")
    ember.compile(compiled, backend="aot_eager", fullgraph=True)
    with pytest.warns(UserWarning, match="module output should be a Tensor"):
        _check_equal(eager, compiled, logs)
    assert logs == [[], []]
    assert _counts() == (1, 0, 0, 0)


def test_invalid_hook_results_raise_in_backward_as_in_eager():
    for register, match in (
            (lambda m: m.lin.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0])),
             "invalid number of grad_input"),
            (lambda m: m.lin2.register_full_backward_pre_hook(lambda mod, go: ()),
             "invalid number of grad_output")):
        eager, compiled = _pair()
        register(eager), register(compiled)
        ember.compile(compiled, backend="aot_eager", fullgraph=True)
        for m in (eager, compiled):
            with pytest.raises(RuntimeError, match=match):
                _train_step(m, x)


def test_legacy_backward_hook_runs_that_module_eagerly():
    eager, compiled = _pair()
    seen = [[], []]
    for m, s in zip((eager, compiled), seen):
        m.lin.register_backward_hook(lambda mod, gi, go, s=s: s.append(len(gi)))
    with pytest.raises(ember.Unsupported, match="non-full backward hook"):
        ember.compile(copy.deepcopy(compiled), backend="eager", fullgraph=True)(x)
    ember.reset()
    ember.compile(compiled, backend="aot_eager")
    _check_equal(eager, compiled, [[], []])
    assert seen[0] == seen[1] and len(seen[1]) == 2


# ---- global module hooks -----------------------------------------------------------------------
_mm = torch.nn.modules.module


@pytest.fixture
def global_hooks():
    handles = []
    yield handles
    for h in handles:
        h.remove()
        _mm._global_forward_hooks_with_kwargs.pop(h.id, None)   # torch's handle leaves it


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_global_forward_hooks_traced_in_order(backend, global_hooks):
    """eager's order: global pre-hooks before the module's, global forward hooks before the
    module's; for the compiled root module too (ember compiles in place: no wrapper module)."""
    eager, compiled = _pair()
    log = []
    for m in (eager, compiled):
        m.lin.register_forward_pre_hook(lambda mod, a: log.append("lin.pre"))
        m.lin.register_forward_hook(lambda mod, a, o: (log.append("lin.post"), o * 2)[1])
    ember.compile(compiled, backend=backend, fullgraph=True)
    global_hooks.append(_mm.register_module_forward_pre_hook(
        lambda mod, a: log.append(f"g.pre:{type(mod).__name__}")))
    global_hooks.append(_mm.register_module_forward_hook(
        lambda mod, a, o: (log.append(f"g.post:{type(mod).__name__}"),
                           o + 1 if isinstance(mod, nn.Linear) else None)[1]))
    global_hooks.append(_mm.register_module_forward_hook(
        lambda mod, a, kw, o: log.append(f"g.kw:{len(kw)}"), with_kwargs=True))
    for _ in range(2):
        log.clear()
        out_e = eager(x)
        want = list(log)
        log.clear()
        out_c = compiled(x)
        torch.testing.assert_close(out_c, out_e)
        assert log == want
    assert want[:3] == ["g.pre:Net", "g.pre:Linear", "lin.pre"]
    assert _counts() == (1, 0, 0, 0)


def test_global_hook_registered_after_compiling_a_function_recompiles(global_hooks):
    """A compiled function that calls a module is guarded on 'no global hooks': registering one
    later recompiles (the hook runs), removing it uses the first entry again."""
    torch.manual_seed(0)
    m = Net()
    calls = []
    cf = ember.compile(lambda t: m(t) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(cf(x), m(x) * 2)
    global_hooks.append(_mm.register_module_forward_hook(
        lambda mod, a, o: (calls.append(type(mod).__name__), o - 1)[1]))
    want = m(x) * 2
    calls.clear()
    torch.testing.assert_close(cf(x), want)
    assert calls == ["Linear", "Linear", "Net"]
    global_hooks.pop().remove()
    calls.clear()
    torch.testing.assert_close(cf(x), m(x) * 2)
    assert calls == []
    graphs, breaks, _, fallbacks = _counts()
    assert graphs == 2 and breaks == 0 and fallbacks == 0


def test_global_full_backward_hook_traced(global_hooks):
    """torch.compile refuses these ('Module-level backwards hooks require compiled autograd');
    ember traces them like a submodule's own (the root's run eagerly around its forward)."""
    eager, compiled = _pair()
    log = []
    ember.compile(compiled, backend="aot_eager", fullgraph=True)
    global_hooks.append(_mm.register_module_full_backward_hook(
        lambda mod, gi, go: log.append((type(mod).__name__, go[0].clone()))))
    for _ in range(2):
        log.clear()
        _, g_e = _train_step(eager, x)
        want = list(log)
        log.clear()
        _, g_c = _train_step(compiled, x)
        torch.testing.assert_close(g_c, g_e)
        assert [e[0] for e in log] == [e[0] for e in want] == ["Linear", "Linear", "Net"]
        for a, b in zip(log, want):
            torch.testing.assert_close(a[1], b[1])
    assert _counts()[1:] == (0, 0, 0)


@pytest.mark.slow
def test_peer_counts(global_hooks):
    """torch.compile on the same modules (measured here; torch 2.14): a submodule's backward
    hook is a graph break ('Module-level backwards hooks require compiled autograd'; the
    submodule runs eagerly), where ember keeps one graph; global forward hooks: no break."""
    from torch._dynamo.testing import CompileCounter
    breaks = torch._dynamo.utils.counters["graph_break"]
    for register in (lambda m: m.lin.register_full_backward_hook(lambda mod, gi, go: None),
                     lambda m: m.lin2.register_full_backward_pre_hook(lambda mod, go: None)):
        torch._dynamo.reset()
        breaks.clear()
        m = Net()
        register(m)
        torch.compile(m, backend=CompileCounter())(x.clone().requires_grad_()).sum().backward()
        assert sum(breaks.values()) >= 1
        assert any("backwards hooks" in k for k in breaks)
    torch._dynamo.reset()
    breaks.clear()
    global_hooks.append(_mm.register_module_forward_hook(lambda mod, a, o: None))
    torch.compile(Net(), backend=CompileCounter())(x)
    assert sum(breaks.values()) == 0


def test_global_hooks_never_see_embers_own_graph_modules(global_hooks):
    """ember runs its internal GraphModules through .forward: the complex re-trace, the frozen
    constant graph on a refold and the eager paths called them through nn.Module.__call__, so a
    global hook fired on (and could rewrite the output of) ember's own graph."""
    seen = []
    global_hooks.append(_mm.register_module_forward_hook(
        lambda mod, a, o: seen.append(type(mod).__name__)))
    z = torch.randn(4, 3, dtype=torch.complex64)
    torch.testing.assert_close(ember.compile(lambda t: t * t + 1)(z), z * z + 1)
    assert seen == []
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval().requires_grad_(False)
    ref = copy.deepcopy(m)
    ember.compile(m, options={"freeze": True})
    x8 = torch.randn(2, 8)
    for step in range(2):
        with torch.no_grad():
            if step:
                m[0].weight.mul_(2)
                ref[0].weight.mul_(2)
            seen.clear()
            want_out = ref(x8)
            want, seen[:] = list(seen), []
            torch.testing.assert_close(m(x8), want_out)
        assert seen == want, (seen, want)
