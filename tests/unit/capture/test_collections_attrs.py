"""namedtuple classes and deques made in the traced code; Python attributes written on tensors
(inputs and intermediates), against eager with graph counts."""
from __future__ import annotations

import collections
import copy

import pytest
import torch

import ember
from ember import capture

from .helpers import check, same


def test_namedtuple_class_made_in_trace():
    def f(a, b):
        P = collections.namedtuple("P", ["x", "y", "xy"], defaults=(None, 1, None))
        t = P(a, xy=b)
        return P(t.x, t[1], t.xy + b)

    cf = ember.compile(f, backend="eager", fullgraph=True)
    a, b = torch.randn(3), torch.randn(3)
    ref, got = f(a, b), cf(a, b)
    assert type(got).__name__ == "P" and type(got)._fields == ("x", "y", "xy")
    same(tuple(ref), tuple(got))


def test_deque_methods():
    def f(a, b):
        d = collections.deque([a, b])
        d.append(a + 1)
        d.extend([a, b])
        d.insert(0, "foo")
        tmp = d.pop()
        other = collections.deque([tmp])
        d.extendleft(other)
        other.clear()
        d.extend(other)
        d[2] = "setitem"
        d = d.copy()
        d.append(d.popleft())
        d.rotate(2)
        d.appendleft(b * 3)
        return list(d), len(d)

    check(f, torch.randn(2), torch.randn(2))


def test_deque_returned_is_a_deque():
    def f(x):
        d = collections.deque()
        d.append(x + 1)
        d.appendleft(x * 2)
        return d

    cf = ember.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(2)
    got = cf(x)
    assert type(got) is collections.deque
    same(list(f(x)), list(got))


def test_caller_deque_is_not_mutated_at_trace_time():
    d = collections.deque([1])

    def f(x):
        d.append(2)
        return x + len(d)

    cf = ember.compile(f, backend="eager")
    x = torch.randn(2)
    cf(x)
    assert list(d) == [1, 2]          # appended once, by the eager run


def test_tensor_python_attributes_written():
    def f(x, flag):
        x.offloading = flag
        y = x + 10
        y.grad = x
        y.foo = 42
        return y + y.foo, y

    cf = ember.compile(f, backend="eager", fullgraph=True)
    x = torch.ones(5)
    out, y = cf(x, True)
    assert x.offloading is True and y.foo == 42 and y.grad is x
    same(out, torch.ones(5) + 52)
    assert ember.stats()["counts"].get("graphs") == 1


def test_tensor_attribute_of_torch_refused():
    def f(x):
        y = x + 1
        y.data = x
        return y

    with pytest.raises(ember.Unsupported):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))


def _with_default(x=torch.zeros(2, 2), *, kw=torch.zeros(1, 2)):
    x.add_(1)
    kw.add_(1)
    return x, kw


def test_tensor_defaults_read_through_the_function():
    def f():
        return _with_default()

    cf = ember.compile(f, backend="eager")
    x, kw = cf()
    assert x is _with_default.__defaults__[0] and torch.equal(x, torch.ones(2, 2))
    old = _with_default.__defaults__
    try:
        _with_default.__defaults__ = (torch.zeros(3),)
        x, kw = cf()                    # the new default tensor is the one mutated
        assert x is _with_default.__defaults__[0] and torch.equal(x, torch.ones(3))
        assert ember.stats()["counts"].get("recompiles") == 1
    finally:
        _with_default.__defaults__ = old


def test_module_tensor_attribute_written_in_forward():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            self.cache = self.lin(x).detach()
            self.text = x + 1
            return self.text * 2 + self.cache

    m = M()
    cm = ember.compile(M(), backend="eager", fullgraph=True)
    cm.load_state_dict(m.state_dict())
    for _ in range(3):
        x = torch.randn(2, 3)
        out = cm(x)
        same(out, m(x))
        same(cm.text, x + 1)
        assert "text" in cm.__dict__ and "cache" not in cm._buffers
    assert ember.stats()["counts"].get("graphs") == 1


def test_builtin_setattr_is_an_attribute_write():
    """`setattr(obj, name, value)` is traced as `obj.name = value` (nn.utils.weight_norm's hook
    sets the weight so): no break, the attribute replayed after the graph as eager sets it."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            setattr(self, "cache", self.lin(x) * 2)
            return self.cache + 1

    m = M()
    cm = ember.compile(M(), backend="eager", fullgraph=True)
    cm.load_state_dict(m.state_dict())
    for _ in range(2):
        x = torch.randn(2, 3)
        same(cm(x), m(x))
        same(cm.cache, m.cache)
    assert ember.stats()["counts"].get("graphs") == 1


def test_cpu_of_a_cpu_tensor_is_the_tensor():
    """`x.cpu()` (method and function form) on a CPU tensor returns `x` itself, as eager does:
    no graph break (main broke the graph at each: no meta kernel for the copy)."""
    def f(x):
        y = (x * 2).cpu()
        return torch.Tensor.cpu(y + 1), x.cpu(memory_format=torch.preserve_format)

    x = torch.randn(4)
    cf = ember.compile(f, backend="eager", fullgraph=True)
    out = cf(x)
    same(out, f(x))
    assert out[1] is x
    assert ember.stats()["counts"].get("graphs") == 1


def test_explicit_dunder_call_of_submodule_runs_its_hooks():
    seen = []

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin.__call__(x).relu()

    m = M()
    m.lin.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    cm = ember.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    same(cm(x), torch.relu(m.lin(x)))
    assert len(seen) == 2 and ember.stats()["counts"].get("graphs") == 1


_S = {1, 2}


def test_caller_set_written_in_trace_is_replayed():
    s = {1, 2}

    def f(x):
        s.add(3)
        s.discard(1)
        return torch.cos(x) * len(s)

    def g(x):
        global _S
        _S |= {5}
        return x * len(_S)

    x = torch.rand(4)
    cf = ember.compile(f, backend="eager", fullgraph=True)
    same(cf(x), torch.cos(x) * 2)
    assert s == {2, 3}
    same(cf(x), torch.cos(x) * 2)          # {2, 3}: a new trace (the guard saw the new set)
    assert s == {2, 3}
    before = _S
    cg = ember.compile(g, backend="eager", fullgraph=True)
    same(cg(x), x * 3)
    assert _S is before and _S == {1, 2, 5}


def test_partial_attributes():
    import functools

    def f(t):
        p = functools.partial(lambda x, y: torch.sin(x) + torch.cos(y), y=t)
        n = len(p.__dict__) + len(p.keywords) + len(p.args)
        if hasattr(p, "__dict__") and hasattr(p, "func"):
            return p(t) + n
        return torch.zeros_like(t)

    check(f, torch.randn(3))


class _WithDefault(torch.nn.Module):
    def helper(self, x=torch.zeros(2)):
        x.add_(1)
        return x

    def forward(self):
        return self.helper()


def test_method_tensor_default_read_through_the_function():
    m = _WithDefault()
    cm = ember.compile(m, backend="eager")
    cm()
    fn = _WithDefault.helper
    old = fn.__defaults__
    try:
        fn.__defaults__ = (torch.zeros(3),)
        out = cm()
        assert out is fn.__defaults__[0] and torch.equal(out, torch.ones(3))
    finally:
        fn.__defaults__ = old


def test_module_int_attribute_becomes_dynamic_after_one_change():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.step = 10

        def forward(self, x):
            return self.lin(x + 1) + self.step

    m = M()
    cm = ember.compile(M(), backend="eager")
    cm.load_state_dict(m.state_dict())
    x = torch.rand(3, 4)
    for i in range(5):
        same(cm(x), m(x))
        m.step += 1
        cm.step += 1
    c = ember.stats()["counts"]
    assert c.get("graphs") == 2 and c.get("recompiles") == 1, c


def test_step_counter_written_in_forward_stops_recompiling():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            return x * self.steps

    m, cm = M(), ember.compile(M(), backend="eager")
    x = torch.rand(3)
    for _ in range(6):
        same(cm(x), m(x))
    assert cm.steps == m.steps == 6
    c = ember.stats()["counts"]
    assert c.get("graphs") == 3 and c.get("recompiles") == 2 and not c.get("fallbacks"), c  # 0, 1, then s0


def test_config_ints_of_other_instances_stay_constants():
    """Instances of one class with their own window sizes (two swin models, or the blocks of one
    after a graph break) share the compiled code: each instance's ints are configuration, so
    they get specialized entries, not a symbolic size (symbolic window math sent swin_v2_t's
    graph to eager after a swin_t in the same process). The same instance's counter still
    becomes dynamic (test above)."""
    class Win(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = w

        def forward(self, x):                   # a window partition: sizes divided by w
            B, H, C = x.shape
            x = x.view(B, H // self.w, self.w, C).transpose(1, 2)
            return x.reshape(B * self.w, H // self.w, C).softmax(-1) * self.w

    x = torch.rand(2, 12, 5)
    eager = [Win(w) for w in (2, 3, 4, 6)]
    for m in eager:
        same(ember.compile(copy.deepcopy(m), backend="eager", fullgraph=True)(x), m(x))
    c = ember.stats()["counts"]
    assert c.get("graphs") == 4 and c.get("recompiles") == 3 and not c.get("fallbacks"), c


_S2 = {1}


def test_caller_set_read_through_two_names_is_one_value():
    alias = _S2

    def f(x):
        alias.add(2)
        return x * len(_S2)

    cf = ember.compile(f, backend="eager", fullgraph=True)
    same(cf(torch.ones(2)), torch.ones(2) * 2)     # not a stale len 1
    assert _S2 == {1, 2}


class _Config:
    """A plain config object, as transformers' legacy encoder-decoder configs, whose
    `get_text_config` deep-copies the config and renames prefixed keys on each forward."""

    def __init__(self):
        self.decoder_scale = 2.0
        self.prefix = "decoder"
        self.extra = {"shift": [1.0, 0.5]}

    def __eq__(self, other):
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def text_config(self):
        out = copy.deepcopy(self)
        table = copy.deepcopy(out.__dict__)
        for key in list(table):
            if key.startswith(self.prefix + "_"):
                setattr(out, key[len(self.prefix) + 1:], table[key])
        return out


class _UsesConfig(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = _Config()

    def forward(self, x):
        cfg = self.config.text_config()
        return x * cfg.scale + copy.copy(self.config).extra["shift"][0]


def test_deepcopy_of_a_config_stays_in_the_graph_and_is_guarded():
    m = _UsesConfig()
    cm = ember.compile(m, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(cm(x), m(x))
    torch.testing.assert_close(cm(x), m(x))
    assert capture.stats()["graphs"] == 1
    m.config.decoder_scale = 3.0           # read only through the copy: the guard sees it
    torch.testing.assert_close(cm(x), x * 3.0 + 1.0)
    m.config.extra["shift"][0] = -1.0      # nested in the copied state
    torch.testing.assert_close(cm(x), x * 3.0 - 1.0)
    assert capture.stats()["graphs"] == 3


def test_deepcopy_of_an_object_holding_a_tensor_is_not_folded():
    class Holder:
        def __init__(self):
            self.t = torch.ones(3)

    h = Holder()

    def f(x):
        c = copy.deepcopy(h)
        c.t.add_(1)                        # the copy's tensor, not the caller's
        return x + c.t

    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(f)(x), x + 2)
    torch.testing.assert_close(h.t, torch.ones(3))


def test_deepcopy_of_a_list_holding_an_object_is_traced_not_folded():
    """A copy of a container holding a caller's object is not taken at trace time: the object's
    attributes would be baked in with no guard (a later change would be missed)."""
    cfg = _Config()

    def f(x):
        c = copy.deepcopy([cfg, 1.0])
        return x * c[0].decoder_scale + c[1]

    cf = ember.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    cfg.decoder_scale = 5.0
    torch.testing.assert_close(cf(x), f(x))


def test_dict_union_operators():
    """`d | e` and `d |= e` (PEP 584) on traced dicts, constant dicts and a caller's dict: one
    graph, eager's values, classes and in-place writes (transformers: `kwargs | {...}`)."""
    def inner(x, scale, shift=0.0):
        return x * scale + shift

    def f(x, caller, **kwargs):
        merged = kwargs | {"scale": 2.0}                  # traced | constant
        y = inner(x, **merged)
        caller |= {"seen": x.sum()}                       # caller's dict written in place
        caller |= [("pairs", 1)]                          # `|=` takes pairs, as eagerly
        od = collections.OrderedDict(a=x) | {"b": 1}      # the left operand's class
        dd = collections.defaultdict(list, k=x) | merged
        return y, od, type(dd).__name__, dd["missing"], caller["seen"] + 1

    check(f, torch.randn(4), {"old": torch.ones(1)}, shift=torch.randn(4))


def test_dict_union_breaks_as_eager_fails():
    def f(x):
        return {"a": x} | [("b", 1)]          # TypeError eagerly

    with pytest.raises(TypeError):
        f(torch.randn(2))
    cf = ember.compile(f, backend="eager")
    with pytest.raises(TypeError):
        cf(torch.randn(2))
