"""Fusion decisions, asserted as kernel counts (and checked against eager)."""
import torch
import torch.nn.functional as F

from lower.helpers import check, compile_fn


def test_pointwise_chain_is_one_kernel():
    x = torch.randn(64, 128)

    def chain(t):
        for _ in range(5):
            t = torch.sigmoid(t * 1.1 + 0.1)
        return t
    check(chain, x, kernels=1)


def test_layernorm_gelu_at_most_two_kernels():
    x = torch.randn(64, 256)
    w, b = torch.randn(256), torch.randn(256)
    check(lambda t, ww, bb: F.gelu(F.layer_norm(t, (256,), ww, bb)), x, w, b, max_kernels=2,
          atol=1e-4)


def test_softmax_one_or_two_kernels():
    x = torch.randn(32, 100)
    check(lambda t: torch.softmax(t, -1), x, max_kernels=2)
    check(lambda t: torch.log_softmax(t * 2, 1), x, max_kernels=2, atol=1e-5)


def test_softmax_over_dim0_is_correct():
    check(lambda t: torch.softmax(t, 0), torch.randn(30, 20), max_kernels=4)


def test_horizontal_fusion_shares_input():
    x = torch.randn(50, 60)
    check(lambda t: (t.exp(), t.sin(), t * 2), x, kernels=1)


def test_reduction_then_broadcast_epilogue():
    x = torch.randn(40, 70)
    check(lambda t: t - t.mean(1, keepdim=True), x, kernels=1)


def test_transposed_consumer_is_not_fused_wrongly():
    x = torch.randn(30, 40)

    def f(t):
        y = torch.exp(t) * 2
        return y + y.t().contiguous().t() * 0, (y @ y.t())
    check(f, x, atol=1e-3)


def test_no_fusion_option_gives_more_kernels():
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import STATS, compile_aten_graph
    x = torch.randn(8, 8)
    gm = trace_aten(lambda t: (t * 2 + 1).exp(), (x,), decompositions=get_decompositions())
    STATS.clear()
    fn = compile_aten_graph(gm, [x], options={"fusion": False})
    torch.testing.assert_close(fn(x)[0], (x * 2 + 1).exp())


def test_softmax_keeps_exp_row_in_scratch_not_memory():
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    x = torch.randn(16, 40)
    gm = trace_aten(lambda t: (torch.softmax(t, -1),), (x,), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x])
    assert fn.ember_wrapper.count("empty_strided") == 1   # only the output is allocated
    torch.testing.assert_close(fn(x)[0], torch.softmax(x, -1))


def test_reshape_of_pointwise_is_a_view_not_a_copy():
    # relu(x) reshaped for a matmul and also returned: the pointwise result is stored once and
    # the reshape is a view of it (was: one kernel for relu, one copy per reshape user)
    x, w = torch.randn(4, 8, 32), torch.randn(32, 16)

    def f(t, m):
        h = torch.relu(t * 2)
        flat = h.reshape(32, 32)
        return flat @ m, flat, h.permute(2, 0, 1)
    check(f, x, w, kernels=1)


def test_non_viewable_reshape_still_copies_correctly():
    # permute then reshape is not a view of the dense result: a copy kernel, values as eager
    x, w = torch.randn(4, 8, 32), torch.randn(32, 16)
    check(lambda t, m: (torch.relu(t).permute(1, 0, 2).reshape(32, 32) @ m,), x, w, max_kernels=2)


def test_row_statistics_stored_and_read_by_the_row_stage_one_kernel():
    # training LayerNorm stores its mean and rstd (pointwise values of the row index alone) and
    # normalizes with them: one kernel, the row read from memory once for the output (it was a
    # second kernel re-reading x: layernorm_last_768 train 0.74x eager)
    x = torch.randn(64, 768)
    w, b = torch.randn(768), torch.randn(768)
    aten = torch.ops.aten
    check(lambda t, ww, bb: aten.native_layer_norm.default(t, [768], ww, bb, 1e-5), x, w, b,
          kernels=1, atol=1e-5)

    def two_scales(t):     # two per-row values, each read by a later row stage
        m = t.mean(-1, keepdim=True)
        s = (t - m).abs().amax(-1, keepdim=True) + 1.0
        return m * 3.0, (t - m) / s, s
    check(two_scales, x, kernels=1)


def test_group_norm_contiguous_is_one_row_kernel():
    # each group of an NCHW input is one contiguous row: statistics and output in one kernel
    # that reads the row from memory once (the per-channel form took 3 kernels and 3 reads of x,
    # GroupNorm(32, 64) at 0.7x eager); the per-channel scale (a value over the group's channels
    # only) is read by the output stage that also loops over H*W
    x = torch.randn(4, 64, 20, 20)
    w, b = torch.randn(64), torch.randn(64)
    aten = torch.ops.aten
    check(lambda t, ww, bb: aten.native_group_norm.default(t, ww, bb, 4, 64, 400, 32, 1e-5),
          x, w, b, kernels=1, atol=1e-5)
    # (an activation after it reads the 4-d view of the output: a second kernel for now)
    check(lambda t, ww, bb: F.silu(F.group_norm(t, 8, ww, bb)), x, w, b, max_kernels=2, atol=1e-5)
    # channels-last and no affine: still equal to eager
    xc = x.contiguous(memory_format=torch.channels_last)
    check(lambda t, ww, bb: F.group_norm(t, 32, ww, bb), xc, w, b, atol=1e-5)
    check(lambda t: F.group_norm(t, 4), x, kernels=1, atol=1e-5)
