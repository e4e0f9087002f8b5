"""C++ codegen of a pointwise op on a view that reads a loop dim only as v // k and v % k (the
head-merging reshape after attention's batched matmul): the dim is split into (n/k, k) loops, so
the simd loop's indices are affine (cpp_loops.split_divided)."""
import re

import torch
import torch.nn.functional as F

from tests.unit.codegen.test_cpp_pairs import _simd_loops, _source
from tests.unit.lower.helpers import check


def _merge_heads(q, k, v):
    """levit's attention tail: [B*H, N, D] bmm output -> [B, N, H*D] -> hardswish."""
    b, h, n, d = 2, 4, 49, 32
    x = torch.bmm(q.softmax(-1), v.view(b * h, n, d) + k).view(b, h, n, d)
    return F.hardswish(x.permute(0, 2, 1, 3).reshape(b, n, h * d))


def test_head_merge_view_split_values_and_affine_simd_index():
    q, v = torch.randn(8, 49, 49), torch.randn(2, 4, 49, 32)
    k = torch.randn(8, 49, 32)
    check(_merge_heads, q, k, v, atol=1e-4, rtol=1e-4)
    _, src = _source(_merge_heads, q, k, v)
    # no kernel divides a loop var; the hardswish kernel's simd loop runs over the head dim D
    # (32), not over H*D = 128 with `(v / 32)` and `(v % 32)` in its load
    assert not re.search(r"\(v\d+ [/%] \d+\)", src), src
    assert any(n == "32" for _, n in _simd_loops(src)), src


def test_other_divisors_values():
    # a flattened view of triples (k = 3) and a [.., 4, 7] permute flattened (k = 7): split,
    # values equal eager
    x = torch.randn(4, 30)
    check(lambda x: torch.stack([x.view(4, 10, 3)[..., 0] * 2, x.view(4, 10, 3)[..., 2]], -1)
          .flatten(-2) + 1, x)
    y = torch.randn(3, 7, 4)
    check(lambda y: y.permute(0, 2, 1).reshape(3, 28).sigmoid(), y)


def _window_mask(m):
    """torchvision swin's shifted-window attention mask from its [H, W] region ids: windows and
    both in-window positions are each read through a // 7 and a % 7."""
    w = m.view(4, 7, 4, 7).permute(0, 2, 1, 3).reshape(16, 49)
    a = w.unsqueeze(1) - w.unsqueeze(2)
    return a.masked_fill(a != 0, -100.0).masked_fill(a == 0, 0.0)


def test_every_divided_dim_is_split():
    m = torch.randint(0, 9, (28, 28)).float()
    check(_window_mask, m, kernels=1)
    _, src = _source(_window_mask, m)
    assert not re.search(r"\(v\d+ [/%] \d+\)", src), src


def test_small_divisor_unrolled_simd_over_the_long_dim():
    # [B, 3, M] permuted and flattened to [B, M*3]: split by 3, the dim of 3 unrolled, so the
    # simd loop runs over M (a simd loop of 3 lanes ran at 0.28x eager, with the split 2.1x)
    x = torch.randn(2, 3, 64)

    def f(x):
        return x.permute(0, 2, 1).reshape(2, 192).sigmoid()
    check(f, x, kernels=1)
    _, src = _source(f, x)
    assert not re.search(r"\(v\d+ [/%] \d+\)", src), src
    assert [n for _, n in _simd_loops(src)] == ["64"], src
