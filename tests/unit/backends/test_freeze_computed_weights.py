"""Freezing weights computed from constants only (freeze.py plan, docs/design/092): a weight
norm (the parametrizations API, the old `nn.utils.weight_norm` hook) or a user function of
parameters is folded once, then BatchNorm-folded and prepacked like a parameter; values
within 1e-5 (relative to the largest |eager|) of eager's, and a constant returned by the graph
is the caller's own copy."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")


def count(name):
    return ember.stats()["counts"].get(name, 0)


def close(out, ref, rel=1e-5):
    err = (out - ref).abs().max() / ref.abs().max()
    assert err <= rel, float(err)


class UserNorm(nn.Module):
    """A conv1d whose weight the forward computes: g * v / ||v|| over dims 0, 1 (weight_norm
    with dim=2, written by hand)."""

    def __init__(self, c, k, groups):
        super().__init__()
        self.v = nn.Parameter(torch.randn(c, c // groups, k))
        self.g = nn.Parameter(torch.rand(1, 1, k) + 0.5)
        self.bias = nn.Parameter(torch.randn(c))
        self.groups, self.pad = groups, k // 2

    def forward(self, x):
        w = self.g * self.v / self.v.norm(dim=(0, 1), keepdim=True)
        return F.conv1d(x, w, self.bias, padding=self.pad, groups=self.groups)


def positional_conv(form, c=32, k=16, groups=4):
    """wav2vec2's positional conv in small: grouped, weight-normed over dim 2."""
    if form == "user":
        return UserNorm(c, k, groups)
    conv = nn.Conv1d(c, c, k, padding=k // 2, groups=groups)
    if form == "parametrizations":
        return nn.utils.parametrizations.weight_norm(conv, dim=2)
    return nn.utils.weight_norm(conv, dim=2)


class Pos(nn.Module):
    """The positional conv on a transposed [N, L, C] input, one position sliced off, GELU."""

    def __init__(self, form):
        super().__init__()
        self.pos = positional_conv(form)

    def forward(self, h):
        return h + F.gelu(self.pos(h.transpose(1, 2))[:, :, :-1]).transpose(1, 2)


def pair(form, trained=False):
    """(compiled, its module, eager reference); weights that do not require grad unless
    `trained` (a change to trained weights unfreezes the graph: freeze.py)."""
    torch.manual_seed(0)
    ref = Pos(form).eval()
    torch.manual_seed(0)
    m = Pos(form).eval().requires_grad_(trained)
    m.load_state_dict(ref.state_dict())
    return ember.compile(m), m, ref


FORMS = ["parametrizations", "hook", "user"]


def _scale_g(m):
    """The weight norm's magnitude g, multiplied in place by 1.5."""
    p = m.pos
    g = p.g if isinstance(p, UserNorm) else p.parametrizations.weight.original0 \
        if hasattr(p, "parametrizations") else p.weight_g
    g.mul_(1.5)


@pytest.mark.parametrize("form", FORMS)
def test_weight_norm_is_folded_and_prepacked(form):
    """Each form: one graph, no break, the computed weight prepacked for oneDNN (on main it
    was reordered on every call); a change of g afterwards refolds and repacks it."""
    c, m, ref = pair(form)
    x = torch.randn(2, 60, 32)
    with torch.no_grad():
        for _ in range(2):
            close(c(x), ref(x))
        assert count("frozen_graphs") == 1 and count("prepacked_convs") == 1
        assert count("graphs") == 1 and count("graph_breaks") == 0
        _scale_g(m)
        _scale_g(ref)
        close(c(x), ref(x))
    assert count("refolds") == 1 and count("graphs") == 1


def test_weight_norm_hook_sets_the_modules_weight_as_eager():
    """The old hook sets `module.weight` to the computed weight on each call: after a compiled
    call it holds eager's values, and a write into it (or into an output computed from
    constants only) changes no later answer (eager computes a fresh one on each call)."""
    c, m, ref = pair("hook")
    x = torch.randn(2, 60, 32)
    with torch.no_grad():
        for _ in range(3):
            close(c(x), ref(x))
            close(m.pos.weight, ref.pos.weight)
            m.pos.weight.add_(1)
            ref.pos.weight.add_(1)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.s = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)

    def forward(self, x):
        return self.conv(x), self.s * 2


def test_output_computed_from_constants_is_a_fresh_tensor():
    """A frozen graph's output computed from constants only is a copy: the caller writing into
    it does not change the folded constant the next call returns (main returned the folded
    tensor itself: the second call answered s * 2 + 1)."""
    torch.manual_seed(0)
    ref = Scaled().eval()
    c = ember.compile(copy.deepcopy(ref))
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        for _ in range(3):
            out, want = c(x), ref(x)
            for o, w in zip(out, want):
                close(o, w)
            out[1].add_(1)
    assert count("frozen_graphs") == 1


class NormedConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.utils.parametrizations.weight_norm(nn.Conv2d(8, 16, 3, padding=1))
        self.bn1 = nn.BatchNorm2d(16)
        self.c2 = nn.utils.parametrizations.weight_norm(nn.Conv2d(16, 16, 3, padding=1))
        self.bn2 = nn.BatchNorm2d(16)

    def forward(self, x):
        y = F.relu(self.bn1(self.c1(x)))
        return F.relu(self.bn2(self.c2(y)) + y).mean((2, 3))


def test_batchnorm_folds_into_a_weight_normed_conv():
    """A BatchNorm after a conv whose weight is computed from constants folds into it (main:
    its weight was no constant when BatchNorm folding ran, and the BatchNorm stayed)."""
    torch.manual_seed(0)
    ref = NormedConvBN().eval()
    for bn in (ref.bn1, ref.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    c = ember.compile(copy.deepcopy(ref).requires_grad_(False))
    x = torch.randn(2, 8, 24, 24)
    with torch.no_grad():
        for _ in range(2):
            close(c(x), ref(x))
    assert count("frozen_graphs") == 1 and count("prepacked_convs") == 2
    assert count("batchnorms_as_affine") == 0


def test_weight_norm_hook_trains_as_eager():
    """With grad enabled the hook form is traced into the training graph: loss, the
    gradients of g, v and the bias, and the weight it sets equal eager's (1e-5)."""
    c, m, ref = pair("hook", trained=True)
    m.train(), ref.train()
    x = torch.randn(2, 60, 32)
    for mod in (c, ref):
        mod(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        close(p.grad, q.grad)
    close(m.pos.weight, ref.pos.weight)
    assert count("graphs") == 1 and count("graph_breaks") == 0 and count("frozen_graphs") == 0
