"""A transposed view of a computed value feeds bmm/mm as a strided operand, not a copy.

`q @ torch.cat([cache, new], 2).transpose(-1, -2)` (a KV-cache append, then the scores)
decomposes to cat -> permute -> expand (to its own size) -> view -> bmm. The cat is stored once
in its own layout and bmm reads it through transposed strides (MKL takes either layout of B);
before, the identity expand ended the view chain and the cat was written transposed, one
element at a time (0.3-0.5x eager). Values exact against eager (fp32, the same GEMM)."""
import re

import pytest
import torch

import ember
from ember.capture.entry import stats as capture_stats

from ember.aot import trace_aten
from ember.backends.ember import compile_aten_graph
from ember.decomp import get_decompositions


def kv_scores(cache, new, q):
    k = torch.cat([cache, new], dim=2)
    return (q @ k.transpose(-1, -2)).softmax(-1)


def inputs(t, heads=8, d=64):
    g = torch.Generator().manual_seed(t)
    return (torch.randn(1, heads, t, d, generator=g), torch.randn(1, heads, 1, d, generator=g),
            torch.randn(1, heads, 1, d, generator=g))


def test_cat_then_transpose_is_a_strided_bmm_operand():
    args = inputs(128)
    run = compile_aten_graph(trace_aten(kv_scores, args, decompositions=get_decompositions()),
                             list(args))
    torch.testing.assert_close(run(*args)[0], kv_scores(*args), atol=1e-6, rtol=1e-6)
    bmm = next(line for line in run.ember_wrapper.splitlines() if "torch.bmm(" in line)
    # the cat's buffer [1, 8, 129, 64] read as [8, 64, 129] with strides (8256, 1, 64)
    assert re.search(r"\(8, 64, 129\), \(8256, 1, 64\)", bmm), bmm
    assert run.ember_stats["kernels"] == 2 and run.ember_stats["externs"] == 1


@pytest.mark.parametrize("first", [(128, 160)])
def test_dynamic_kv_cache_scores_at_unseen_lengths(first):
    ember.reset()
    f = ember.compile(kv_scores)
    for t in first:
        torch.testing.assert_close(f(*inputs(t)), kv_scores(*inputs(t)), atol=1e-6, rtol=1e-6)
    n = capture_stats().get("graphs", 0)
    for t in (97, 192, 33, 2):
        torch.testing.assert_close(f(*inputs(t)), kv_scores(*inputs(t)), atol=1e-6, rtol=1e-6)
    assert capture_stats().get("graphs", 0) == n
    ember.reset()
