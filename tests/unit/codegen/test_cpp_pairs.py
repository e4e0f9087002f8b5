"""C++ codegen of (..., 2) pairs (complex values as real pairs, decomp/complex.py): the pair dim
is unrolled and a flattened view of pairs is split back, so the simd loop has affine indices."""
import re

import torch

from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from tests.unit.lower.helpers import check


def _source(fn, *args):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run())
    return plan, generate_tu(plan.kernels, plan.deps, plan.buffers)[0]


def _simd_loops(src):
    return re.findall(r"#pragma omp[^\n]*simd[^\n]*\n\s*for \(int64_t (v\d+) = 0; \1 < (\d+);", src)


def _rotate_pairs(x, c):
    """GPT-J / LLaMA-style rotation written on real pairs, flattened and cast back."""
    y = x.float().view(*x.shape[:-1], -1, 2)
    re_ = y[..., 0] * c[..., 0] - y[..., 1] * c[..., 1]
    im_ = y[..., 0] * c[..., 1] + y[..., 1] * c[..., 0]
    return torch.stack([re_, im_], -1).flatten(-2).to(x.dtype)


def test_pair_dim_unrolled_and_flattened_view_split():
    x, c = torch.randn(4, 6, 64, dtype=torch.bfloat16), torch.randn(6, 32, 2)
    check(_rotate_pairs, x, c, atol=1e-2, rtol=1e-2, kernels=1)
    plan, src = _source(_rotate_pairs, x, c)
    loops = _simd_loops(src)
    assert loops and all(int(n) > 2 for _, n in loops), src
    body = src[src.index("#pragma omp simd"):]
    assert "/ 2)" not in body and "% 2)" not in body, src


def test_odd_or_unsplittable_dims_keep_their_loops():
    # a flattened view of triples and pairs of it: values equal eager
    x = torch.randn(4, 30)
    check(lambda x: torch.stack([x.view(4, 10, 3)[..., 0] * 2, x.view(4, 10, 3)[..., 1]], -1)
          .flatten(-2) + 1, x)


def test_flattened_pairs_of_an_empty_dim():
    # the view's index is a ModularIndexing by a size-0 extent (index simplification divided
    # by it: ZeroDivisionError inside ember)
    x = torch.randn(1, 0, 3, 2)
    check(lambda x: torch.stack([x[..., 0] * 2, x[..., 1]], -1).flatten(-2) + 1, x)


def test_padded_pairs_values():
    """constant_pad_nd of (..., 2) pairs: the unrolled pair's masked loads were emitted as
    `if (mask)` loads under `omp simd`, which g++ 12 miscompiled (valid elements came out 0):
    a silent wrong value. Their mask is now applied branch-free."""
    x = torch.arange(18.).view(1, 3, 3, 2)
    check(lambda x: torch.constant_pad_nd(x, [0, 0, 2, 2], 0.0) * 1, x)
    z = torch.randn(1, 3, 3, dtype=torch.complex64)
    check(lambda z: torch.nn.functional.pad(z, (2, 2)) * 2, z)


def test_masked_if_loses_the_simd_pragma():
    from ember.codegen.cpp import _drop_simd_over_masked_ifs
    lines = ["x", "#pragma omp simd", "for (...)", "{", "if (tmp3) {", "}", "}"]
    _drop_simd_over_masked_ifs(lines, 1)
    assert not any("simd" in line for line in lines)
    lines = ["#pragma omp parallel for simd", "for (...)", "{", "a = b;", "}"]
    _drop_simd_over_masked_ifs(lines, 0)
    assert lines[0] == "#pragma omp parallel for simd"
    # a staged loop (cpp_loops.stage_chunks): the chunk loop keeps its parallel for, the simd
    # loop loses simd and simdlen
    lines = ["#pragma omp parallel for if(s0 >= 32768)", "for (...)", "{", "#pragma omp simd simdlen(16)",
             "for (...)", "{", "if (tmp3) {", "}", "}", "}"]
    _drop_simd_over_masked_ifs(lines, 0)
    assert lines[0] == "#pragma omp parallel for if(s0 >= 32768)" and lines[3] == ""
