"""C++ codegen of a pointwise op on a view that reads a loop dim only as v // k and v % k (the
head-merging reshape after attention's batched matmul): the dim is split into (n/k, k) loops, so
the simd loop's indices are affine (cpp_loops.split_divided)."""
import re

import torch
import torch.nn.functional as F

from tests.unit.codegen.test_cpp_pairs import _simd_loops, _source
from tests.unit.lower.helpers import check, check_grads


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


#: a loop var divided in an index, also one offset by a segment's start: `((-40 + v1) % 16)`
DIVIDED = re.compile(r"v\d+\)? [/%] \d+\)")


def _padded_chunks(x, z):
    """A causal conv1d's input gradient in Mamba2's backward: [B, C, L] gathered from a chunked
    scan's [B, chunks, C, 64] (read as `l / 64`, `l % 64`), padded to L + 3 (the read is under
    `l < 128`, so the dim of 131 is no multiple of 64), times SiLU's derivative."""
    b, n, c, k = x.shape
    y = F.pad(x.permute(0, 2, 1, 3).reshape(b, c, n * k), (0, 3))
    s = torch.sigmoid(z)
    return y * s * (1 + z * (1 - s))


def test_padded_dim_split_within_its_segment():
    # the loop of 131 is cut at 128 where the pad's compare changes (cpp_ranges.segment); the
    # segment [0, 128) splits by 64 (design 048), so no simd loop divides its var
    x, z = torch.randn(2, 2, 48, 64), torch.randn(2, 48, 131)
    check(_padded_chunks, x, z, kernels=1)
    _, src = _source(_padded_chunks, x, z)
    assert not DIVIDED.search(src), src
    assert any(n == "64" for _, n in _simd_loops(src)), src


def _cat_of_divided_parts(a, b, g):
    """A cat along channels of a chunk-merged [B, C, 128] (`l / 64`, `l % 64`) and a repeat
    (read as `(c - 40) % 16` in its part), times a gate."""
    h = a.permute(0, 2, 1, 3).reshape(2, 40, 128)
    return torch.cat([h, b.repeat(1, 2, 1)], 1) * torch.sigmoid(g)


def test_channel_cat_parts_split_at_their_offsets():
    # within each part's segment of the channels every index is affine once split; values and
    # gradients equal eager's
    a, b, g = torch.randn(2, 2, 40, 64), torch.randn(2, 16, 128), torch.randn(2, 72, 128)
    check(_cat_of_divided_parts, a, b, g, kernels=1)
    _, src = _source(_cat_of_divided_parts, a, b, g)
    assert not DIVIDED.search(src), src
    check_grads(_cat_of_divided_parts, a, b, g)


def test_segment_of_one_element_is_no_loop():
    # a cat of one element and a permuted part (read as v / 4, v % 4): split at 1, the copy
    # over [0, 1) has no loop left; it is emitted once (it raised IndexError, and
    # hf_whisper's decoder fell back to eager on its position-id kernel)
    a, z = torch.randn(1), torch.randn(16, 4)
    check(lambda a, z: torch.cat([a, z.t().reshape(64)]) * 2, a, z, kernels=1)
