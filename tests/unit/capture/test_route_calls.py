"""resume.route_calls: the eager rest of a frame sends each call's callable through a route
(the dispatcher) and otherwise behaves exactly as the original code."""
from __future__ import annotations

import dis
import subprocess
import sys
import textwrap
import types

import torch
import torch.nn as nn

from ember.capture.resume import route_calls


class Recorder:
    """A route that records the name of each callable it sees and returns it unchanged."""

    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, f):
        self.seen.append(getattr(f, "__name__", type(f).__name__))
        return f


def routed(fn, route):
    return types.FunctionType(route_calls(fn.__code__, route), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def helper(*a, **k):
    return sum(a) + sum(k.values())


class Box:
    def __init__(self):
        self.fns = {"dbl": lambda t: t * 2}

    def scale(self, t, by=3):
        return t * by


def call_forms(x, fs, box):
    a = torch.relu(x)                                    # module attribute (method form)
    b = box.scale(a, by=2)                               # method with keywords
    c = fs[0](a if a.sum() > 0 else b)                   # subscript callable, ternary argument
    d = helper(*[1, 2], **{"k": 3})                      # CALL_FUNCTION_EX with kwargs
    e = box.fns["dbl"](b).sum(dim=0)                     # call on a call's result
    try:
        raise ValueError("x")
    except ValueError:
        f = helper(4, 5)                                 # a call inside an exception handler
    g = 0
    for i in range(2):
        g = g + helper(i)                                # a call in a loop
    with torch.no_grad():
        h = x.mul(2)                                     # a call inside a with block
    return a, b, c, d, e, f, g, h


def test_every_call_form_is_routed_and_values_are_unchanged():
    x = torch.randn(3, 4)
    args = (x, [lambda t: t - 1], Box())
    rec = Recorder()
    got = routed(call_forms, rec)(*args)
    exp = call_forms(*args)
    for g, e in zip(got, exp):
        torch.testing.assert_close(g, e)
    # in load order: a callable is routed when it is loaded, before its arguments run
    assert rec.seen == ["relu", "scale", "<lambda>", "sum", "helper", "<lambda>", "sum",
                        "ValueError", "helper", "range", "helper", "helper", "no_grad",
                        "mul"], rec.seen


def test_route_replacement_is_called():
    calls = []

    def swap(f):
        if f is helper:
            return lambda *a, **k: calls.append(a) or helper(*a, **k) * 10
        return f

    def prog(n):
        out = 0
        for i in range(n):
            out += helper(i, 1)
        return out

    assert routed(prog, swap)(3) == prog(3) * 10
    assert calls == [(0, 1), (1, 1), (2, 1)]


def test_method_self_is_never_routed():
    """The route sees bound methods and modules, never a method's receiver on its own."""
    seen = []

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x).relu() + self.lin.forward(x)

    def route(f):
        seen.append(f)
        return f

    m, x = M(), torch.randn(2, 2)
    torch.testing.assert_close(routed(M.forward, route)(m, x), m(x))
    assert not any(f is m for f in seen)
    assert any(f is m.lin for f in seen)


def retry_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(int(x))
        except ValueError:
            out.append(len(str(x)))
    return out


def test_exception_handlers_keep_their_stack_depths():
    """A try block inside a loop unwinds to the depth holding the loop's iterator: routing
    keeps every handler's depth (a wrong one crashes the interpreter)."""
    import functools
    for fn in (retry_loop, functools.update_wrapper, textwrap.TextWrapper._wrap_chunks):
        code = route_calls(fn.__code__, Recorder())
        depths = [(e.depth, e.lasti) for e in dis.Bytecode(code).exception_entries]
        assert depths == [(e.depth, e.lasti) for e in dis.Bytecode(fn.__code__).exception_entries]
    rec = Recorder()
    assert routed(retry_loop, rec)(["1", "x", "22"]) == [1, 1, 22]
    assert rec.seen.count("len") == 1 and rec.seen.count("int") == 3


_STRESS = textwrap.dedent("""
    import importlib, json, textwrap, types, torch
    from ember.capture.resume import route_calls
    n = [0]
    def route(f):
        n[0] += 1
        return f
    count = 0
    for name in ("json.encoder", "json.decoder", "textwrap", "torch.nn.functional",
                 "torch.nn.modules.linear", "torch.nn.modules.activation",
                 "torch.nn.modules.normalization", "torch.nn.modules.transformer",
                 "torch.nn.modules.module", "torch.optim.adamw", "torch.optim.optimizer"):
        mod = importlib.import_module(name)
        for obj in list(vars(mod).values()):
            owners = [obj] if isinstance(obj, type) and obj.__module__ == name else []
            fns = [obj] if isinstance(obj, types.FunctionType) and obj.__module__ == name else []
            fns += [v for o in owners for v in vars(o).values()
                    if isinstance(v, types.FunctionType)]
            for f in fns:
                if not f.__code__.co_flags & 0x3A0:
                    f.__code__ = route_calls(f.__code__, route)
                    count += 1
    d = {"a": [1, 2.5, None, {"b": "x\\n"}], "c": True}
    assert json.loads(json.dumps(d, indent=2)) == d
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    m = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(3):
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(count, n[0], repr(loss.item()))
""")


def test_routing_library_code_keeps_its_behaviour():
    """Route every call in a few hundred stdlib and torch.nn functions (a fresh interpreter,
    their code replaced in place): JSON round trips and three AdamW steps of a transformer
    give the same loss as unrouted code."""
    def run(src):
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.split()
    count, routes, loss = run(_STRESS)
    plain = _STRESS.replace("f.__code__ = route_calls(f.__code__, route)", "pass")
    _, _, loss_plain = run(plain)
    assert int(count) > 300 and int(routes) > 1000, (count, routes)
    assert loss == loss_plain
