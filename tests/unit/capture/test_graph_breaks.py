"""Graph breaks: programs that hit something capture cannot trace, compared against eager.

Each program runs eagerly and compiled on deep copies of its inputs, at least twice: return values,
mutated arguments and stdout must match eager, the second call must not recompile, and
`ember.explain` must report the expected number of graphs (with at least one op) and breaks.
Lines that break are marked `# BREAK` so the tests can find their line numbers.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import os
import re
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import ember

from .helpers import same as _same

BACKEND = "aot_eager"      # fast on CPU; a few tests below run the default "ember" backend
HERE = os.path.basename(__file__)

# exact small integers as floats: printed tensors look the same eager and compiled
X = torch.arange(16.0).reshape(4, 4) - 6.0
Y = torch.arange(8.0).reshape(2, 4) / 4.0
POS = torch.ones(3, 4)
NEG = -torch.ones(3, 4)


# ---- helpers --------------------------------------------------------------------------------
def same(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), type(b)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        return
    if isinstance(a, (list, tuple)) and any(isinstance(v, np.ndarray) for v in a):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            same(u, v)
        return
    _same(a, b)


def stat(name: str) -> int:
    return ember.stats()["counts"].get(name, 0)


def line_of(fn, marker: str = "# BREAK") -> int:
    """Line number (in this file) of the first line of `fn` containing `marker`."""
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(f"no {marker!r} in {fn.__qualname__}")


def compare(capsys, fn, *args, calls=2, backend=BACKEND, compiled=None, **kwargs):
    """Run `fn` eagerly and compiled `calls` times on deep copies of the arguments; compare the
    results, the arguments afterwards (mutations) and what each call printed."""
    cf = compiled if compiled is not None else ember.compile(fn, backend=backend)
    for i in range(calls):
        a_eager = copy.deepcopy((args, kwargs))
        a_comp = copy.deepcopy((args, kwargs))
        capsys.readouterr()
        expected = fn(*a_eager[0], **a_eager[1])
        out_eager = capsys.readouterr()
        got = cf(*a_comp[0], **a_comp[1])
        out_comp = capsys.readouterr()
        same(expected, got)
        same(a_eager, a_comp)
        assert out_comp.out == out_eager.out, f"call {i}: stdout differs"
        assert out_comp.err == out_eager.err, f"call {i}: stderr differs"
    return cf


def compare_module(capsys, make, x, calls=2):
    """Build a module (seed 0), compile it in place and compare `calls` calls with an eager
    deep copy: results and stdout. Returns (compiled module, eager copy)."""
    torch.manual_seed(0)
    m = make()
    ref = copy.deepcopy(m)
    ember.compile(m, backend=BACKEND)
    for _ in range(calls):
        capsys.readouterr()
        exp = ref(x)
        out_eager = capsys.readouterr().out
        got = m(x)
        assert capsys.readouterr().out == out_eager
        torch.testing.assert_close(got, exp)
    return m, ref


def counts(fn, *args, graphs, breaks, **kwargs):
    """`ember.explain` on copies of the arguments: graphs with ops and breaks as expected, and
    its `.result` equal to eager (functions only: a compiled module has no eager twin here)."""
    e = ember.explain(fn, *copy.deepcopy(args), **copy.deepcopy(kwargs))
    if not isinstance(fn, nn.Module):
        same(fn(*copy.deepcopy(args), **copy.deepcopy(kwargs)), e.result)
    assert e.break_count == len(e.breaks), e
    assert (e.graph_count, e.break_count) == (graphs, breaks), str(e)
    assert all(n > 0 for n in e.ops_per_graph), e.ops_per_graph
    return e


def no_recompiles_no_fallbacks():
    assert stat("recompiles") == 0, ember.stats()
    assert stat("fallbacks") == 0, ember.stats()


# ---- programs -------------------------------------------------------------------------------
def print_mid(x):
    y = x * 2
    print("mid", y)  # BREAK
    return y + 1


def test_print_mid_function(capsys):
    compare(capsys, print_mid, X)
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 1, ember.stats()
    e = counts(print_mid, X, graphs=2, breaks=1)
    assert e.ops_per_graph == [1, 1], e.ops_per_graph
    torch.testing.assert_close(e.result, print_mid(X))


def test_print_mid_function_ember_backend(capsys):
    compare(capsys, print_mid, X, backend="ember")
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 1 and stat("graphs") == 2, ember.stats()


def two_prints(x):
    a = x.relu()
    print("first", a.shape)  # BREAK
    b = a * 3
    print("second", b, sep=" | ", end="!\n")
    return b - a


def test_two_breaks_three_graphs(capsys):
    compare(capsys, two_prints, X, calls=3)
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 2, ember.stats()
    counts(two_prints, X, graphs=3, breaks=2)


def print_to_stderr(x):
    y = x + 1
    print("to stderr", y.shape, file=sys.stderr)  # BREAK
    return y * y


def test_print_to_stderr(capsys):
    compare(capsys, print_to_stderr, X)
    no_recompiles_no_fallbacks()
    counts(print_to_stderr, X, graphs=2, breaks=1)


def item_then_float(x):
    s = x.abs().sum().item()  # BREAK
    return x * s + s / 2


def test_item_then_use_the_float(capsys):
    compare(capsys, item_then_float, X, calls=3)
    no_recompiles_no_fallbacks()
    e = counts(item_then_float, X, graphs=2, breaks=1)
    assert "item" in e.breaks[0].reason, e.breaks[0].reason


def tolist_then_use(x):
    y = x[0] * 2
    vals = y.tolist()  # BREAK
    return y + len(vals) + vals[-1]


def test_tolist(capsys):
    compare(capsys, tolist_then_use, X)
    no_recompiles_no_fallbacks()
    counts(tolist_then_use, X, graphs=2, breaks=1)


def branchy(x):
    y = x * 2
    if y.sum() > 0:  # BREAK
        return y + 1
    return y - 1


def test_tensor_if_both_branches_no_recompile(capsys):
    cf = ember.compile(branchy, backend=BACKEND)
    for t in (POS, NEG, POS, NEG, POS, NEG):
        compare(capsys, branchy, t, calls=1, compiled=cf)
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 1, ember.stats()
    assert stat("graphs") == 3, ember.stats()        # prefix + one resume per branch
    counts(branchy, POS, graphs=2, breaks=1)
    counts(branchy, NEG, graphs=2, breaks=1)


def branch_elif(x, y):
    z = x @ y.t()
    if z.max() > 10:  # BREAK
        z = z / 10
    elif z.min() < -10:
        z = z * -1
    return z.relu()


def test_tensor_if_elif_chain(capsys):
    cf = ember.compile(branch_elif, backend=BACKEND)
    ones = torch.ones(4, 4)
    for a in (X, -X / 2, X / 100) * 2:                # z.max() > 10; z.min() < -10; neither
        compare(capsys, branch_elif, a, ones, calls=1, compiled=cf)
    assert stat("recompiles") == 0, ember.stats()
    assert stat("graph_breaks") == 2 and stat("graphs") == 5, ember.stats()   # prefix + 4 resumes


def no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad", torch.is_grad_enabled())  # BREAK
        z = y + 1
    return z, z * x, torch.is_grad_enabled()


def test_break_inside_no_grad_restores_grad_mode(capsys):
    x = torch.randn(3, 4, requires_grad=True)
    cf = ember.compile(no_grad_break, backend=BACKEND)
    for _ in range(2):
        capsys.readouterr()
        exp = no_grad_break(x)
        out_eager = capsys.readouterr().out
        got = cf(x)
        assert capsys.readouterr().out == out_eager == "inside no_grad False\n"
        assert torch.is_grad_enabled()
        for g, e in zip(got[:2], exp[:2]):
            assert g.requires_grad == e.requires_grad, (g.requires_grad, e.requires_grad)
            torch.testing.assert_close(g, e)
        assert got[2] is exp[2] is True
    no_recompiles_no_fallbacks()
    counts(no_grad_break, x, graphs=2, breaks=1)


def fail_check(t):
    raise ValueError(f"bad shape {tuple(t.shape)}")


def try_print_then_raise(x):
    y = x + 1
    try:
        print("checking")  # BREAK
        fail_check(y)
        y = y * 100
    except ValueError as err:
        print("caught", err)
        y = y * 2
    return y - 1


def test_break_inside_try_user_catches(capsys):
    compare(capsys, try_print_then_raise, X)
    no_recompiles_no_fallbacks()
    counts(try_print_then_raise, X, graphs=1, breaks=1)      # prefix; the rest runs eagerly


def loud_raiser(t):
    print("about to raise")  # BREAK
    raise ValueError("loud")


def try_helper_raises(x):
    y = x.sin()
    try:
        loud_raiser(y)
    except ValueError:
        y = y.cos()
    return y


def test_break_inside_helper_called_in_try(capsys):
    compare(capsys, try_helper_raises, X)
    assert stat("recompiles") == 0, ember.stats()
    # y.sin(); the rest is eager, its call to loud_raiser dispatched: that breaks at its print
    e = counts(try_helper_raises, X, graphs=1, breaks=2)
    b = e.breaks[0]                                            # at the outermost call
    assert (os.path.basename(b.filename), b.lineno) == (HERE, line_of(try_helper_raises,
                                                                      "loud_raiser(y)")), b
    assert "print" in b.reason, b.reason
    assert (e.breaks[1].lineno, e.breaks[1].kind) == (line_of(loud_raiser), "call"), e.breaks


def inner_with_break(x, scale=1.0):
    y = x.sin() * scale
    print("inner", y.shape)  # BREAK
    return y.cos() + 1


def wrapper_try_finally(fn, *args, **kwargs):
    """The shape of transformers' config-default wrappers: the call in a try/finally, with
    `*args, **kwargs` (CALL_FUNCTION_EX)."""
    state = [0]
    try:
        state[0] = 1
        out = fn(*args, **kwargs)
    finally:
        state[0] = 0
    return out * 2


def test_break_in_call_inside_try_finally_still_compiles_the_callee(capsys):
    """A break inside `fn`, called in a try block: the wrapper's rest runs eagerly from the
    call, and the call itself goes through the dispatcher, so `fn` compiles as its own root
    (two graphs around its print). The rest's resume prologue jumps over dead code into the
    call: routing it once found no callable there, and `fn` ran wholly eagerly."""
    compare(capsys, wrapper_try_finally, inner_with_break, X, scale=2.0)
    no_recompiles_no_fallbacks()
    e = counts(wrapper_try_finally, inner_with_break, X, graphs=2, breaks=2, scale=2.0)
    assert e.ops_per_graph == [2, 2], e


def loop_print(x):
    y = x * 2
    for i in range(3):
        y = y + i
        print("step", i, y.shape)  # BREAK
    return y


def test_break_in_for_loop(capsys):
    compare(capsys, loop_print, X)
    no_recompiles_no_fallbacks()
    counts(loop_print, X, graphs=1, breaks=1)                # prefix; the rest runs eagerly


def loop_helper(t):
    return torch.tanh(t) * 2 + t.sin()


class LoopBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, t):
        return torch.relu(self.lin(t)) - t


LOOP_BLOCK = LoopBlock().requires_grad_(False)   # its outputs never require grad: no recompile


def loop_calls_after_break(x):
    y = x + 1
    for i in range(4):
        print("iteration", i)  # BREAK
        y = loop_helper(y)
        y = LOOP_BLOCK(y)
    return y.sum()


def test_break_in_for_loop_later_calls_go_through_the_dispatcher(capsys):
    """The loop runs eagerly after the break, but its calls to a user helper and a user module
    go through the dispatcher: each compiles once as its own root (one graph each) and every
    later iteration hits that entry."""
    compare(capsys, loop_calls_after_break, X, calls=2)
    no_recompiles_no_fallbacks()
    assert stat("graphs") == 3, ember.stats()       # x + 1 | loop_helper | LoopBlock.forward
    e = counts(loop_calls_after_break, X, graphs=3, breaks=1)
    assert e.ops_per_graph[1:] == [4, 3], e         # tanh * 2 + sin; linear, relu, sub


def deep2(t):
    u = t * 3
    print("deep2", u.shape)  # BREAK
    return u + 1


def deep1(t):
    v = t - 1
    return deep2(v) * 2


def nested_root(x):
    y = x + 1
    return deep1(y) / 2


def test_break_in_helper_two_levels_deep(capsys):
    compare(capsys, nested_root, X)
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 3, ember.stats()
    e = counts(nested_root, X, graphs=6, breaks=3)
    lines = {(os.path.basename(b.filename), b.lineno) for b in e.breaks}
    assert (HERE, line_of(deep2)) in lines, e.breaks
    assert (HERE, line_of(deep1, "return deep2")) in lines, e.breaks
    assert (HERE, line_of(nested_root, "return deep1")) in lines, e.breaks


def to_numpy(x):
    y = x * 2
    arr = y.numpy()
    return y + 1, arr


def np_asarray(x):
    y = x - 3
    arr = np.asarray(y)
    return y.abs(), arr


def np_random(x):
    y = x - 3
    n = np.random.randint(1, 2)  # BREAK
    return y.abs() * n


@pytest.mark.parametrize("fn, graphs, breaks", [(to_numpy, 1, 0), (np_asarray, 1, 0),
                                                (np_random, 2, 1)],
                         ids=["x.numpy", "np.asarray", "np.random"])
def test_numpy_interop(capsys, fn, graphs, breaks):
    """NumPy on tensors is traced (test_numpy.py); NumPy's own generator breaks the graph."""
    compare(capsys, fn, X)
    no_recompiles_no_fallbacks()
    counts(fn, X, graphs=graphs, breaks=breaks)


LOG = logging.getLogger("tests.graph_breaks.user")


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def user_log():
    h = ListHandler()
    LOG.addHandler(h)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    yield h
    LOG.removeHandler(h)


def log_info(x):
    y = x.exp()
    LOG.info("y shape %s, sum positive %s", tuple(y.shape), True)  # BREAK
    return y.log()


def test_logging_call(capsys, user_log):
    cf = ember.compile(log_info, backend=BACKEND)
    for _ in range(2):
        exp = log_info(X)
        got = cf(X)
        torch.testing.assert_close(got, exp)
    assert user_log.messages == ["y shape (4, 4), sum positive True"] * 4
    no_recompiles_no_fallbacks()
    counts(log_info, X, graphs=2, breaks=1)


def warn_mid(x):
    y = x.relu()
    warnings.warn("careful with relu", UserWarning)  # BREAK
    return y + 1


def test_warnings_warn(capsys):
    cf = ember.compile(warn_mid, backend=BACKEND)
    for _ in range(2):
        exp = warn_mid(X)
        with pytest.warns(UserWarning, match="careful with relu"):
            got = cf(X)
        torch.testing.assert_close(got, exp)
    no_recompiles_no_fallbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts(warn_mid, X, graphs=2, breaks=1)


def test_warnings_warn_location_matches_eager():
    cf = ember.compile(warn_mid, backend=BACKEND)
    with warnings.catch_warnings(record=True) as eager_w:
        warnings.simplefilter("always")
        warn_mid(X)
    with warnings.catch_warnings(record=True) as comp_w:
        warnings.simplefilter("always")
        cf(X)
    e = [(os.path.basename(w.filename), w.lineno) for w in eager_w if "careful" in str(w.message)]
    c = [(os.path.basename(w.filename), w.lineno) for w in comp_w if "careful" in str(w.message)]
    assert e == [(HERE, line_of(warn_mid))]
    assert c == e, f"compiled warning attributed to {c}, eager to {e}"


def gen_fn(x):
    for i in range(3):
        yield x * i


def test_generator_function_at_top_level_falls_back():
    cf = ember.compile(gen_fn, backend=BACKEND)
    for _ in range(2):
        got, exp = list(cf(X)), list(gen_fn(X))
        same(exp, got)
    assert ember.explain(gen_fn, X).graph_count == 0
    with pytest.raises(ember.Unsupported, match="generator"):
        list(ember.compile(gen_fn, backend=BACKEND, fullgraph=True)(X))


class HFStyleAttention(nn.Module):
    """Like a transformers layer: logger.info and a deprecation warning in forward."""

    def __init__(self, d=8):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, h, use_cache=None):
        q = self.q(h)
        LOG.info("attention input %s", tuple(q.shape))  # BREAK
        a = torch.softmax(q @ q.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        if use_cache is not None:
            warnings.warn("`use_cache` is deprecated", FutureWarning)
        return self.o(a @ q)


def test_hf_style_module_logger_and_warning(user_log):
    torch.manual_seed(0)
    m = HFStyleAttention()
    ref = copy.deepcopy(m)
    ember.compile(m, backend=BACKEND)
    h = torch.randn(2, 3, 8)
    for _ in range(2):
        torch.testing.assert_close(m(h), ref(h))
        with pytest.warns(FutureWarning, match="use_cache"):
            got = m(h, use_cache=True)
        with pytest.warns(FutureWarning, match="use_cache"):
            exp = ref(h, use_cache=True)
        torch.testing.assert_close(got, exp)
    assert user_log.messages == ["attention input (2, 3, 8)"] * 8
    assert stat("fallbacks") == 0, ember.stats()
    counts(m, h, graphs=2, breaks=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts(m, h, use_cache=True, graphs=3, breaks=2)


class BreakyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(4, 8)
        self.lin2 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.lin1(x))
        print("hidden", tuple(h.shape))  # BREAK
        h = self.lin2(h).relu()
        if h.mean() > 0:
            h = h * 2
        return self.head(h)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_training_step_through_broken_graph(capsys, backend):
    torch.manual_seed(0)
    m = BreakyMLP()
    ref = copy.deepcopy(m)
    ember.compile(m, backend=backend)
    x = torch.randn(5, 4)
    for step in range(2):
        xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        capsys.readouterr()
        loss_ref = ref(xr).pow(2).mean()
        out_eager = capsys.readouterr().out
        loss = m(xm).pow(2).mean()
        assert capsys.readouterr().out == out_eager
        torch.testing.assert_close(loss, loss_ref)
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(xm.grad, xr.grad)
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}: {name}")
        with torch.no_grad():
            for p, q in zip(m.parameters(), ref.parameters()):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
                p.grad = q.grad = None
    no_recompiles_no_fallbacks()


def append_then_print(x, acc):
    acc.append(x + 1)
    acc.append("tag")
    print("acc has", len(acc), acc[-1])  # BREAK
    acc.append(len(acc))
    return x * 2


def test_list_append_on_argument_before_break(capsys):
    compare(capsys, append_then_print, X, [])
    compare(capsys, append_then_print, X, [0.5])
    counts(append_then_print, X, [], graphs=2, breaks=1)


def dict_write_then_print(x, d):
    d["y"] = x * 3
    d.pop("drop")
    print("keys", sorted(d))  # BREAK
    return d["y"] + d["a"]


def test_dict_mutation_on_argument_before_break(capsys):
    compare(capsys, dict_write_then_print, X, {"a": 2.0, "drop": 1})
    no_recompiles_no_fallbacks()
    counts(dict_write_then_print, X, {"a": 2.0, "drop": 1}, graphs=2, breaks=1)


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        self.last = self.lin(x)
        print("calls", self.calls, "last", tuple(self.last.shape))  # BREAK
        return self.last * self.calls


def test_setattr_on_module_before_break(capsys):
    torch.manual_seed(0)
    m = Stateful()
    ref = copy.deepcopy(m)
    ember.compile(m, backend=BACKEND)
    for _ in range(3):
        capsys.readouterr()
        exp = ref(X)
        out_eager = capsys.readouterr().out
        got = m(X)
        assert capsys.readouterr().out == out_eager
        torch.testing.assert_close(got, exp)
        assert m.calls == ref.calls
        torch.testing.assert_close(m.last, ref.last)
    assert stat("fallbacks") == 0, ember.stats()


def inplace_then_print(x):
    x.add_(1)
    print("after add", x[0])  # BREAK
    x.mul_(2)
    return x + 1


def test_inplace_on_input_before_break(capsys):
    compare(capsys, inplace_then_print, X.clone())
    no_recompiles_no_fallbacks()
    x = X.clone()
    ember.compile(inplace_then_print, backend=BACKEND)(x)
    torch.testing.assert_close(x, (X + 1) * 2)
    counts(inplace_then_print, X.clone(), graphs=2, breaks=1)


COUNTER = {"n": 0}


def closure_and_global_before_break():
    calls = []

    def f(x):
        calls.append(1)
        COUNTER["n"] += 1
        y = x + len(calls)
        print("calls", len(calls), "counter", COUNTER["n"])  # BREAK
        return y * COUNTER["n"]
    return f, calls


def test_closure_list_and_global_dict_mutation_before_break(capsys):
    f_eager, calls_eager = closure_and_global_before_break()
    f_comp, calls_comp = closure_and_global_before_break()
    cf = ember.compile(f_comp, backend=BACKEND)
    for _ in range(2):
        COUNTER["n"] = 0
        capsys.readouterr()
        exp = f_eager(X)
        out_eager = capsys.readouterr().out
        COUNTER["n"] = 0
        got = cf(X)
        assert capsys.readouterr().out == out_eager
        torch.testing.assert_close(got, exp)
        assert len(calls_comp) == len(calls_eager)


def loud(t):
    print("loud", tuple(t.shape))  # BREAK
    return t + 1


def stack_add(x, y):
    a = x.sin()
    return a + loud(y * 2)


def show(t):
    print("show", tuple(t.shape))  # BREAK
    return t


def stack_cat(x):
    a = x * 2
    b = x + 1
    return torch.cat([a, show(b), a], dim=0)


def test_break_with_nonempty_stack_binary(capsys):
    compare(capsys, stack_add, Y, Y)
    no_recompiles_no_fallbacks()
    counts(stack_add, Y, Y, graphs=3, breaks=2)


def test_break_with_nonempty_stack_in_list_display(capsys):
    compare(capsys, stack_cat, Y)
    no_recompiles_no_fallbacks()
    counts(stack_cat, Y, graphs=2, breaks=2)


def scaled(t, *, scale=1.0, bias=0.0):
    print("scaled", scale, bias)  # BREAK
    return t * scale + bias


def kw_caller(x):
    y = x - 1
    return scaled(y, bias=3.0, scale=2.0)


def test_keyword_call_to_breaking_function(capsys):
    compare(capsys, kw_caller, Y)
    no_recompiles_no_fallbacks()
    counts(kw_caller, Y, graphs=2, breaks=2)


def test_top_level_keyword_call_of_breaking_function(capsys):
    cf = compare(capsys, scaled, Y, scale=4.0, bias=-1.0)
    compare(capsys, scaled, Y, scale=4.0, bias=-1.0, compiled=cf)
    assert stat("recompiles") == 0, ember.stats()
    counts(scaled, Y, scale=4.0, bias=-1.0, graphs=1, breaks=1)


def many_locals(x, n, opts=None):
    t = x * 2
    k = n + 1
    lst = [t, k, "s"]
    d = {"t": t, "none": None}
    tup = (x, 1.5)
    print("live", k, len(lst), sorted(d), tup[1])  # BREAK
    return t + k, lst, d, tup, opts


def test_live_locals_of_all_kinds_survive_break(capsys):
    compare(capsys, many_locals, X, 3)
    compare(capsys, many_locals, X, 3, opts={"a": 1}, compiled=ember.compile(many_locals,
                                                                              backend=BACKEND))
    counts(many_locals, X, 3, graphs=2, breaks=1)


def varargs_break(*tensors, scale=1.0, **extra):
    total = sum(tensors) * scale
    print("n", len(tensors), sorted(extra))  # BREAK
    return total + extra.get("bias", 0.0)


def test_varargs_and_kwargs_across_break(capsys):
    compare(capsys, varargs_break, Y, Y, Y, scale=2.0, bias=1.0)
    no_recompiles_no_fallbacks()
    counts(varargs_break, Y, Y, Y, scale=2.0, bias=1.0, graphs=2, breaks=1)


class Helper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def describe(self, t):
        print("describe", tuple(t.shape))  # BREAK
        return t * 0.5

    def forward(self, x):
        h = self.lin(x)
        return self.describe(h) + h


def test_break_in_method_called_on_self(capsys):
    m, _ = compare_module(capsys, Helper, X)
    no_recompiles_no_fallbacks()
    counts(m, X, graphs=3, breaks=2)


LOCK = threading.Lock()


def unknown_ctx(x):
    y = x + 1
    with LOCK:  # BREAK
        z = y * 2
    return z - 1, LOCK.locked()


def test_unknown_context_manager(capsys):
    compare(capsys, unknown_ctx, X)
    assert not LOCK.locked()
    e = counts(unknown_ctx, X, graphs=1, breaks=1)            # prefix; the with block is eager
    assert e.breaks[0].lineno == line_of(unknown_ctx), e.breaks


def autocast_break(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.mm(x, x)
        print("inside autocast", y.dtype)  # BREAK
        z = torch.mm(y, x)
    return y, z, z.float() + 1


def test_break_inside_autocast(capsys):
    compare(capsys, autocast_break, X / 8)
    no_recompiles_no_fallbacks()
    got = ember.compile(autocast_break, backend=BACKEND)(X / 8)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32]
    assert not torch.is_autocast_enabled("cpu")
    # the resume function re-enters autocast and is compiled: its mm runs in bf16 too
    counts(autocast_break, X / 8, graphs=2, breaks=1)


def nested_grad_modes(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            print("enable_grad", torch.is_grad_enabled())  # BREAK
            c = b + a
        d = c * 2
    return a, b, c, d, x * 4


def test_break_inside_enable_grad_inside_no_grad(capsys):
    x = torch.randn(2, 4, requires_grad=True)
    cf = ember.compile(nested_grad_modes, backend=BACKEND)
    for _ in range(2):
        capsys.readouterr()
        exp = nested_grad_modes(x)
        out_eager = capsys.readouterr().out
        got = cf(x)
        assert capsys.readouterr().out == out_eager
        assert torch.is_grad_enabled()
        assert [t.requires_grad for t in got] == [t.requires_grad for t in exp]
        same(exp, got)
    no_recompiles_no_fallbacks()
    counts(nested_grad_modes, x, graphs=2, breaks=1)


def reassign_and_del(x, y):
    x = x + y
    tmp = x * 2
    del y
    print("rebound", tmp.shape)  # BREAK
    return x - tmp


def test_argument_rebound_and_local_deleted_before_break(capsys):
    compare(capsys, reassign_and_del, X, X.clone())
    no_recompiles_no_fallbacks()
    counts(reassign_and_del, X, X.clone(), graphs=2, breaks=1)


def cells_across_break(x):
    n = 1

    def bump():
        nonlocal n
        n += 1
    bump()
    print("n is", n)  # BREAK
    bump()
    return x * n, n


def test_closure_cell_shared_across_break(capsys):
    compare(capsys, cells_across_break, X, calls=3)
    no_recompiles_no_fallbacks()
    counts(cells_across_break, X, graphs=1, breaks=1)      # no tensor op before the break


def cell_args_across_break(x, k):
    scale = 2.0

    def apply(t):
        return t * k + scale
    y = apply(x)
    print("k is", k)  # BREAK
    scale = 3.0                      # a store to the frame's own cell after the break
    return apply(y), x + k


def test_parameter_cell_and_store_after_break(capsys):
    """A parameter captured by an inner function (a cell that is also an argument) and a cell
    written after the break: the resumed frame and the closure share the live cells."""
    cf = compare(capsys, cell_args_across_break, X, 3)
    compare(capsys, cell_args_across_break, X, 3, compiled=cf)
    no_recompiles_no_fallbacks()
    counts(cell_args_across_break, X, 3, graphs=2, breaks=1)


def loss_made_inside(logits, labels):
    loss_fct = nn.CrossEntropyLoss(ignore_index=-1, label_smoothing=0.1)
    return loss_fct(logits.view(-1, 5), labels.view(-1)), loss_fct


def loss_only(logits, labels):
    return nn.CrossEntropyLoss(ignore_index=-1)(logits.view(-1, 5), labels.view(-1))


def test_stateless_module_made_in_traced_code():
    """HF builds `CrossEntropyLoss()` inside forward: one graph, no break, grads equal; the
    module itself, when it leaves the frame, is a new object per call as in eager."""
    logits = torch.randn(3, 4, 5, requires_grad=True)
    labels = torch.tensor([[0, 1, -1, 4], [2, 2, 3, -1], [1, 0, 4, 4]])
    cf = ember.compile(loss_made_inside, backend=BACKEND)
    e_loss, e_mod = loss_made_inside(logits, labels)
    c_logits = logits.detach().clone().requires_grad_()
    for _ in range(2):
        c_loss, c_mod = cf(c_logits, labels)
        torch.testing.assert_close(c_loss, e_loss)
        assert type(c_mod) is nn.CrossEntropyLoss and c_mod.ignore_index == -1
    assert c_mod is not cf(c_logits, labels)[1]
    (g,) = torch.autograd.grad(e_loss, logits)
    (cg,) = torch.autograd.grad(c_loss, c_logits)
    torch.testing.assert_close(cg, g)
    counts(loss_only, logits, labels, graphs=1, breaks=0)
    no_recompiles_no_fallbacks()


def pad_made_inside(x, total):
    beg = total // 2
    pad = nn.ConstantPad1d((beg, total - beg), 0.5)     # HF Canine's ConvProjection
    return pad(x).relu(), pad


def test_stateless_module_made_from_a_tuple_built_in_the_trace():
    x = torch.randn(2, 3, 6)
    cf = ember.compile(pad_made_inside, backend=BACKEND)
    for total in (3, 3, 4):
        (got, mod), (exp, _) = cf(x, total), pad_made_inside(x, total)
        torch.testing.assert_close(got, exp)
        assert type(mod) is nn.ConstantPad1d and mod.padding == (total // 2, total - total // 2)
    counts(lambda x, total: pad_made_inside(x, total)[0], x, 3, graphs=1, breaks=0)


class SiLUAct(nn.Module):
    """transformers' SiLUActivation: no __init__ of its own; ACT2FN["silu"] makes one per call."""

    def forward(self, x):
        return nn.functional.silu(x)


class CountingAct(nn.Module):
    made = 0

    def __init__(self):
        super().__init__()
        CountingAct.made += 1           # user code at construction: not run at trace time

    def forward(self, x):
        return x * 2


def act_made_inside(x):
    return SiLUAct()(x) * 2


def counting_act_made_inside(x):
    return CountingAct()(x) + 1


def test_module_without_own_init_made_in_traced_code():
    # HF Mamba's reference causal_conv1d_fn builds SiLUActivation per call: it broke the graph
    x = torch.randn(4, 3)
    torch.testing.assert_close(ember.compile(act_made_inside, backend=BACKEND)(x),
                               act_made_inside(x))
    counts(act_made_inside, x, graphs=1, breaks=0)
    cf = ember.compile(counting_act_made_inside, backend=BACKEND)
    before = CountingAct.made
    for _ in range(3):
        torch.testing.assert_close(cf(x), x * 2 + 1)
    assert CountingAct.made - before == 3              # its __init__ ran once per call


def make_counter():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        return x * count
    return step




def raise_after_break(x):
    y = x + 1
    print("about to fail")  # BREAK
    if y.shape[0] == 4:
        raise KeyError(f"rows={y.shape[0]}")
    return y


def test_uncaught_exception_after_break_propagates(capsys):
    cf = ember.compile(raise_after_break, backend=BACKEND)
    for _ in range(2):
        with pytest.raises(KeyError, match="rows=4"):
            raise_after_break(X)
        out_eager = capsys.readouterr().out
        with pytest.raises(KeyError, match="rows=4"):
            cf(X)
        assert capsys.readouterr().out == out_eager == "about to fail\n"
    torch.testing.assert_close(cf(Y), Y + 1)                # a (2, 4) input does not raise


def tensor_while(x):
    steps = 0
    while x.abs().sum() > 1:  # BREAK
        x = x / 2
        steps += 1
    return x, steps


def test_tensor_condition_in_while_loop(capsys):
    compare(capsys, tensor_while, X)
    compare(capsys, tensor_while, X / 1000, compiled=ember.compile(tensor_while, backend=BACKEND))
    # the first test sits before the loop: a jump break; the resumed frame's test at the bottom
    # of the loop is inside the loop, so from there the frame runs eagerly
    e = counts(tensor_while, X, graphs=2, breaks=2)
    assert e.breaks[0].lineno == line_of(tensor_while), e.breaks


def test_tensor_while_compiles_do_not_grow_with_trip_count():
    cf = ember.compile(tensor_while, backend=BACKEND)
    for scale in (1.0, 1e3, 1e6):
        got, steps = cf(X * scale)
        exp, exp_steps = tensor_while(X * scale)
        torch.testing.assert_close(got, exp)
        assert steps == exp_steps
    assert stat("graph_breaks") <= 2 and stat("graphs") <= 2, ember.stats()
    few = ember.explain(tensor_while, X)
    many = ember.explain(tensor_while, X * 1e6)
    assert (few.graph_count, few.break_count) == (many.graph_count, many.break_count), (few, many)


def branch_in_loop(x):
    out = []
    for i in range(3):
        if (x * i).sum() > 0:  # BREAK
            out.append(x + i)
        else:
            out.append(x - i)
    return out


def test_tensor_branch_inside_loop(capsys):
    cf = compare(capsys, branch_in_loop, POS)
    compare(capsys, branch_in_loop, NEG, compiled=cf)
    counts(branch_in_loop, POS, graphs=1, breaks=1)


def pair_and_print(t):
    print("pair", tuple(t.shape))  # BREAK
    return t * 2, t + 2


def unpack_helper_result(x):
    a, b = pair_and_print(x.cos())
    return a * b


def test_unpack_result_of_breaking_helper(capsys):
    compare(capsys, unpack_helper_result, X)
    no_recompiles_no_fallbacks()
    counts(unpack_helper_result, X, graphs=3, breaks=2)


def lambda_break(x):
    g = lambda t: print("lambda", tuple(t.shape)) or t * 2  # noqa: E731  # BREAK
    return g(x + 1) - 1


def test_break_inside_lambda(capsys):
    compare(capsys, lambda_break, X)
    no_recompiles_no_fallbacks()
    counts(lambda_break, X, graphs=3, breaks=2)


def comprehension_break(x):
    ys = [print("item", i) or x * i for i in range(3)]  # BREAK
    return torch.stack(ys).sum(0)


def test_break_inside_list_comprehension(capsys):
    compare(capsys, comprehension_break, X)
    e = ember.explain(comprehension_break, X)
    assert e.break_count == len(e.breaks) >= 1, str(e)
    torch.testing.assert_close(e.result, comprehension_break(X))


def gen_prints(x):
    for i in range(3):
        print("gen", i)  # BREAK
        yield x * i


def consume_generator(x):
    y = x + 1
    return sum(gen_prints(y))


def test_break_inside_inlined_generator(capsys):
    compare(capsys, consume_generator, X)
    e = ember.explain(consume_generator, X)
    assert e.break_count == len(e.breaks) >= 1, str(e)
    torch.testing.assert_close(e.result, consume_generator(X))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        print("layer out", tuple(y.shape))  # BREAK
        return torch.relu(y) + x


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(3)])
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        x = self.norm(x)
        for layer in self.layers:
            x = layer(x)
        return x.mean()


def test_break_in_submodule_inside_modulelist_loop(capsys):
    x = torch.randn(3, 4)
    m, ref = compare_module(capsys, Stack, x)
    no_recompiles_no_fallbacks()
    # self.norm(x), then the loop runs eagerly but each layer(x) goes through the dispatcher:
    # Layer.forward compiles as its own root (lin | print | relu + x), once for all three
    e = counts(m, x, graphs=3, breaks=2)
    assert e.ops_per_graph == [1, 1, 2], e
    torch.testing.assert_close(e.result, ref(x))


def branch_with_grad(x, w):
    h = x @ w
    if h.sum() > 0:  # BREAK
        out = h.relu() * 2
    else:
        out = h.tanh() - 1
    return out.pow(2).mean()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_backward_through_tensor_branch(sign):
    torch.manual_seed(0)
    x = torch.randn(3, 4).abs() * sign
    w0 = torch.rand(4, 4)
    cf = ember.compile(branch_with_grad, backend=BACKEND)
    for _ in range(2):
        w_e, w_c = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        branch_with_grad(x, w_e).backward()
        cf(x, w_c).backward()
        torch.testing.assert_close(w_c.grad, w_e.grad)
    no_recompiles_no_fallbacks()


def shape_poly(x):
    y = x.sum(0)
    print("cols", y.shape[0])  # BREAK
    return y * 2


def test_new_shape_recompiles_prefix_and_resume_correctly(capsys):
    cf = ember.compile(shape_poly, backend=BACKEND)
    for t in (X, Y, X, Y):
        compare(capsys, shape_poly, t, calls=1, compiled=cf)
    assert stat("graph_breaks") <= 2, ember.stats()
    assert stat("fallbacks") == 0, ember.stats()


GLOBAL_TOTAL = 0


def global_write_then_print(x):
    global GLOBAL_TOTAL
    GLOBAL_TOTAL = GLOBAL_TOTAL + 1
    print("total", GLOBAL_TOTAL)  # BREAK
    return x * GLOBAL_TOTAL


def test_global_rebinding_before_break(capsys):
    global GLOBAL_TOTAL
    cf = ember.compile(global_write_then_print, backend=BACKEND)
    for _ in range(2):
        GLOBAL_TOTAL = 0
        capsys.readouterr()
        exp = global_write_then_print(X)
        out_eager = capsys.readouterr().out
        after_eager = GLOBAL_TOTAL
        GLOBAL_TOTAL = 0
        got = cf(X)
        assert capsys.readouterr().out == out_eager
        assert GLOBAL_TOTAL == after_eager == 1
        torch.testing.assert_close(got, exp)
    no_recompiles_no_fallbacks()


def item_in_python_if(x):
    s = x.sum().item()  # BREAK
    if s > 0:
        return x + s
    return x - s


def test_item_used_in_python_branch(capsys):
    cf = ember.compile(item_in_python_if, backend=BACKEND)
    for t in (POS, NEG, POS, NEG):
        compare(capsys, item_in_python_if, t, calls=1, compiled=cf)
    assert stat("fallbacks") == 0, ember.stats()


def log_with_item(x):
    y = x * 2
    LOG.info("total %.1f", y.sum().item())  # BREAK
    return y - 1


def test_logging_call_with_item_argument_no_recompile(user_log):
    cf = ember.compile(log_with_item, backend=BACKEND)
    for _ in range(3):
        torch.testing.assert_close(cf(X), log_with_item(X))
    assert user_log.messages == [f"total {(X * 2).sum().item():.1f}"] * 6
    no_recompiles_no_fallbacks()
    assert stat("graph_breaks") == 2, ember.stats()             # .item(), then LOG.info
    counts(log_with_item, X, graphs=2, breaks=2)


def decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@decorate
def decorated_loud(t):
    u = t * 2
    print("decorated", tuple(u.shape))  # BREAK
    return u + 1


def call_decorated(x):
    return decorated_loud(x - 1) * 3


def test_break_inside_decorated_helper(capsys):
    compare(capsys, call_decorated, X)
    no_recompiles_no_fallbacks()
    counts(call_decorated, X, graphs=4, breaks=3)               # root, wrapper, decorated_loud


class LoudBase(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        print("base forward", tuple(h.shape))  # BREAK
        return h * 2


class QuietChild(LoudBase):
    def forward(self, x):
        y = x + 1
        return super().forward(y) - 1


def test_break_inside_super_forward(capsys):
    m, _ = compare_module(capsys, QuietChild, X)
    no_recompiles_no_fallbacks()
    counts(m, X, graphs=4, breaks=2)


def print_forms(x, items):
    y = x + 1
    print()  # BREAK
    print("a", "b", sep="")
    print(*items, sep=", ")
    print(y.shape, end=" <end>\n")
    print(f"{y.shape[0]}x{y.shape[1]}", flush=True)
    print(y[0], y.dtype)
    return y


def test_print_forms_identical_to_eager(capsys):
    compare(capsys, print_forms, X, [1, "two", 3.0], calls=3)
    no_recompiles_no_fallbacks()
    e = ember.explain(print_forms, X, [1, "two", 3.0])
    assert e.break_count == len(e.breaks) == 6, str(e)
    assert e.graph_count >= 1, str(e)


def return_input_after_break(x):
    v = x.view(-1)
    print("numel", v.numel())  # BREAK
    return x, v, x.t()


def test_returned_input_and_views_keep_identity_and_aliasing(capsys):
    cf = compare(capsys, return_input_after_break, X.clone())
    x = X.clone()
    got = cf(x)
    assert got[0] is x
    got[1][0] = 100.0                                  # a view of x, as in eager
    assert x[0, 0].item() == 100.0 and got[2][0, 0].item() == 100.0
    no_recompiles_no_fallbacks()


def view_mutated_after_break(x):
    v = x.view(2, 8)
    print("view", tuple(v.shape))  # BREAK
    v.add_(1)
    return x * 2


def test_view_made_before_break_mutated_after(capsys):
    # the resumed frame gets x and a view of x and mutates the view: a graph would treat the
    # two inputs as separate memory, so that frame runs eagerly, loudly
    with pytest.warns(UserWarning, match="is mutated and shares memory with another input"):
        compare(capsys, view_mutated_after_break, X.clone())
    x = X.clone()
    ember.compile(view_mutated_after_break, backend=BACKEND)(x)
    torch.testing.assert_close(x, X + 1)
    assert stat("fallbacks") == 1 and stat("recompiles") == 0, ember.stats()


class NormThenPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.bn(x))
        print("mean buffer", self.bn.running_mean.shape)  # BREAK
        return self.drop(h) + torch.rand_like(h)


def test_buffers_and_rng_across_break(capsys):
    torch.manual_seed(0)
    m = NormThenPrint()
    ref = copy.deepcopy(m)
    ember.compile(m, backend=BACKEND)
    x = torch.randn(6, 4)
    for _ in range(2):
        capsys.readouterr()
        torch.manual_seed(1)
        exp = ref(x)
        out_eager = capsys.readouterr().out
        torch.manual_seed(1)
        got = m(x)
        assert capsys.readouterr().out == out_eager
        torch.testing.assert_close(got, exp)
        torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean)
        torch.testing.assert_close(m.bn.running_var, ref.bn.running_var)
        assert int(m.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked)
    no_recompiles_no_fallbacks()


def recursive_print(x, n):
    if n == 0:
        return x
    print("level", n)  # BREAK
    return recursive_print(x * 2, n - 1) + n


def test_recursive_function_that_breaks(capsys):
    compare(capsys, recursive_print, Y, 3)
    assert stat("fallbacks") == 0, ember.stats()


def item_of_many(x):
    y = x + 1
    return y.item()  # BREAK


def test_error_raised_by_the_eager_instruction_propagates():
    with pytest.raises(RuntimeError) as eager_err:
        item_of_many(X)
    cf = ember.compile(item_of_many, backend=BACKEND)
    for _ in range(2):
        with pytest.raises(RuntimeError) as comp_err:
            cf(X)
        assert str(comp_err.value) == str(eager_err.value)
    assert cf(torch.ones(())) == 2.0


def print_grad_tensor(x):
    y = x * 2
    print(y)  # BREAK
    return y.sum()


@pytest.mark.xfail(strict=True, reason="a graph output's grad_fn is the compiled function's backward node, not eager's AddBackward0")
def test_printed_tensor_with_grad_fn_matches_eager(capsys):
    x = X.clone().requires_grad_()
    compare(capsys, print_grad_tensor, x)


def step_with_logged_loss(x, w):
    loss = (x @ w).pow(2).mean()
    LOG.info("loss %.4f", loss.item())  # BREAK
    print("loss", round(loss.item(), 2))
    return loss * 2


def test_per_step_changing_scalar_only_logged_does_not_recompile(capsys, user_log):
    """HF trainers log loss.item() every step: a value that only reaches print/logging must not
    make each new value a recompile (that would hit the recompile limit after 8 steps)."""
    cf = ember.compile(step_with_logged_loss, backend=BACKEND)
    x = X / 10
    for step in range(10):
        w = torch.full((4, 4), 0.1 * (step + 1))
        compare(capsys, step_with_logged_loss, x, w, calls=1, compiled=cf)
    assert len(user_log.messages) == 20 and len(set(user_log.messages)) == 10, user_log.messages
    no_recompiles_no_fallbacks()


def format_item(x):
    v = x.sum().item()  # BREAK
    msg = f"sum={v:.3f} half={v / 2!r}" + " " + str(round(v, 1))
    print(msg)  # BREAK
    return x * 2, msg, v


def test_float_only_formatted_and_returned_does_not_recompile(capsys):
    """f-strings, str(), round() and arithmetic on an item()'s float are recomputed from the
    real value at run time: no guard, no recompile, the same text and returned values."""
    cf = ember.compile(format_item, backend=BACKEND)
    for k in range(4):
        compare(capsys, format_item, X + k / 7, calls=1, compiled=cf)
    no_recompiles_no_fallbacks()


def scale_by(x, s):
    print("scale", s)  # BREAK
    return x * s


def test_float_used_in_graph_is_guarded(capsys):
    """A float the graph uses is guarded by value: each new value recompiles, never reuses a
    graph traced with another."""
    cf = ember.compile(scale_by, backend=BACKEND)
    for s in (0.5, 2.0, 0.5, 3.25):
        compare(capsys, scale_by, X, s, calls=1, compiled=cf)
    assert stat("recompiles") == 2, ember.stats()


def branch_on_item(x):
    v = x.mean().item()  # BREAK
    label = "big" if round(v, 1) > 0.5 else "small"
    return x + 1, label


def test_float_decided_on_is_guarded(capsys):
    cf = ember.compile(branch_on_item, backend=BACKEND)
    for t in (POS, NEG, POS * 0.2, POS):
        compare(capsys, branch_on_item, t, calls=1, compiled=cf)
    assert stat("fallbacks") == 0, ember.stats()


def test_fullgraph_after_non_fullgraph_compile_still_raises(capsys):
    torch.testing.assert_close(ember.compile(print_mid, backend=BACKEND)(X), print_mid(X))
    with pytest.raises(ember.Unsupported, match="print"):
        ember.compile(print_mid, backend=BACKEND, fullgraph=True)(X)
    torch.testing.assert_close(ember.compile(print_mid, backend="eager")(X), print_mid(X))
    assert stat("graphs") == 4, ember.stats()          # prefix + resume per backend


def inference_break(x):
    with torch.inference_mode():
        y = x * 2
        print("inference", torch.is_inference_mode_enabled())  # BREAK
        z = y + 1
    return z, torch.is_inference_mode_enabled()


def test_break_inside_inference_mode(capsys):
    compare(capsys, inference_break, X)
    got = ember.compile(inference_break, backend=BACKEND)(X)
    assert got[0].is_inference() and not torch.is_inference_mode_enabled()
    no_recompiles_no_fallbacks()
    e = ember.explain(inference_break, X)
    assert e.break_count == len(e.breaks) == 1, str(e)
    assert e.graph_count in (1, 2), str(e)        # resumed inside, or the rest of the frame eager


INNER = ember.compile(print_mid, backend=BACKEND)


def calls_compiled_inner(x):
    y = x - 2
    return INNER(y) * 3


def test_compiled_function_calling_compiled_breaking_function(capsys):
    compare(capsys, calls_compiled_inner, X)
    assert stat("fallbacks") == 0 and stat("recompiles") == 0, ember.stats()


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        y = x * self.k
        print("scaler", self.k)  # BREAK
        return y + self.k


def test_compile_bound_method_that_breaks(capsys):
    s = Scaler(3)
    cf = ember.compile(s.apply, backend=BACKEND)
    compare(capsys, s.apply, X, compiled=cf)
    no_recompiles_no_fallbacks()
    counts(s.apply, X, graphs=2, breaks=1)


def containers_across_break(x):
    lst = [x * 2]
    d = {"l": lst}
    print("before", len(lst))  # BREAK
    lst.append(x + 1)
    d["again"] = lst
    return lst, d


def test_container_identity_across_break(capsys):
    cf = compare(capsys, containers_across_break, X)
    lst, d = cf(X)
    assert d["l"] is lst and d["again"] is lst and len(lst) == 2
    no_recompiles_no_fallbacks()
    counts(containers_across_break, X, graphs=2, breaks=1)


@contextlib.contextmanager
def announce(name):
    print("enter", name)
    yield name.upper()
    print("exit", name)


def generator_ctx(x):
    y = x + 1
    with announce("blk") as tag:
        z = y * len(tag)
    return z


def test_contextlib_contextmanager_that_prints(capsys):
    compare(capsys, generator_ctx, X)
    e = ember.explain(generator_ctx, X)
    assert e.break_count == len(e.breaks) >= 1 and e.graph_count >= 1, str(e)


def seed_then_break(x):
    torch.manual_seed(123)
    a = torch.rand(3)
    print("drew", a.shape)  # BREAK
    b = torch.rand(3)
    return x[0, :3] + a + b


def test_rng_seeded_before_break(capsys):
    compare(capsys, seed_then_break, X)
    torch.manual_seed(0)
    ember.compile(seed_then_break, backend=BACKEND)(X)
    after_comp = torch.rand(2)
    seed_then_break(X)
    after_eager = torch.rand(2)
    torch.testing.assert_close(after_comp, after_eager)     # global RNG state left as eager


def requires_grad_before_break(x):
    w = x.clone().requires_grad_()
    print("leaf", w.is_leaf, w.requires_grad)  # BREAK
    return (w * 2).sum(), w


def test_requires_grad_set_before_break(capsys):
    cf = compare(capsys, requires_grad_before_break, X)
    loss, w = cf(X)
    assert w.is_leaf and w.requires_grad and loss.requires_grad
    loss.backward()
    torch.testing.assert_close(w.grad, torch.full_like(X, 2.0))


# ---- explain, stats, fullgraph, logging -----------------------------------------------------
def test_explain_reports_breaks_with_locations():
    e = ember.explain(two_prints, X)
    torch.testing.assert_close(e.result, two_prints(X))
    assert e.graph_count == len(e.graphs) == 3 and len(e.ops_per_graph) == 3, e
    assert all(isinstance(g, torch.fx.GraphModule) for g in e.graphs)
    assert e.recompiles == 0
    assert isinstance(e.guards, list) and e.guards
    assert e.break_count == len(e.breaks) == 2
    first = line_of(two_prints)
    second = line_of(two_prints, 'print("second"')
    assert [b.lineno for b in e.breaks] == [first, second], e.breaks
    text = str(e)
    for b in e.breaks:
        assert os.path.basename(b.filename) == HERE, b.filename
        assert f"{b.filename}:{b.lineno}" in str(b) or f"{HERE}:{b.lineno}" in str(b), str(b)
        assert "print" in b.reason, b.reason
        assert str(b) in text, (str(b), text)
        assert f"{HERE}:{b.lineno}" in text, text
    assert "3" in text.splitlines()[0] and "2" in text.splitlines()[0], text.splitlines()[0]


def test_explain_branch_reason():
    e = ember.explain(branchy, POS)
    assert e.break_count == 1
    b = e.breaks[0]
    assert (os.path.basename(b.filename), b.lineno) == (HERE, line_of(branchy)), b
    assert re.search("branch|tensor", b.reason), b.reason


def test_stats_count_breaks_once_not_per_call(capsys):
    cf = ember.compile(two_prints, backend=BACKEND)
    for _ in range(4):
        cf(X)
    assert stat("graph_breaks") == 2 and stat("graphs") == 3, ember.stats()
    ember.reset()
    assert stat("graph_breaks") == 0
    cf(X)
    assert stat("graph_breaks") == 2, ember.stats()


FULLGRAPH_CASES = [
    (print_mid, (X,), print_mid, "print"),
    (item_then_float, (X,), item_then_float, "item"),
    (branchy, (POS,), branchy, "branch"),
    (np_random, (X,), np_random, "numpy"),
    (nested_root, (X,), deep2, "print"),
]


@pytest.mark.parametrize("fn,args,where,reason", FULLGRAPH_CASES,
                         ids=[c[0].__name__ for c in FULLGRAPH_CASES])
def test_fullgraph_raises_with_user_location(capsys, fn, args, where, reason):
    cf = ember.compile(fn, backend=BACKEND, fullgraph=True)
    with pytest.raises(ember.Unsupported) as info:
        cf(*args)
    msg = str(info.value)
    assert f"{HERE}:{line_of(where)}" in msg, msg
    assert __file__ in msg or HERE in msg, msg
    assert reason in msg, msg
    assert capsys.readouterr().out == ""          # nothing ran before the error


@pytest.fixture
def break_log(monkeypatch, caplog):
    monkeypatch.setenv("EMBER_LOGS", "graph_breaks")
    from ember.logging import get_logger
    lg = get_logger("graph_breaks")
    lg.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="ember"):
            yield caplog
    finally:
        lg.propagate = False


def test_graph_breaks_logged_once_per_distinct_break(capsys, break_log):
    cf = ember.compile(two_prints, backend=BACKEND)
    for _ in range(3):
        cf(X)
    recs = [r.getMessage() for r in break_log.records if r.name == "ember.graph_breaks"]
    assert len(recs) == 2, recs
    first, second = line_of(two_prints), line_of(two_prints, 'print("second"')
    assert f"{HERE}:{first}" in recs[0] and f"{HERE}:{second}" in recs[1], recs


def test_graph_breaks_not_logged_without_env(capsys, monkeypatch, caplog):
    monkeypatch.delenv("EMBER_LOGS", raising=False)
    from ember.logging import get_logger
    lg = get_logger("graph_breaks")
    lg.propagate = True
    try:
        ember.compile(print_mid, backend=BACKEND)(X)
    finally:
        lg.propagate = False
    assert [r for r in caplog.records if r.name == "ember.graph_breaks"] == []


def linear_made_inside(x):
    return nn.Linear(4, 4)(x) + torch.rand(4)


def test_module_with_weights_made_in_traced_code_keeps_rng_in_step(capsys):
    """A module with parameters cannot be built in the trace (it breaks); building it at trace
    time to find out must not draw from the RNG, or later random numbers differ from eager."""
    cf = ember.compile(linear_made_inside, backend=BACKEND)
    for seed in (0, 1):
        torch.manual_seed(seed)
        exp = linear_made_inside(X)
        torch.manual_seed(seed)
        torch.testing.assert_close(cf(X), exp)


class _Box:
    pass


SWAP = _Box()


def swap_attrs(x):
    SWAP.a, SWAP.b = SWAP.b, SWAP.a
    return x + 1


def test_replayed_writes_read_the_values_from_before_them():
    """Residual code reads the caller's floats once, before any write is replayed: a swap
    swaps (a lazy float re-read after the first write would copy it twice)."""
    SWAP.a, SWAP.b = 1.0, 2.0
    cf = ember.compile(swap_attrs, backend=BACKEND)
    for k in range(3):
        torch.testing.assert_close(cf(X), X + 1)
        assert (SWAP.a, SWAP.b) == ((2.0, 1.0) if k % 2 == 0 else (1.0, 2.0))


def make_stepper():
    n = 0

    def step(x):
        nonlocal n
        n += 1
        y = x * n
        n += 10
        return y
    return step


@pytest.mark.parametrize("make, final", [(make_counter, 4), (make_stepper, 44)])
def test_compiled_closure_writes_callers_cell(make, final):
    """`nonlocal` writes to the caller's cell are replayed after the graph, in order; a value
    written twice is read once, before the writes (the stepper)."""
    eager, compiled = make(), make()
    cf = ember.compile(compiled, backend=BACKEND)
    for _ in range(4):
        torch.testing.assert_close(cf(X), eager(X))
    assert compiled.__closure__[0].cell_contents == eager.__closure__[0].cell_contents == final
    assert stat("fallbacks") == 0, ember.stats()


def make_callback(k):
    def cb(x):
        return x + k
    return cb


LAST = {}


def identity_branch(x, cb):
    if cb is LAST["cb"]:
        return x * 0
    return cb(x)


def test_closure_identity_is_guarded_where_used():
    """Nested functions are guarded by code, not identity, for calls; an `is` test on one
    installs the identity guard, so another closure from the same code takes its own path."""
    cb1, cb2 = make_callback(1.0), make_callback(2.0)
    LAST["cb"] = cb1
    cf = ember.compile(identity_branch, backend=BACKEND)
    torch.testing.assert_close(cf(X, cb1), X * 0)
    torch.testing.assert_close(cf(X, cb2), X + 2.0)
    torch.testing.assert_close(cf(X, cb1), X * 0)
