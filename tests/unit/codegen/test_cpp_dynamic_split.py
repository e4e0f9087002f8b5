"""Dynamic shapes (#23, design 054): index division by size symbols.

A graph recompiled with symbolic sizes reads its views through `v // s` and `v % s`. The index
simplifier rewrites them with the symbolic loop ranges (checked by enumerating every point for
several values of the sizes), and a pointwise loop of `k*s` read as `v // s`, `v % s` is split
into (k, s) loops (the head merge ran at 0.17x eager with a division per element). End to end:
values against eager at sizes the compile never saw (1, 2, odd, prime, below the vector width),
one dynamic recompile and none per new size, and no division of a loop var in the kernels."""
from __future__ import annotations

import itertools
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

import ember
from ember.capture.entry import stats
from ember.loopir.index import FloorDiv, ModularIndexing, simplify_index, sym
from tests.unit.codegen.test_index_simplify import _value

v0, v1, v2, v3 = (sym(f"v{i}") for i in range(4))
s0, s1, s2, s3 = (sym(f"s{i}") for i in range(4))


def _check_for_sizes(e, ranges, sizes=(1, 2, 3, 5)):
    """simplify_index(e) with symbolic ranges equals e at every loop point, for every assignment
    of `sizes` to the size symbols; returns the simplified index."""
    s = simplify_index(e, ranges)
    syms = sorted((e.free_symbols | {x for n in ranges.values()
                                     for x in sympy.sympify(n).free_symbols}) - set(ranges),
                  key=str)
    for vals in itertools.product(sizes, repeat=len(syms)):
        at = dict(zip(syms, vals))
        rng = {x: int(_value(sympy.sympify(n), at)) for x, n in ranges.items()}
        for point in itertools.product(*(range(rng[x]) for x in ranges)):
            p = {**at, **dict(zip(ranges, point))}
            assert _value(s, p) == _value(e, p), (e, s, p)
    return s


def test_symbolic_divisors_simplify():
    # head merge [B*H, N, D] -> [B, N, H*D] with B*H, N, D all dynamic
    e = (s2 * ModularIndexing(v1 + v0 * s1, 1, s1) + s1 * s2 * FloorDiv(v2, s2)
         + 4 * s1 * s2 * FloorDiv(v1 + v0 * s1, s1) + ModularIndexing(v2, 1, s2))
    s = _check_for_sizes(sympy.expand(e), {v0: 2, v1: s1, v2: 4 * s2})
    assert s == 4 * s1 * s2 * v0 + s2 * v1 + s1 * s2 * FloorDiv(v2, s2) + \
        ModularIndexing(v2, 1, s2)
    # channel shuffle: a flat index over [C, H, W] divided by H*W, W and (C//4)*H*W
    x = v3 + v2 * s3 + v1 * s2 * s3
    e = (s3 * ModularIndexing(x, s3, s2) + s2 * s3 * FloorDiv(x, 4 * s2 * s3)
         + s2 * s3 * ModularIndexing(x, s2 * s3, 4) + ModularIndexing(x, 1, s3))
    s = _check_for_sizes(sympy.expand(e), {v1: s1, v2: s2, v3: s3}, sizes=(1, 2, 3))
    assert s == s2 * s3 * ModularIndexing(v1, 1, 4) + s2 * s3 * FloorDiv(v1, 4) + s3 * v2 + v3


def test_symbolic_divisor_not_provable_is_kept():
    # v1 ranges over s1 but is divided by s2: nothing is known, the atoms stay
    e = FloorDiv(v1, s2) + ModularIndexing(v1, 1, s2)
    assert _check_for_sizes(e, {v1: s1}) == e
    # (s1*v0 + v1) // s1 with v1 < s1 + 1 is not v0
    e = FloorDiv(v0 * s1 + v1, s1)
    assert _check_for_sizes(e, {v0: 3, v1: s1 + 1}).has(FloorDiv)


class HeadMerge(torch.nn.Module):
    """levit's head merge: [B*H, N, D] -> [B, N, H*D] + hardswish, heads = 4."""

    def forward(self, x):
        bh, n, d = x.shape
        return F.hardswish(x.view(bh // 4, 4, n, d).permute(0, 2, 1, 3).reshape(bh // 4, n, 4 * d))


class Shuffle(torch.nn.Module):
    def forward(self, x):
        b, c, h, w = x.shape
        return F.relu(x.view(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)) + 1.0


def _divided_vars(src) -> set:
    """Loop vars that appear in the left operand of a C++ `/` or `%`."""
    out = set()
    for m in re.finditer(r" [/%] ", src):
        i = m.start()
        if src[i - 1] == ")":
            depth, j = 0, i - 1
            while True:
                depth += {")": 1, "(": -1}.get(src[j], 0)
                if depth == 0:
                    break
                j -= 1
            operand = src[j:i]
        else:
            operand = re.search(r"\w+$", src[:i]).group()
        out |= set(re.findall(r"\bv\d+\b", operand))
    return out


def _kernels(root):
    return "\n".join(p.read_text() for p in sorted(root.rglob("05_kernels.cpp")))


def _dynamic_kernels(root):
    """The C++ of the one graph compiled with size parameters."""
    found = [p.read_text() for p in root.rglob("05_kernels.cpp") if "int64_t s0" in p.read_text()]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("model,shapes", [
    # compile at two shapes (every dim changes: one dynamic recompile), then unseen shapes:
    # sizes 2, odd and prime, D below the vector width (3, 5) and above it (C // 4 == 1 would
    # specialize, as size 1 does: a guard, a recompile)
    (HeadMerge, [(8, 16, 32), (12, 10, 16), (8, 7, 3), (16, 13, 5), (20, 2, 17), (8, 31, 64)]),
    (Shuffle, [(2, 16, 8, 8), (3, 8, 6, 6), (2, 12, 5, 7), (5, 8, 3, 2), (2, 20, 13, 11)]),
])
def test_dynamic_recompile_splits_and_matches_eager(model, shapes, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    m = ember.compile(model())
    for i, shape in enumerate(shapes):
        x = torch.randn(*shape)
        torch.testing.assert_close(m(x), model()(x), rtol=0, atol=0)
        if i == 1:
            after_two = stats().get("graphs", 0)
    assert after_two == 2                       # static, then one dynamic recompile
    assert stats().get("graphs", 0) == 2        # no recompile per new size
    src = _kernels(tmp_path / "debug")
    assert "int64_t s0" in src                  # the dynamic graph's kernel takes sizes
    # no kernel divides its simd loop's var (by a size symbol or anything else): the shuffle's
    # channel var is divided by 4 in an outer loop (C is not known to be a multiple of 4 there)
    simd = re.findall(r"#pragma omp simd\n\s*for \(int64_t (v\d+) = 0;", src)
    assert simd and not set(simd) & _divided_vars(src), src
    ember.reset()


def test_dynamic_head_merge_simd_loop_over_d(tmp_path, monkeypatch):
    """The split loop nest of the dynamic head merge: the simd loop runs over D (a size
    parameter), its load and store contiguous, and the heads are a loop of 4."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    m = ember.compile(HeadMerge())
    for shape in [(8, 16, 32), (12, 10, 16)]:
        m(torch.randn(*shape))
    src = _dynamic_kernels(tmp_path / "debug")
    simd = re.findall(r"#pragma omp simd\n\s*for \(int64_t (v\d+) = 0; \1 < (\w+);", src)
    assert len(simd) == 1 and re.fullmatch(r"s\d+", simd[0][1]), src
    assert re.search(r"for \(int64_t v\d+ = 0; v\d+ < 4;", src), src
    ember.reset()


def test_dynamic_softmax_row_in_scratch(tmp_path, monkeypatch):
    """A symbolic row length keeps softmax's exp row in the kernel (in the output row it is
    divided into), as the static kernel does: no [.., s0, s1] intermediate buffer through
    memory (the dynamic kernel ran at 0.58x the static one). Values at unseen lengths 2, 3, 7
    (below the vector width), 17, 97 (prime)."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()

    def f(x):
        return torch.softmax(x * 0.125, dim=-1)
    m = ember.compile(f)
    for t in (16, 24, 2, 3, 7, 17, 97):
        x = torch.randn(2, 3, t, t)
        torch.testing.assert_close(m(x), f(x), rtol=1e-5, atol=1e-6)
    assert stats().get("graphs", 0) == 2
    src = _dynamic_kernels(tmp_path / "debug")
    sig = re.search(r"void kernel0\(([^)]*)\)", src).group(1)
    assert sig.count("float*") == 2 and "_row = " in src, sig    # input and output only
    ember.reset()


def test_invariant_load_hoisted_before_symbolic_simd_loop(tmp_path, monkeypatch):
    """A per-row load (w[c]) is read once before a simd loop of a symbolic trip count, as before
    a static one: a size product is >= 2 (sizes 0 and 1 specialize), so the loop surely runs."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()

    def f(x, w):
        return torch.where(x > w[:, None], torch.exp(x - w[:, None]), x * 0.5)
    m = ember.compile(f)
    w = torch.randn(16)
    for t in (40, 48, 2, 5, 97):
        x = torch.randn(3, 16, t)
        torch.testing.assert_close(m(x, w), f(x, w))
    assert stats().get("graphs", 0) == 2
    src = _dynamic_kernels(tmp_path / "debug")
    assert re.search(r"float tmp\d+ = arg1\[v\d+\];\n\s*#pragma omp simd\n\s*for \(int64_t v\d+ = 0; "
                     r"v\d+ < s\d+;", src), src
    ember.reset()
