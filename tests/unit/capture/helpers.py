"""Shared checks for capture tests: run eager and compiled on copies, compare everything."""
from __future__ import annotations

import copy

import torch

import ember
from ember import capture


def same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (type(a), type(b))
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (type(a), type(b))
        for x, y in zip(a, b):
            same(x, y)
        return
    if isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), (a.keys(), b.keys())
        for k in a:
            same(a[k], b[k])
        return
    if hasattr(a, "__dict__") and not isinstance(a, type) and not callable(a):
        assert type(a) is type(b)
        same(vars(a), vars(b))
        return
    assert a == b, (a, b)


def check(fn, *args, graphs=1, recompiles=0, calls=2, ops=None, **kwargs):
    """Compare `fn` eager vs ember (backend eager, fullgraph) on deep copies of the inputs."""
    cf = ember.compile(fn, backend="eager", fullgraph=True)
    for _ in range(calls):
        a_eager = copy.deepcopy((args, kwargs))
        a_comp = copy.deepcopy((args, kwargs))
        expected = fn(*a_eager[0], **a_eager[1])
        got = cf(*a_comp[0], **a_comp[1])
        same(expected, got)
        same(a_eager, a_comp)          # mutated inputs match
        # identity of returned inputs
        flat_in = [id(x) for x in _flat(a_comp)]
        for e, g in zip(_flat(expected), _flat(got)):
            pass
        ein = {id(x) for x in _flat(a_eager)}
        for e, g in zip(_flat_ret(expected), _flat_ret(got)):
            if id(e) in ein:
                assert id(g) in flat_in, "returned input lost its identity"
    st = capture.stats()
    assert st.get("graphs", 0) == graphs, st
    assert st.get("recompiles", 0) == recompiles, st
    assert st.get("fallbacks", 0) == 0, st
    if ops is not None:
        e = capture.explain(fn, *copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert e.ops_per_graph == ops, e
    return cf


def _flat(x):
    if isinstance(x, (list, tuple)):
        for i in x:
            yield from _flat(i)
    elif isinstance(x, dict):
        for i in x.values():
            yield from _flat(i)
    else:
        yield x


def _flat_ret(x):
    if isinstance(x, (list, tuple)):
        yield x
        for i in x:
            yield from _flat_ret(i)
    else:
        yield x
