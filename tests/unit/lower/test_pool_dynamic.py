"""max_pool2d at a dynamic spatial size: a recompile at a second size makes H and W symbols,
and whether the last window reaches past the plane is then open; the lowering checks that
bound instead of asking sympy for a truth value (it used to fall back to eager with
"cannot determine truth value of Relational 2*floor(s0/2) - 2 >= s0")."""
import copy

import pytest
import torch

import ember
from ember.capture.entry import stats as capture_stats


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_conv_maxpool_over_sizes_compiles_and_matches(train, ceil_mode):
    # a ResNet stem (stride-2 conv, ReLU, 3x3/2 pool with padding 1) at 3 sizes, odd and even
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, stride=2, padding=3), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(3, 2, 1, ceil_mode=ceil_mode)).train(train)
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    for s in (56, 40, 45):
        x = torch.randn(2, 3, s, s)
        xc, xe = x.clone().requires_grad_(train), x.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            out, want = c(xc), ref(xe)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        if train:
            out.pow(2).sum().backward()
            want.pow(2).sum().backward()
            torch.testing.assert_close(xc.grad, xe.grad, atol=1e-4, rtol=1e-5)
            for p, q in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-5)
    # compiled twice (static, then dynamic), no eager fallback (EMBER_STRICT=1 would raise)
    assert capture_stats().get("graphs", 0) == 2
