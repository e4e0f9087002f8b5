"""loopir.index.simplify_index: range-aware rewriting of FloorDiv/ModularIndexing, checked by
enumerating every point of small loop nests (the rewritten index must equal the original one
everywhere) and on the reshape patterns that made GroupNorm's kernels divide per element."""
from __future__ import annotations

import itertools
import random

import pytest
import sympy

from ember.loopir.index import FloorDiv, ModularIndexing, simplify_index, sym

v = [sym(f"v{i}") for i in range(4)]


def _value(e, point: dict) -> int:
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return point[e]
    if e.is_Add:
        return sum(_value(a, point) for a in e.args)
    if e.is_Mul:
        out = 1
        for a in e.args:
            out *= _value(a, point)
        return out
    if isinstance(e, FloorDiv):
        return _value(e.args[0], point) // _value(e.args[1], point)
    if isinstance(e, ModularIndexing):
        a, b, m = (_value(x, point) for x in e.args)
        return (a // b) % m
    raise AssertionError(e)


def _check_everywhere(e, ranges):
    s = simplify_index(e, ranges)
    vars_ = list(ranges)
    for point in itertools.product(*(range(ranges[x]) for x in vars_)):
        p = dict(zip(vars_, point))
        assert _value(s, p) == _value(e, p), (e, s, p)
    return s


def _reshape_index(flat, old_sizes):
    """The storage offset of flat index `flat` into a contiguous tensor of `old_sizes`, the
    way lowering builds a view's reindexing (FloorDiv / ModularIndexing per old dim)."""
    strides, acc = [], 1
    for n in reversed(old_sizes):
        strides.append(acc)
        acc *= n
    strides.reverse()
    out = 0
    for d, (n, st) in enumerate(zip(old_sizes, strides)):
        part = FloorDiv(flat, sympy.Integer(st)) if d == 0 else \
            ModularIndexing(flat, sympy.Integer(st), sympy.Integer(n))
        out += st * part
    return out


def test_group_norm_views_become_affine():
    # [4, 16, 80, 80] viewed as [4, 4, 25600] (statistics) and read back per channel
    flat = v[2] + 25600 * v[1] + 102400 * v[0]
    small = v[2] + 400 * v[1] + 1600 * v[0]
    s = _check_everywhere(_reshape_index(small, [2, 16, 10, 10]), {v[0]: 2, v[1]: 4, v[2]: 400})
    e = _reshape_index(flat, [4, 16, 80, 80])
    assert simplify_index(e, {v[0]: 4, v[1]: 4, v[2]: 25600}) == flat
    back = v[3] + 80 * v[2] + 6400 * v[1] + 102400 * v[0]
    e2 = _reshape_index(25600 * FloorDiv(back, 25600) + ModularIndexing(back, 1, 25600),
                        [4, 16, 80, 80])
    assert simplify_index(e2, {v[0]: 4, v[1]: 16, v[2]: 80, v[3]: 80}) == back
    assert simplify_index(4 * v[0] + FloorDiv(back - 102400 * v[0], 25600),
                          {v[0]: 4, v[1]: 16, v[2]: 80, v[3]: 80}) == 4 * v[0] + FloorDiv(v[1], 4)
    assert s == small


def test_channel_shuffle_index_is_exact():
    # x.view(n, g, c//g, h).transpose(1, 2).reshape(n, c, h): a real permutation stays div/mod
    g, cg, h = 3, 4, 5
    c = v[1]
    src = h * (cg * ModularIndexing(c, 1, g) + FloorDiv(c, g)) + v[2]
    s = _check_everywhere(src, {v[1]: g * cg, v[2]: h})
    assert s.has(FloorDiv) or s.has(ModularIndexing)


@pytest.mark.parametrize("seed", range(40))
def test_random_reshapes_keep_values(seed):
    rng = random.Random(seed)
    rank = rng.randint(1, 3)
    sizes = [rng.choice([1, 2, 3, 4, 6, 8]) for _ in range(rank)]
    # the flat index of a random (possibly permuted) loop nest over `sizes`
    order = list(range(rank))
    rng.shuffle(order)
    strides, acc = [0] * rank, 1
    for d in reversed(order):
        strides[d] = acc
        acc *= sizes[d]
    flat = sum(st * v[d] for d, st in enumerate(strides)) + rng.choice([0, 0, acc])
    old = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 3))]
    old.append(max(1, (2 * acc) // max(1, __import__("math").prod(old))))
    e = _reshape_index(flat, old) + rng.choice([0, 5]) * FloorDiv(flat, rng.choice([2, 3, 4]))
    _check_everywhere(e, {v[d]: sizes[d] for d in range(rank)})


def test_unbounded_or_symbolic_ranges_are_left_alone():
    s0 = sym("s0")
    e = ModularIndexing(v[0] + 8 * v[1], 1, 8)
    assert simplify_index(e, {v[0]: s0, v[1]: 4}) == e
    assert simplify_index(e, {v[0]: 8, v[1]: 4}) == v[0]


def test_group_norm_kernels_load_contiguously(tmp_path, monkeypatch):
    """GroupNorm + SiLU (a view to [N, G, C/G*H*W] for the statistics): every load of the
    input is affine in the loop vars (no per-element division), values equal eager."""
    import re

    import torch

    import ember
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))   # a cache hit dumps no C++
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.GroupNorm(4, 16), torch.nn.SiLU()).eval()
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():
        ref = m(x)
        out = ember.compile(m)(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    src = "".join(p.read_text() for p in (tmp_path / "debug").rglob("*kernels.cpp"))
    big = re.findall(r"\barg2\[([^\]]*)\]", src)
    assert big and all("/" not in i and "%" not in i for i in big), big


def test_product_of_index_variables_is_bounded():
    # crossvit's kernels index with a product of two loop variables: bounding `v0*v1` recursed
    # forever (as_coeff_Mul gives (1, v0*v1)) and codegen died with a RecursionError
    e = FloorDiv(v[0] * v[1] + v[2], 8)
    s = _check_everywhere(e, {v[0]: 3, v[1]: 2, v[2]: 2})
    assert s == 0
    _check_everywhere(ModularIndexing(v[0] * v[1] + 4 * v[2], 4, 3), {v[0]: 3, v[1]: 3, v[2]: 3})
