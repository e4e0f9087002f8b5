"""Tensors made from Python numbers only (`torch.div(h.size(1), 4, rounding_mode="trunc")`, HF
longformer's `_chunk`): a later use as an int (a view size, int(), range, a branch) reads the
value known at trace time; a use as a tensor keeps tensor semantics; symbolic sizes break."""
from __future__ import annotations

import pytest
import torch

import ember
from ember import capture

from .helpers import check, same


def chunk(h, k):
    n = torch.div(h.size(1), 4, rounding_mode="trunc")
    m = torch.floor_divide(h.size(1), 2)
    y = h.view(h.size(0), n, 4)
    z = h.reshape(-1, m)
    q = n * 2
    q.add_(1)                               # in place on a known value: followed
    r = torch.zeros(int(q)) + n             # int64 0-d + float32: float32, as eager
    s = torch.div(h.size(1), 3)             # true division: a float tensor
    i = int(n.item()) + len(range(n)) + (1 if n > 1 else 0) + float(s) + k
    return y.sum(-1) * i, z, r, n, q, s, h.new_full((n,), n)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sizes_from_torch_div_are_known_one_graph(backend):
    x = torch.randn(2, 8)
    c = ember.compile(chunk, backend=backend, fullgraph=True)
    for _ in range(2):
        same(chunk(x, 3), c(x, 3))
    assert capture.stats() == {"graphs": 1}, capture.stats()


def test_same_through_the_check_helper():
    check(chunk, torch.randn(2, 8), 3)          # values, dtypes, one graph, no recompile


def test_symbolic_size_quotient_stays_symbolic():
    def f(h):
        n = torch.div(h.size(1), 4, rounding_mode="trunc")
        m = torch.floor_divide(h.size(1), 2)
        return h.view(h.size(0), n, 4).sum(-1) * 2, h.reshape(m, -1), n + 1

    c = ember.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for s in (8, 12, 16):
        x = torch.randn(2, s)
        same(f(x), c(x))
    assert capture.stats() == {"graphs": 1}, capture.stats()


def test_other_symbolic_values_break_at_the_int_use():
    def f(h):
        n = torch.mul(h.size(1), 2)                 # not followed symbolically
        return h.new_zeros(n) + 1, h * 2

    c = ember.compile(f, backend="eager", dynamic=True)
    for s in (8, 12, 16):
        x = torch.randn(2, s)
        same(f(x), c(x))
    st = capture.stats()
    assert st.get("graph_breaks") == 1 and st.get("recompiles", 0) == 0, st
    with pytest.raises(ember.Unsupported, match="depends on tensor data"):
        ember.compile(f, backend="eager", dynamic=True, fullgraph=True)(torch.randn(2, 8))


def test_value_written_by_graph_data_is_forgotten():
    def f(h):
        n = torch.div(h.size(1), 4, rounding_mode="trunc")
        n.add_((h > 100).sum())             # data the trace cannot know
        return h.view(h.size(0), n, 4)

    with pytest.raises(ember.Unsupported, match="depends on tensor data"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.randn(2, 8))
    x = torch.randn(2, 8)
    torch.testing.assert_close(ember.compile(f, backend="eager")(x), f(x))


def test_random_values_are_not_known_and_the_trace_draws_nothing():
    def f(h):
        t = torch.div(4, 8)
        t.bernoulli_()                      # random: its value is not known at trace time
        return h * t, torch.rand(2)

    def g(h):
        t = torch.div(4, 8).bernoulli_()
        return h.view(int(t) + 1, -1)       # so an int use of it breaks the graph

    torch.manual_seed(0)
    a = f(torch.ones(3))
    c = ember.compile(f, backend="eager", fullgraph=True)
    torch.manual_seed(0)
    b = c(torch.ones(3))
    same(a, b)                               # the same draws: compiling drew nothing
    with pytest.raises(ember.Unsupported, match="int\\(\\) of a tensor"):
        ember.compile(g, backend="eager", fullgraph=True)(torch.ones(4))


def test_tensor_from_symbolic_numbers_is_not_a_constant_in_aot():
    # was: aot traced torch.div(s1, 4) with s1's example value baked in (1944445 for every size)
    def f(h):
        return torch.div(h.size(1), 4, rounding_mode="trunc") + 1, torch.mul(h.size(0), 3) * 1.0, \
            torch.div(h.size(1), 3)

    c = ember.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for s in (8, 12, 20):
        x = torch.randn(2, s)
        same(f(x), c(x))
    assert capture.stats() == {"graphs": 1}, capture.stats()


def rel_window(q, r):
    # DeBERTa's disentangled attention: att_span = torch.tensor(min(max(q_len, k_len), max_pos)),
    # then a slice of the relative embeddings with tensor bounds (eager reads __index__). The
    # tensor followed the meta device of the trace, its value was unknown: a graph break and the
    # rest of the layer loop ran eagerly
    span = torch.tensor(min(max(q.size(-2), q.size(-2)), 16))
    return r[16 - span: 16 + span, :].unsqueeze(0) * 2 + span, torch.as_tensor([1, 2]) + span


def test_slice_bounds_from_torch_tensor_of_numbers_one_graph():
    c = ember.compile(rel_window, backend="aot_eager", fullgraph=True)
    r = torch.randn(32, 4)
    for _ in range(2):
        same(rel_window(torch.randn(2, 5, 8), r), c(torch.randn(2, 5, 8), r))
    assert capture.stats() == {"graphs": 1}, capture.stats()


def test_slice_bounds_from_symbolic_sizes_stay_correct():
    c = ember.compile(rel_window, backend="aot_eager", dynamic=True)
    r = torch.randn(32, 4)
    for s in (5, 7, 9):
        q = torch.randn(2, s, 8)
        same(rel_window(q, r), c(q, r))
