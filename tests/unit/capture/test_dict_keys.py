"""Dicts keyed by tensors and other objects (Python hashes a tensor by identity), and
defaultdict's default factory, against eager with graph/recompile counts."""
from __future__ import annotations

import collections
import typing

import torch

import ember

from .helpers import check, same

T = typing.TypeVar("T")


def _counts():
    return ember.stats()["counts"]


def test_parameter_and_intermediate_tensor_keys():
    p = torch.nn.Parameter(torch.ones(3))

    def f(x):
        y = x * 2
        d = {"a": x, p: 3, y: 4}
        d[x] = 5
        total = d["a"] + d[p] + d[y] + d[x]
        return total, len(d), (y in d), (x.cos() in d)

    check(f, torch.randn(3))


def test_tensor_keyed_dict_returned_keeps_identity():
    def f(x):
        y = x + 1
        return y, {y: x * 2, x: 1}

    cf = ember.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(4)
    y, d = cf(x)
    assert list(d.keys())[0] is y and list(d.keys())[1] is x
    same(d[y], x * 2)
    assert d[x] == 1


def test_iterating_tensor_keys():
    def f(x):
        d = {x: 1, x + 1: 2}
        out = x.new_zeros(x.shape)
        for k, v in d.items():
            out = out + k * v
        return out

    check(f, torch.randn(3))


def test_caller_dict_with_object_keys_guarded_by_identity():
    def f(d, x):
        return x * d[T]

    cf = ember.compile(f, backend="eager")
    x = torch.randn(3)
    d = {T: torch.tensor(2.0)}
    same(f(d, x), cf(d, x))
    U = typing.TypeVar("U")
    d2 = {U: torch.tensor(3.0)}
    try:
        f(d2, x)
        raise AssertionError("eager should raise")
    except KeyError:
        pass
    try:
        cf(d2, x)            # a guard on the keys: the new keys raise the same KeyError
        raise AssertionError("compiled should raise")
    except KeyError:
        pass


def test_caller_dict_with_tensor_keys():
    a, b = torch.ones(2), torch.zeros(2)

    def f(d, x):
        return x + d[a] + d[b]

    cf = ember.compile(f, backend="eager", fullgraph=True)
    d = {a: torch.tensor(1.0), b: torch.tensor(2.0)}
    x = torch.randn(2)
    same(f(d, x), cf(d, x))
    d2 = {b: torch.tensor(1.0), a: torch.tensor(2.0)}
    same(f(d2, x), cf(d2, x))
    assert _counts().get("graphs") == 2


def test_defaultdict_from_caller_calls_its_factory():
    for factory in (dict, list, tuple, lambda: 7):
        dd = collections.defaultdict(factory)
        p = torch.nn.Parameter(torch.ones(2))

        def f(x):
            dd["a"] = x + 1
            dd[p] = 123
            return dd["b"], dd

        ref_dd = collections.defaultdict(factory)
        ember.reset()
        cf = ember.compile(f, backend="eager", fullgraph=True)
        x = torch.randn(2)
        got_b, got = cf(x)
        assert got is dd and list(dd) == ["a", p, "b"]
        ref_dd["b"]
        assert got_b == ref_dd["b"] and type(got_b) is type(ref_dd["b"])
        same(dd["a"], x + 1)


def test_defaultdict_made_in_trace():
    def f(x):
        dd = collections.defaultdict(list)
        dd["a"].append(x + 1)
        dd["a"].append(x * 2)
        dd["b"]
        return dd, sum(dd["a"])

    cf = check(f, torch.randn(3))
    dd, _ = cf(torch.randn(3))
    assert type(dd) is collections.defaultdict and dd.default_factory is list
    dd["c"].append(1)           # still a working defaultdict


def test_unhashable_key_raises_as_eager():
    def f(x):
        try:
            {[1]: x}
        except TypeError:
            return x + 1
        return x

    check(f, torch.randn(2))


def test_min_max_of_scalar_tensors_and_numbers():
    def f(a, b):
        c = a + b
        a = a.sum()
        b = b.sum()
        a = min(max(a, 0), 1)
        b = max(0, min(1, b))
        return max(a, b) - min(a, b) + c

    check(f, torch.randn(4), torch.randn(4))
    ember.reset()
    check(f, torch.full((3,), 0.2), torch.full((3,), -0.1))


def test_popitem_and_move_to_end():
    def f(x):
        d = collections.OrderedDict(a=x, b=x + 1, c=x + 2)
        d.move_to_end("a")
        d.move_to_end("c", last=False)
        k1, v1 = d.popitem()
        k2, v2 = d.popitem(last=False)
        e = {"p": x * 2, "q": x * 3}
        k3, v3 = e.popitem()
        return list(d.keys()), k1, v1, k2, v2, k3, v3, e

    check(f, torch.randn(2))


def test_caller_ordered_dict_move_to_end_replayed():
    od = collections.OrderedDict(a=1, b=2)

    def f(x):
        od.move_to_end("a")
        return x + od["a"]

    cf = ember.compile(f, backend="eager", fullgraph=True)
    same(cf(torch.zeros(2)), torch.ones(2))
    assert list(od) == ["b", "a"]
