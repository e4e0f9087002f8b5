"""CPU attention takes eager's fused (flash) kernel when eager would, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import trace_aten

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _masks():
    torch.manual_seed(0)
    return {
        "none": None,
        "float": torch.randn(2, 1, 16, 16),
        "bool": torch.rand(2, 1, 16, 16) > 0.3,
    }


@pytest.mark.parametrize("mask", ["none", "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_eager_and_uses_fused_kernel(mask, causal):
    m = _masks()[mask]
    if causal and m is not None:
        pytest.skip("sdpa takes either a mask or is_causal")
    torch.manual_seed(1)
    q, k, v = [torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3)]

    def f(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=causal) * 2

    gm = trace_aten(f, (q, k, v))
    assert any(n.target is FLASH for n in gm.graph.nodes), gm.code
    compiled = ember.compile(f, backend="ember", fullgraph=True)
    got, want = compiled(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    gg = torch.autograd.grad(got.sum(), [q, k, v])
    gw = torch.autograd.grad(want.sum(), [q, k, v])
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_sdpa_with_dropout_is_left_to_decompose():
    q = torch.randn(1, 2, 8, 4)
    gm = trace_aten(lambda a: F.scaled_dot_product_attention(a, a, a, dropout_p=0.5), (q,))
    assert not any(n.target is FLASH for n in gm.graph.nodes)
