"""Dynamic shapes (docs/design/058): a cat or pad along an outer loop of symbolic length is
unswitched at its run-time boundary (`v1 >= s0` over a loop of `s0 + 1`), as 037 does for
integer boundaries: one loop nest per segment, each with its compares decided, so no select
or masked load is left in the simd loop.

The symbolic decisions (cpp_ranges.decide, surely_le, _segments) are checked by enumerating
sizes 2..6 of each symbol (every size symbol is >= 2: 0 and 1 specialize). End to end: values
exact against eager at sizes no compile saw, one dynamic recompile and none per new size, and
the dynamic graph's kernels hold no select."""
from __future__ import annotations

import itertools

import pytest
import sympy
import torch
import torch.nn.functional as F

import ember
from ember.capture.entry import stats
from ember.codegen.cpp_ranges import _segments, decide, surely_le
from ember.loopir.index import size_hints, sym

s0, s1 = sym("s0"), sym("s1")


def _at(e, vals):
    return int(sympy.sympify(e).xreplace(vals))


@pytest.mark.parametrize("cmp,op", [("lt", int.__lt__), ("le", int.__le__), ("gt", int.__gt__),
                                    ("ge", int.__ge__), ("eq", int.__eq__), ("ne", int.__ne__)])
def test_symbolic_decide_holds_for_every_size(cmp, op):
    cases = [(0, s0 - 1, s0), (s0, s0, s0), (0, s0 - 1, 0), (s0, s0 + s1 - 1, s0),
             (2, s0 + 1, s0 + 2), (s0 + 2, s0 + 2, s0 + 2), (0, s0 + 1, 2), (0, s0, s1)]
    for lo, hi, k in cases:
        got = decide(cmp, lo, hi, k)
        for a, b in itertools.product(range(2, 7), repeat=2):
            vals = {s0: a, s1: b}
            xs = range(_at(lo, vals), _at(hi, vals) + 1)
            truth = {op(x, _at(k, vals)) for x in xs}
            if got is not None:        # decided: it must hold at every x and every size
                assert truth == {got}, (cmp, lo, hi, k, vals)


def test_surely_le_and_symbolic_segments():
    assert surely_le(s0, s0 + 1) and surely_le(2, s0) and not surely_le(3, s0)
    assert not surely_le(s0, s1) and surely_le(s0 + 2, 2 * s0)
    with size_hints({s0: 5, s1: 3}):    # segments are ordered by the hints, then checked
        assert _segments({s0}, s0 + 1) == [(0, s0), (s0, s0 + 1)]
        assert _segments({s0, s0 + s1}, s0 + s1 + 3) == [(0, s0), (s0, s0 + s1),
                                                        (s0 + s1, s0 + s1 + 3)]
        assert _segments({s0, s1}, s0 + s1) is None      # not ordered for every size


def kv_cat(cache, new):
    return torch.cat([cache, new], dim=2) * 2.0


def cat3(a, b):
    return torch.cat([a, b, a[:, :3]], dim=1).relu()


def pad_rows(x):
    return F.pad(x, (0, 0, 2, 3), value=1.5) + 1.0


CASES = {
    # a KV-cache append: boundary s0 in a loop of s0 + 1 (an outer loop: the simd one is D)
    "kv_cat": (kv_cat, lambda t: (torch.randn(1, 4, t, 16), torch.randn(1, 4, 1, 16)),
               [9, 12, 2, 3, 31]),
    # two dynamic parts and a static one: boundaries s0 and s0 + s1
    "cat3": (cat3, lambda t: (torch.randn(2, t, 8), torch.randn(2, t + 3, 8)),
             [7, 10, 3, 2, 19]),
    # a pad of an outer dim: compares with 2 and with s0 + 2
    "pad_rows": (pad_rows, lambda t: (torch.randn(3, t, 16),), [6, 9, 2, 5, 23]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dynamic_cat_unswitched_at_run_time_boundary(name, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    fn, inputs, sizes = CASES[name]
    ember.reset()
    f = ember.compile(fn)
    for t in sizes:
        args = inputs(t)
        torch.testing.assert_close(f(*args), fn(*args), rtol=0, atol=0)
    assert stats().get("graphs", 0) == 2        # static, then one dynamic recompile
    found = [p.read_text() for p in (tmp_path / "debug").rglob("05_kernels.cpp")
             if "int64_t s0" in p.read_text()]
    assert len(found) == 1
    body = found[0].split("extern \"C\"", 1)[1]
    assert "ember::pick" not in body and "if (tmp" not in body, body
    ember.reset()
