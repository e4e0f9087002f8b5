"""Programs the slow fuzz batch found failing under the ember backend, kept as regressions."""
from __future__ import annotations

import pytest
import torch

import ember

from .test_fuzz import _check


@pytest.mark.parametrize("seed", [432, 1040])
def test_recomputed_value_compared_with_eq_matches_forward_bits(seed):
    # amax's backward compares the saved max with the input recomputed in the backward kernel;
    # g++ contracted x*y - m into an FMA there but not in the forward (where x*y was stored
    # first), so the bits differed, eq was false and a whole row's gradient came back 0.
    # Kernels are built with -ffp-contract=off (op-by-op rounding, as eager).
    _check([seed], "ember")


@pytest.mark.parametrize("seed", [782, 1279])
def test_saved_activation_keeps_its_traced_layout(seed):
    # a forward value realized contiguous for an in-graph user was also saved for backward,
    # which was compiled for the meta (input-following) layout: "input changed size/stride"
    _check([seed], "ember")


def test_saved_mask_of_permuted_input_minimized():
    x = torch.rand(3, 3, 8, 5).permute(3, 2, 1, 0).detach().requires_grad_(True)

    def f(t):
        return -t.amax(3, keepdim=True)
    compiled = torch.compile(f, backend=ember.get_backend("ember"), fullgraph=True)
    got, want = compiled(x), f(x)
    assert got.stride() == want.stride()
    g, = torch.autograd.grad(got, [x], [torch.ones_like(got)])
    w, = torch.autograd.grad(want, [x], [torch.ones_like(want)])
    torch.testing.assert_close(g, w)
