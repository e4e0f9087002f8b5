"""Real models through ember capture (fullgraph=True, backend="eager"): exactly one graph,
outputs equal to eager for inference, and a training step with equal gradients."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember import capture


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def check_model(model, *inputs, train=True, rtol=1e-4, atol=1e-5, **kwargs):
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    ember.compile(model, backend="eager", fullgraph=True)
    # training step
    if train:
        model.train()
        ref.train()
        torch.manual_seed(1)
        out = _first(model(*inputs, **kwargs))
        torch.manual_seed(1)
        exp = _first(ref(*inputs, **kwargs))
        torch.testing.assert_close(out, exp, rtol=rtol, atol=atol)
        out.float().pow(2).mean().backward()
        exp.float().pow(2).mean().backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            if q.grad is None:
                assert p.grad is None, n
                continue
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=n)
        for b, c in zip(model.buffers(), ref.buffers()):
            torch.testing.assert_close(b, c)
        assert capture.stats().get("graphs") == 1, capture.stats()
    # inference
    model.eval()
    ref.eval()
    with torch.no_grad():
        for _ in range(2):
            out = _first(model(*inputs, **kwargs))
            exp = _first(ref(*inputs, **kwargs))
            torch.testing.assert_close(out, exp, rtol=rtol, atol=atol)
    st = capture.stats()
    assert st.get("fallbacks", 0) == 0, st
    # train + eval(no_grad): one graph each, nothing more
    assert st.get("graphs") == (2 if train else 1), st
    return model


def test_resnet18():
    torchvision = pytest.importorskip("torchvision")
    check_model(torchvision.models.resnet18(num_classes=10), torch.randn(2, 3, 32, 32))


def test_vit_small():
    torchvision = pytest.importorskip("torchvision")
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                             num_heads=2, hidden_dim=32, mlp_dim=64)
    check_model(m, torch.randn(2, 3, 32, 32))


@pytest.mark.slow
def test_mobilenet_v3_small():
    torchvision = pytest.importorskip("torchvision")
    check_model(torchvision.models.mobilenet_v3_small(num_classes=10), torch.randn(2, 3, 64, 64))


@pytest.mark.slow
def test_vit_b_16():
    torchvision = pytest.importorskip("torchvision")
    check_model(torchvision.models.vit_b_16(image_size=64), torch.randn(1, 3, 64, 64),
                rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_timm_convnext_atto():
    timm = pytest.importorskip("timm")
    check_model(timm.create_model("convnext_atto", pretrained=False, num_classes=10),
                torch.randn(2, 3, 64, 64))


def test_hf_bert_small():
    tf = pytest.importorskip("transformers")
    cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    check_model(tf.BertModel(cfg), ids, attention_mask=mask)


def test_hf_gpt2_small():
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 100, (2, 16))
    check_model(tf.GPT2LMHeadModel(cfg), ids)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd),
                                      c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=nn.GELU(approximate="tanh")))

    def forward(self, x):
        m = self.mlp
        mlpf = lambda t: m.c_proj(m.act(m.c_fc(t)))  # noqa: E731
        x = x + self.attn(self.ln_1(x))
        x = x + mlpf(self.ln_2(x))
        return x


def test_nanogpt_block():
    check_model(Block(), torch.randn(2, 16, 32))


def _bench_specs():
    try:
        from ember.bench import suites
        return [s.name for s in suites.select("all")]
    except Exception:  # noqa: BLE001 - the bench package is optional here
        return []


@pytest.mark.slow
@pytest.mark.parametrize("name", _bench_specs())
def test_bench_suite_model_is_one_graph(name):
    from ember.bench import suites
    model, args, kwargs = suites.instantiate(suites.REGISTRY[name])
    model.eval()
    with torch.no_grad():
        exp = _first(model(*args, **kwargs))
        ember.compile(model, backend="eager", fullgraph=True)
        got = _first(model(*args, **kwargs))
    torch.testing.assert_close(got, exp, rtol=1e-3, atol=1e-4)
    assert capture.stats().get("graphs") == 1 and capture.stats().get("fallbacks", 0) == 0


def test_hf_model_output_rebuilt_like_eager():
    tf = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def f(x):
        return BaseModelOutputWithPooling(last_hidden_state=x * 2, pooler_output=x.sum(0))
    x = torch.randn(3, 4)
    got = ember.compile(f, backend="eager", fullgraph=True)(x)
    exp = f(x)
    assert type(got) is type(exp) and list(got.keys()) == list(exp.keys())
    assert got.hidden_states is None and got[1].shape == exp[1].shape
    assert vars(got).keys() == vars(exp).keys()
    torch.testing.assert_close(got.last_hidden_state, exp.last_hidden_state)
    torch.testing.assert_close(got.to_tuple()[1], exp.to_tuple()[1])
