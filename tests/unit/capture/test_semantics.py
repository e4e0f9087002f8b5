"""Python semantics capture follows (issue 26): generators and `yield from`, `del`, module
containers, eager frames that say so. Each program runs eagerly and compiled (deep copies of
its inputs) and asserts the counts of graphs and breaks."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture
from ember.logging import reset_warnings

from .helpers import check, same

x3 = torch.randn(3)
x44 = torch.randn(4, 4)


def explain_same(fn, *args, graphs, breaks=0, **kwargs):
    e = ember.explain(fn, *copy.deepcopy(args), **copy.deepcopy(kwargs))
    same(fn(*copy.deepcopy(args), **copy.deepcopy(kwargs)), e.result)
    assert (e.graph_count, e.break_count) == (graphs, breaks), str(e)
    return e


# ---- generators, `yield from` ------------------------------------------------------------------
def test_yield_from_delegates_and_returns_its_value():
    def inner(x):
        yield x + 1
        yield x + 2
        return 10

    def outer(x):
        r = yield from inner(x)
        yield x * r
        yield from [x - 1, x - 2]
        yield from (x * i for i in range(2))

    def f(x):
        return [t * 2 for t in outer(x)]
    check(f, x3)


def test_nested_yield_from_recursion():
    def walk(tree, depth=0):
        yield depth, tree[0]
        for child in tree[1:]:
            yield from walk(child, depth + 1)

    def f(x):
        tree = (x, (x + 1, (x + 2,)), (x + 3,))
        return sum(t * d for d, t in walk(tree))
    check(f, x3)


def test_generator_interleaves_with_its_consumer():
    # eager runs the generator one step at a time between the loop's statements
    def gen(log, x):
        for i in range(3):
            log.append(i)
            yield x + i

    def f(x, log):
        out = []
        for y in gen(log, x):
            log.append(-len(log))
            out.append(y)
        return torch.stack(out)
    check(f, x3, [])


def test_generator_stops_where_the_consumer_breaks():
    def gen(log, x):
        i = 0
        while True:            # endless: only the loop's break ends it
            log.append(i)
            yield x * i
            i += 1

    def f(x, log):
        for i, y in enumerate(gen(log, x)):
            if i == 2:
                break
        first = next(gen(log, x))
        pairs = list(zip(gen(log, x), [1, 2]))
        return y + first + pairs[1][0]
    check(f, x3, [])


def test_any_all_short_circuit_over_generators():
    def check_item(log, i):
        log.append(i)
        return i > 1

    def f(x, log):
        a = any(check_item(log, i) for i in range(5))
        b = all(check_item(log, i) for i in range(5))
        return x + a + b
    check(f, x3, [])


def test_contextmanager_generator_runs_around_the_body():
    state = {"scale": 1.0}

    @contextlib.contextmanager
    def scaled(s):
        old = state["scale"]
        state["scale"] = s
        try:
            yield s * 2
        finally:
            state["scale"] = old

    def f(x):
        with scaled(3.0) as k:
            y = x * state["scale"] * k
        return y * state["scale"]
    check(f, x3)
    assert state == {"scale": 1.0}


def test_module_modules_and_named_modules():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Sequential(nn.ReLU(), nn.Linear(4, 4))

        def forward(self, x):
            names = [n for n, _ in self.named_modules()]
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    x = m(x)
            n_hooks = sum(len(m._forward_hooks) for m in self.modules())
            return x, names, n_hooks

    m = M()
    e = explain_same(m, x44, graphs=1)
    assert e.result[1] == ["", "a", "b", "b.0", "b.1"]


def test_transformer_encoder_layer_eval_is_captured():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    e = ember.explain(layer, x)
    assert e.graph_count >= 1 and e.break_count == 0 and not e.unsupported, str(e)
    torch.testing.assert_close(e.result, layer(x))
    cl = ember.compile(layer, backend="eager")
    torch.testing.assert_close(cl(x), layer(x))
    assert capture.stats().get("graphs") == 1 and not capture.stats().get("fallbacks")


def test_break_in_loop_over_pure_generator_resumes():
    def gen(x):
        for i in range(3):
            yield x * i

    def f(x):
        out = x
        for y in gen(x):
            print("y")                 # break in the loop: the rest runs eagerly
            out = out + y
        return out
    explain_same(f, x3, graphs=1, breaks=1)


def test_break_with_suspended_generator_with_effects_runs_eagerly():
    def gen(log, x):
        for i in range(3):
            log.append(i)
            yield x * i

    def f(x, log):
        out = x
        for y in gen(log, x):
            print(len(log))        # eager prints 1, 2, 3: finishing gen early would print 3s
            out = out + y
        return out
    log_e, log_c = [], []
    expected = f(x3, log_e)
    with pytest.warns(UserWarning, match="runs eagerly"):
        got = ember.compile(f, backend="eager")(x3, log_c)
    torch.testing.assert_close(got, expected)
    assert log_c == log_e


# ---- del obj.attr, del c[k] ----------------------------------------------------------------------
class Holder:
    kind = "class"

    def __init__(self):
        self.cache = torch.ones(3)
        self.kind = "instance"


def test_del_attr_on_callers_object_is_replayed():
    def f(x, h):
        y = x + h.cache
        del h.cache
        del h.kind
        return y, h.kind, hasattr(h, "cache")

    check(f, x3, Holder())
    h = Holder()
    ember.compile(f, backend="eager", fullgraph=True)(x3, h)
    assert not hasattr(h, "cache") and "kind" not in vars(h)


def test_del_attr_on_fresh_object_and_missing_attr_raises():
    class Box:
        pass

    def f(x):
        b = Box()
        b.a, b.b = x, x + 1
        del b.a
        try:
            del b.a
        except AttributeError:
            pass
        return b.b, hasattr(b, "a")
    check(f, x3)


def test_del_attr_on_module_attribute():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.scratch = 2.0

        def forward(self, x):
            y = self.lin(x) * self.scratch
            del self.scratch
            return y

    m = M()
    cm = ember.compile(M(), backend="eager", fullgraph=True)
    cm.load_state_dict(m.state_dict())
    torch.testing.assert_close(cm(x3), m(x3))
    assert not hasattr(cm, "scratch") and not hasattr(m, "scratch")


def test_del_subscr_on_callers_and_fresh_containers():
    def f(x, d, l):
        del d["a"]
        del l[-1]
        del l[0:1]
        fresh = {"p": x, "q": x * 2}
        del fresh["p"]
        items = [x, x + 1, x + 2]
        del items[1]
        try:
            del d["missing"]
        except KeyError:
            pass
        return fresh, items, len(d), len(l)
    check(f, x3, {"a": 1, "b": x3}, [1, 2, 3, 4])


def test_except_with_a_tuple_of_types():
    """`except (A, B):` matches either type, in one graph (CHECK_EXC_MATCH with a tuple: it
    raised AttributeError in capture, and a pytest-rewritten assert compiles to one)."""
    def f(x):
        try:
            y = {}["k"]
        except (IndexError, KeyError):
            y = x * 2
        try:
            raise ValueError("v")
        except (TypeError, ValueError):
            y = y + 1
        return y
    explain_same(f, x3, graphs=1)


# ---- Sequential / ModuleList / ModuleDict indexing and slicing ------------------------------------
class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())
        self.ml = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.md = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.ReLU()})

    def forward(self, x):
        y = self.seq[1:](x)
        y = self.seq[-1](y) + self.seq[:-2][0](x) + self.seq[1:][1:](x)
        for layer in self.ml[::-1]:
            y = layer(y)
        y = y + self.ml[-2](x) + self.ml[1:][-1](x)
        n = len(self.seq) + len(self.ml[1:]) + len(self.md) + len(self.seq[:2])
        for _, m in self.md.items():
            y = m(y)
        for k in self.md:
            y = self.md[k](y)
        return y * n, type(self.seq[1:]).__name__, type(self.ml[:1]).__name__


def test_module_container_indexing_and_slicing():
    torch.manual_seed(0)
    m = Containers()
    x = torch.randn(2, 4)
    e = explain_same(m, x, graphs=1)
    assert e.result[1:] == ("Sequential", "ModuleList")
    cm = ember.compile(copy.deepcopy(m), backend="eager", fullgraph=True)
    same(m(x), cm(x))
    # a replaced submodule is seen through the slice
    m.seq[2] = nn.Linear(4, 4)
    cm.seq[2] = m.seq[2]
    same(m(x), cm(x))


def test_module_slice_out_of_range_and_across_a_break():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

        def forward(self, x):
            tail = self.seq[1:]
            try:
                self.seq[5]
            except IndexError:
                x = x + 1
            print("break")
            return tail(x)

    torch.manual_seed(0)
    m = M()
    x = torch.randn(2, 4)
    explain_same(m, x, graphs=2, breaks=1)


# ---- eager frames say so; small semantics ---------------------------------------------------------
def test_frame_that_runs_eagerly_after_a_break_says_so_once():
    import threading

    def f(x):
        lock = threading.Lock()          # a call the trace cannot make: a break
        with lock:                       # a with-block the trace cannot enter: eager from here
            y = x + 1
        return y * 2

    with pytest.warns(UserWarning, match=r"ember: \S+:\d+ runs eagerly: .*with-statement"):
        e = ember.explain(f, x3)
    assert e.graph_count == 0 and e.break_count == 2 and len(e.eager) == 1, str(e)
    torch.testing.assert_close(e.result, f(x3))


def test_frame_that_runs_eagerly_whole_is_listed_by_explain():
    def gen(log, x):
        for i in range(2):
            log.append(i)
            yield x * i

    def f(x, log):
        g = gen(log, x)
        y = next(g)
        print("break")                   # g is suspended and writes: no resumable break
        return y + next(g)

    with pytest.warns(UserWarning, match=r"(?s)ember: \S+:\d+ runs eagerly: .*no graph break"):
        e = ember.explain(f, x3, [])
    assert e.graph_count == 0 and len(e.eager) == 1 and e.fallbacks == 1, str(e)
    torch.testing.assert_close(e.result, f(x3, []))


def test_numpy_arrays_made_in_the_frame_are_traced():
    np = pytest.importorskip("numpy")

    def f(x):
        a = np.ones(3)                   # float64, as NumPy makes it: the sum is float64
        return x + torch.from_numpy(a) + torch.as_tensor(np.asarray([1.0, 2.0, 3.0]))

    e = explain_same(f, x3, graphs=1, breaks=0)
    assert e.result.dtype == torch.float64

    def g(x):                           # a range is spelled in graph code
        return x + torch.tensor(range(3))
    check(g, x3)


def test_keyword_argument_named_self():
    def f(x, self):
        return x + self

    cf = ember.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(cf(x3, self=2.0), f(x3, self=2.0))
    torch.testing.assert_close(ember.explain(f, x3, self=x3).result, f(x3, x3))


def test_sum_with_start():
    def f(x, l):
        return sum(l, start=x), sum([x, x], x * 2), sum((1, 2), start=3)
    check(f, x3, [x3, x3 + 1])


def test_dict_views_are_live():
    def f(x, d):
        keys, values, items = d.keys(), d.values(), d.items()
        d["c"] = x * 3
        fresh = {"p": x}
        fk = fresh.keys()
        fresh["q"] = x + 1
        del d["a"]
        return (list(keys), len(values), [k for k, _ in items], sum(values), list(fk),
                "c" in keys, keys & {"b", "z"}, keys == {"b", "c"}, bool(fk))
    check(f, x3, {"a": x3, "b": x3 + 1})


def test_returned_dict_view_stays_live():
    def f(x):
        d = {"a": x}
        v = d.keys()
        return d, v

    cf = ember.compile(f, backend="eager", fullgraph=True)
    d, v = cf(x3)
    d["b"] = 1
    assert list(v) == ["a", "b"]


def test_torch_size_as_dict_key():
    def f(x, scale):
        return x * scale[x.shape]

    scale = {torch.Size([3]): 2.0, torch.Size([4, 4]): 3.0, torch.float32: 1.0}
    check(f, x3, scale)
    cf = ember.compile(f, backend="eager")
    torch.testing.assert_close(cf(x44, scale), f(x44, scale))


def test_abandoned_generator_with_cleanup_runs_eagerly():
    def gen(log, x):
        try:
            for i in range(3):
                yield x * i
        finally:
            log.append("closed")         # eager runs it when the loop drops the generator

    def f(x, log):
        for y in gen(log, x):
            if len(log) == 0:
                break
        return y

    log_e, log_c = [], []
    expected = f(x3, log_e)
    with pytest.warns(UserWarning, match="left paused"):
        got = ember.compile(f, backend="eager")(x3, log_c)
    torch.testing.assert_close(got, expected)
    assert log_c == log_e == ["closed"]


def test_exception_raised_in_generator_reaches_the_consumer():
    def gen(x):
        yield x
        raise ValueError("stop")

    def f(x):
        out = x
        try:
            for y in gen(x):
                out = out + y
        except ValueError:
            out = out * 2
        return out
    check(f, x3)


# ---- functools, itertools, sorted/min/max with key ----------------------------------------------
def test_functools_partial_made_in_the_trace():
    import functools

    def scale(t, a, b=1.0):
        return t * a + b

    def f(x):
        p = functools.partial(scale, b=2.0)
        q = functools.partial(p, 3.0)
        return q(x), p(x, a=0.5), q.args, callable(q)
    check(f, x3)


def test_functools_partial_returned_and_reduce():
    import functools
    import operator

    def f(x):
        total = functools.reduce(operator.add, [x, x * 2, x * 3])
        prod = functools.reduce(lambda a, b: a * b, [x, x], x)
        return total, prod, functools.partial(torch.add, x)

    cf = ember.compile(f, backend="eager", fullgraph=True)
    total, prod, p = cf(x3)
    et, ep, pp = f(x3)
    torch.testing.assert_close(total, et)
    torch.testing.assert_close(prod, ep)
    torch.testing.assert_close(p(x3), pp(x3))


def test_itertools():
    import itertools
    import operator

    def gen(log, x):
        for i in range(4):
            log.append(i)
            yield x * i

    def f(x, log):
        a = list(itertools.chain([x, x + 1], (x * i for i in range(2))))
        b = list(itertools.chain.from_iterable([[x], [x + 2, x + 3]]))
        c = [p + q for p, q in itertools.product([x, x + 1], repeat=2)]
        d = list(itertools.islice(gen(log, x), 1, 3))          # pulls 3 values, as eager does
        e = list(itertools.zip_longest([x, x], [x], fillvalue=x * 0))
        g = [i for i, _ in zip(itertools.count(5, 2), range(3))]
        h = list(itertools.repeat(x, 2)) + [y for y, _ in zip(itertools.repeat(x), range(2))]
        k = list(itertools.accumulate([x, x, x])) + \
            list(itertools.accumulate([1, 2, 3], operator.mul, initial=2))
        return a, b, c, d, e, g, h, k
    check(f, x3, [])


def test_sorted_min_max_with_key():
    def f(x, d):
        names = sorted(d, key=lambda k: len(k))
        by_val = sorted(d.items(), key=lambda kv: kv[1], reverse=True)
        tensors = sorted([x * 2, x, x * 3], key=lambda t: t.shape[0])
        longest = max(d, key=len)
        smallest = min(d.values(), key=lambda v: -v)
        empty = min([], key=lambda v: v, default=-1)
        return names, by_val, tensors, longest, smallest, empty
    check(f, x3, {"bb": 2, "a": 1, "ccc": 3, "dd": 2})


# ---- containers built in the frame and returned -------------------------------------------------
class _P(__import__("collections").namedtuple("_P", "a b")):
    pass


_Pair = __import__("collections").namedtuple("_Pair", "a b")


class _Out(__import__("collections").OrderedDict):
    def first(self):
        return next(iter(self.values()))


def test_namedtuple_make_replace_asdict():
    def f(x):
        p = _Pair._make([x, 1])
        q = p._replace(b=x * 2)
        return p, q, q._asdict(), _Pair._fields, _P(x, 2)
    check(f, x3)


def test_ordered_dict_subclass_built_and_returned():
    def f(x):
        o = _Out()
        o["a"] = x + 1
        o["b"] = x * 2
        o2 = _Out(c=x, d=x - 1)
        return o, o2, o.first(), list(o2.keys())
    check(f, x3)


def test_dataclass_replace_and_class_of_traced_values():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        x: torch.Tensor
        n: int = 1

    def f(x):
        a = Frozen(x + 1)
        b = dataclasses.replace(a, n=2)
        return a, b, type(b).__name__, b.__class__ is Frozen, [x].__class__ is list
    check(f, x3)


def test_module_parameters_generators_in_forward():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            p = next(self.parameters())
            n = sum(q.numel() for q in self.parameters())
            names = [k for k, _ in self.named_parameters()] + [k for k, _ in self.named_buffers()]
            kinds = ", ".join(type(c).__name__ for c in self.children())
            return self.bn(self.lin(x)).to(p.dtype) * n, names, kinds

    m = M().eval()
    e = explain_same(m, torch.randn(2, 3), graphs=1)
    assert e.result[1][-1] == "bn.num_batches_tracked" and e.result[2] == "Linear, BatchNorm1d"


def test_set_made_in_the_trace_is_new_per_call_and_holds_tensors_by_identity():
    def f(x):
        s = set()
        s.add("a")
        seen = set()
        seen.add(x)
        y = x * 2
        return x + 1, s, x in seen, y in seen, len(seen)

    cf = ember.compile(f, backend="eager", fullgraph=True)
    first = cf(x3)
    first[1].add("mutated by the caller")
    second = cf(x3)
    assert second[1] == {"a"} and second[2:] == (True, False, 1)


def test_optimizer_step_runs_eagerly_loudly_and_updates_like_eager():
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    m2 = copy.deepcopy(m)
    opts = [torch.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9) for mm in (m, m2)]
    for mm in (m, m2):
        mm(x44).sum().backward()
    step = ember.compile(opts[1].step, backend="eager")
    reset_warnings()                       # said once per process: say it here
    with pytest.warns(UserWarning, match=r"ember: \S+optimizer.py:\d+ runs eagerly"):
        step()
    opts[0].step()
    same(m.state_dict(), m2.state_dict())


def test_record_function_is_a_label_only():
    def f(x):
        with torch.autograd.profiler.record_function("label"):
            y = x * 2
        return y + 1
    check(f, x3)


def test_break_in_loop_over_generator_with_cleanup_finishes_it():
    def gen(x):
        try:
            for i in range(3):
                yield x * i
        finally:
            pass                         # cleanup code that writes nothing

    def f(x):
        out = x
        for y in gen(x):
            print("y")
            out = out + y
        return out
    explain_same(f, x3, graphs=1, breaks=1)


def test_partial_from_the_caller_is_read_through_its_source():
    import functools

    def mul(x, y):
        return x * y

    def f(p, x):
        return p(x)

    cf = ember.compile(f, backend="eager")
    for y in (torch.ones(3), torch.full((3,), 3.0)):      # a new partial per call
        p = functools.partial(mul, y=y)
        torch.testing.assert_close(cf(p, x3), f(p, x3))
    assert capture.stats().get("recompiles", 0) == 0


def test_hasattr_on_partial_made_in_the_trace():
    import functools

    def f(x):
        p = functools.partial(torch.add, other=x)
        return p(x) if hasattr(p, "__call__") and not hasattr(p, "__name__") else x
    check(f, x3)


def test_module_class_attribute_wins_over_a_submodule_of_the_same_name():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.activation = nn.ReLU()          # in _modules: the method below wins
            self.lin = nn.Linear(3, 3)

        def activation(self, x):
            return x * 1.2

        def forward(self, x):
            return self.activation(self.lin(x))

    torch.manual_seed(0)
    explain_same(M(), torch.randn(2, 3), graphs=1)


def test_super_in_a_classmethod_and_dict_of_a_mapping():
    from collections.abc import MutableMapping

    class Parent:
        @classmethod
        def double(cls, x):
            return x + x

    class Child(Parent):
        @classmethod
        def double(cls, x):
            return super().double(x) * 2

    class Store(MutableMapping):
        def __init__(self):
            self._d = {}

        def __getitem__(self, k):
            return self._d[k]

        def __setitem__(self, k, v):
            self._d[k] = v

        def __delitem__(self, k):
            del self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

        def keys(self):
            return self._d.keys()

    def f(x):
        s = Store()
        s["a"] = x
        s["b"] = x + 1
        return Child.double(x), dict(s)
    check(f, x3)


def test_typing_subscript_is_a_constant():
    # timm's CrossViT: `torch.jit.annotate(List[torch.Tensor], [])`. Traced, typing's cached
    # __getitem__ reached sys._getframe: a graph break in each of its blocks (5 graphs)
    from typing import Dict, List

    def f(x):
        outs = torch.jit.annotate(List[torch.Tensor], [])
        for i in range(3):
            outs.append(x * i)
        d = torch.jit.annotate(Dict[str, torch.Tensor], {})
        d["s"] = torch.cat(outs)
        return d["s"]
    check(f, x3)
