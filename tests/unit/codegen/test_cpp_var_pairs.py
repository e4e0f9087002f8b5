"""var_mean's two sums down long columns (BatchNorm statistics of channels-last activations):
accumulated in double (lower/rules.py `_var_mean_double`, docs/design/061), as accurate as
eager's double Welford, and BatchNorm training through it equal to eager (values, running
stats, gradients)."""
import copy

import pytest
import torch

import ember.backends.ember as ember_backend
from tests.unit.lower.helpers import compile_fn


def _capture_sources(monkeypatch):
    srcs = []
    orig = ember_backend.generate_tu

    def generate_tu(*args):
        out = orig(*args)
        srcs.append(out[0])
        return out
    monkeypatch.setattr(ember_backend, "generate_tu", generate_tu)
    return srcs


def _rel(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("data", ["offset", "trend", "constant"])
def test_nhwc_var_mean_one_pass_within_float_rounding(tmp_path, monkeypatch, data):
    """C = 67 (a 64-column block and a 3-column one), N*H*W = 6400. offset: mean 100, std
    0.01 (a one-pass sum of squares about 0 loses every digit); trend: per-row means that drift
    along H; constant: n equal values give exactly c and exactly 0."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    srcs = _capture_sources(monkeypatch)
    g = torch.Generator().manual_seed(0)
    n, c, h, w = 4, 67, 40, 40
    if data == "offset":
        x = 100 + 0.01 * torch.randn(n, c, h, w, generator=g)
    elif data == "trend":
        x = torch.linspace(-30, 30, h).view(1, 1, h, 1) + torch.randn(n, c, h, w, generator=g)
    else:
        x = torch.full((n, c, h, w), 0.3)
    x = x.contiguous(memory_format=torch.channels_last)

    def fn(x):
        return torch.var_mean(x, (0, 2, 3), correction=0)
    run, _ = compile_fn(fn, x)
    (v, m), (ve, me), (vr, mr) = run(x), fn(x), fn(x.double())
    assert any("double acc" in s for s in srcs), "the sums are not accumulated in double"
    if data == "constant":
        assert torch.equal(v, torch.zeros(c)) and torch.equal(m, torch.full((c,), 0.3))
        return
    # both rounded once from double sums: within eager's error (measured equal; the float
    # column sums were 2-3x eager's on the variance)
    assert _rel(v, vr) <= max(1.5 * _rel(ve, vr), 6e-8), (_rel(v, vr), _rel(ve, vr))
    assert _rel(m, mr) <= max(1.5 * _rel(me, mr), 6e-8), (_rel(m, mr), _rel(me, mr))


def test_nhwc_batchnorm_training_matches_eager(tmp_path, monkeypatch):
    """nn.BatchNorm2d(37) + ReLU in training on a channels-last input: output, running stats
    after 3 steps and the input, weight and bias gradients against eager."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    srcs = _capture_sources(monkeypatch)
    import ember
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.BatchNorm2d(37), torch.nn.ReLU())
    with torch.no_grad():
        m[0].weight.uniform_(0.5, 1.5)
        m[0].bias.uniform_(-0.5, 0.5)
    me = ember.compile(copy.deepcopy(m))
    x = (3 + 2 * torch.randn(2, 37, 48, 48)).contiguous(memory_format=torch.channels_last)
    wgt = torch.rand(2, 37, 48, 48)
    for _ in range(3):
        outs = []
        for mod in (m, me):
            xi = x.clone().requires_grad_()
            y = mod(xi)
            (y * wgt).sum().backward()
            outs.append((y, xi.grad))
        (y, gx), (ye, gxe) = outs
        torch.testing.assert_close(ye, y, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gxe, gx, atol=1e-5, rtol=1e-5)
    assert any("double acc" in s for s in srcs), "the statistics are not accumulated in double"
    for a, b in ((m[0].running_mean, me[0].running_mean), (m[0].running_var, me[0].running_var),
                 (m[0].weight.grad, me[0].weight.grad), (m[0].bias.grad, me[0].bias.grad)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
