"""Models through torch.compile(backend=ember.get_backend("ember")) (Dynamo capture + ember aot +
ember kernels), inference and training, compared with eager; kernel counts from ember.backends.ember.STATS."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends.ember import STATS


def _compile(model):
    torch._dynamo.reset()
    return torch.compile(model, backend=ember.get_backend("ember"))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64),
                                 nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return torch.log_softmax(self.net(x), -1)


def _train_steps(model, x, y, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.nll_loss(model(x), y) if y.dtype == torch.long else (
            (model(x) - y).pow(2).mean())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_mlp_inference():
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(16, 32)
    STATS.clear()
    with torch.no_grad():
        ref = m(x)
        got = _compile(m)(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert STATS and STATS[-1]["kernels"] >= 1 and not STATS[-1]["fallbacks"]


def test_mlp_training_matches_eager():
    torch.manual_seed(0)
    m = MLP()
    m2 = copy.deepcopy(m)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    ref = _train_steps(m, x, y)
    STATS.clear()
    got = _train_steps(_compile(m2), x, y)
    assert len(STATS) >= 2  # forward and backward graphs went through ember.lower
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=1e-5, rtol=1e-4)
    for p, q in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_layernorm_gelu_and_softmax_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(128)

        def forward(self, x):
            return torch.softmax(nn.functional.gelu(self.ln(x)), -1)
    torch.manual_seed(0)
    m = M().eval()
    x = torch.randn(64, 128)
    STATS.clear()
    with torch.no_grad():
        torch.testing.assert_close(_compile(m)(x), m(x), atol=1e-5, rtol=1e-4)
    assert STATS[-1]["kernels"] <= 2, STATS[-1]


def _resnet18():
    tv = pytest.importorskip("torchvision")
    return tv.models.resnet18(num_classes=10)


def test_resnet18_inference():
    torch.manual_seed(0)
    m = _resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    STATS.clear()
    with torch.no_grad():
        ref = m(x)
        got = _compile(m)(x)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert STATS[-1]["externs"] >= 20


@pytest.mark.slow
def test_resnet18_training():
    torch.manual_seed(0)
    m = _resnet18()
    m2 = copy.deepcopy(m)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    ref = _train_steps(m, x, y, steps=2)
    got = _train_steps(_compile(m2), x, y, steps=2)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=1e-3, rtol=1e-3)
    for (n, p), q in zip(m.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, atol=2e-3, rtol=2e-3, msg=n)
    for b1, b2 in zip(m.buffers(), m2.buffers()):
        torch.testing.assert_close(b1.float(), b2.float(), atol=1e-3, rtol=1e-3)


def test_mha_fast_path_without_weights():
    # eval nn.MultiheadAttention with need_weights=False runs _native_multi_head_attention, whose
    # meta kernel gives a tensor for the weights but which returns None at run time (torchvision
    # ViT fell back to aot_eager: 'NoneType' object has no attribute 'stride')
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 32)

    def f(t):
        return mha(t, t, t, need_weights=False)[0].relu()
    compiled = ember.compile(f, backend="ember", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), f(x), rtol=1e-5, atol=1e-5)


class HeadsAttention(nn.Module):
    """EdgeNeXt's cross-covariance attention (timm): q and k are unbound from a permuted qkv
    projection (views with gaps) and normalized, so the forward saves them for the backward."""

    def __init__(self, dim=48, heads=4):
        super().__init__()
        self.heads = heads
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        x = x.transpose(1, 2)           # channels-first input, as after EdgeNeXt's conv stem
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        attn = (nn.functional.normalize(q, dim=-1) @
                nn.functional.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        x = attn.softmax(dim=-1) @ v
        return self.proj(x.permute(0, 3, 1, 2).reshape(b, n, c))


def test_saved_views_with_gaps_keep_their_traced_layout():
    """A saved activation whose traced layout skips elements (one head of qkv) is stored with
    those strides, as the backward was traced with them (edgenext_xx_small training asserted
    'input changed size/stride' in the backward)."""
    torch.manual_seed(0)
    m = HeadsAttention()
    m2 = copy.deepcopy(m)
    x = torch.randn(8, 48, 64)
    m(x).sum().backward()
    ember.compile(m2, backend="ember")(x).sum().backward()
    for p, q in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4)


def test_conv_output_with_size_one_spatial_dims_into_backward():
    """A channels-last input to a conv whose output is 1x1: the CPU kernel returns strides
    (16, 1, 16, 16) where the meta says (16, 1, 1, 1); the backward takes it as saved and must
    accept it (strides of size-1 dims are not compared)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 4)
    w = nn.Parameter(torch.randn(1, 16, 1, 1))
    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    f = lambda t: (conv(t) * w).sum()  # noqa: E731
    f(x).backward()
    ref = [conv.weight.grad.clone(), w.grad.clone()]
    conv.weight.grad = w.grad = None
    ember.compile(f, backend="ember")(x).backward()
    torch.testing.assert_close(conv.weight.grad, ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, ref[1], rtol=1e-4, atol=1e-5)
