"""Model suites for ember bench: factories only, all offline with random weights.

Each `ModelSpec` builds a fresh module and seeded example inputs. Sizes are picked so one eager
step is roughly 10-500 ms on 2 cores (images at 64x64, transformers at 2-4 layers and short
sequences). Dropout and stochastic depth are switched off so eager, ember and torch.compile
compute the same function in training too (their RNG streams differ by design).

Suites: torchvision, timm, hf (transformers from configs), synthetic; "test" holds models for
the harness's own tests (one raises, one kills its process) and is never part of "all".
"broad" (broad.py: ~70 models at realistic sizes, 224x224 images, sequences 128-512) is run by
name only, in parts with --family / --shard, and is not part of "all" either.
"""
from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from . import broad  # noqa: F401 - registers the broad suite
from .spec import REGISTRY, ModelSpec

SUITES = ("torchvision", "timm", "hf", "synthetic", "broad", "test", "test_hang")
HIDDEN = ("test", "test_hang")
NOT_IN_ALL = (*HIDDEN, "broad")


def _add(spec: ModelSpec) -> None:
    REGISTRY[spec.name] = spec


def _images(batch: int, size: int = 64):
    return lambda: (torch.randn(batch, 3, size, size),)


# ---------------------------------------------------------------------------------- torchvision
def _tv(name: str, batch: int, size: int = 64, quick: bool = False, **kw):
    def build():
        import torchvision
        return getattr(torchvision.models, name)(weights=None, num_classes=10, **kw)
    _add(ModelSpec(f"tv_{name}", "torchvision", build, _images(batch, size), quick=quick))


_tv("resnet18", 8, quick=True)
_tv("resnet50", 4)
_tv("mobilenet_v2", 8)
_tv("mobilenet_v3_small", 8)
_tv("efficientnet_b0", 4)
_tv("regnet_y_400mf", 8)
_tv("vit_b_16", 2, size=64, image_size=64)
_tv("convnext_tiny", 4)
_tv("resnext50_32x4d", 4)
_tv("densenet121", 4)


# ---------------------------------------------------------------------------------------- timm
def _timm(name: str, batch: int, size: int = 64, img_size: bool = False):
    def build():
        import timm
        kw = {"img_size": size} if img_size else {}
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    _add(ModelSpec(f"timm_{name}", "timm", build, _images(batch, size)))


_timm("resnet26d", 4)
_timm("mixnet_s", 4)
_timm("vit_tiny_patch16_224", 8, img_size=True)
_timm("deit_tiny_patch16_224", 8, img_size=True)
_timm("convnext_atto", 8)
_timm("mobilenetv3_small_100", 8)
_timm("regnetx_002", 8)
_timm("ghostnet_100", 8)
_timm("mixer_s16_224", 4, img_size=True)
_timm("poolformer_s12", 4)
_timm("levit_128s", 8, img_size=True)
_timm("edgenext_xx_small", 8)


# ---------------------------------------------------------------------------------- transformers
def _tokens(batch: int, seq: int, vocab: int = 1000, extra: dict | None = None):
    def make():
        return ()

    def kwargs():
        out = {"input_ids": torch.randint(0, vocab, (batch, seq)),
               "attention_mask": torch.ones(batch, seq, dtype=torch.long)}
        for key, fn in (extra or {}).items():
            out[key] = fn()
        return out
    return make, kwargs


def _hf(name: str, config_fn: Callable[[], object], model_cls: str, batch: int = 2, seq: int = 64,
        vocab: int = 1000, kwargs_fn: Callable[[], dict] | None = None):
    def build():
        import transformers
        return getattr(transformers, model_cls)(config_fn())
    if kwargs_fn is None:
        _, kwargs_fn = _tokens(batch, seq, vocab)
    _add(ModelSpec(f"hf_{name}", "hf", build, lambda: (), kwargs=kwargs_fn))


_SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
              vocab_size=1000, max_position_embeddings=256, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)


def _cfg(cls: str, **kw):
    def make():
        import transformers
        return getattr(transformers, cls)(**kw)
    return make


_hf("bert", _cfg("BertConfig", **_SMALL), "BertModel")
_hf("roberta", _cfg("RobertaConfig", **{**_SMALL, "pad_token_id": 1}), "RobertaModel")
_hf("distilbert", _cfg("DistilBertConfig", dim=256, n_layers=4, n_heads=4, hidden_dim=1024,
                       vocab_size=1000, max_position_embeddings=256, dropout=0.0,
                       attention_dropout=0.0), "DistilBertModel")
_hf("gpt2", _cfg("GPT2Config", n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=256,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                 eos_token_id=0), "GPT2Model")
_hf("llama", _cfg("LlamaConfig", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=688, vocab_size=1000,
                  max_position_embeddings=256, use_cache=False), "LlamaModel")
_hf("t5", _cfg("T5Config", d_model=256, d_kv=64, d_ff=1024, num_layers=3, num_decoder_layers=3,
               num_heads=4, vocab_size=1000, dropout_rate=0.0, use_cache=False), "T5Model",
    kwargs_fn=lambda: {"input_ids": torch.randint(0, 1000, (2, 64)),
                       "decoder_input_ids": torch.randint(0, 1000, (2, 32))})
_hf("bart", _cfg("BartConfig", d_model=256, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                 decoder_ffn_dim=1024, vocab_size=1000, max_position_embeddings=256, dropout=0.0,
                 attention_dropout=0.0, use_cache=False), "BartModel",
    kwargs_fn=lambda: {"input_ids": torch.randint(4, 1000, (2, 64)),
                       "decoder_input_ids": torch.randint(4, 1000, (2, 32))})
_hf("vit", _cfg("ViTConfig", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=1024, image_size=64, patch_size=8, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0), "ViTModel",
    kwargs_fn=lambda: {"pixel_values": torch.randn(4, 3, 64, 64)})
_hf("whisper_tiny", _cfg("WhisperConfig", d_model=192, encoder_layers=2, decoder_layers=2,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=768,
                         decoder_ffn_dim=768, vocab_size=1000, num_mel_bins=80,
                         max_source_positions=200, max_target_positions=64, dropout=0.0,
                         attention_dropout=0.0, use_cache=False, pad_token_id=0,
                         decoder_start_token_id=1, bos_token_id=1, eos_token_id=2),
    "WhisperModel",
    kwargs_fn=lambda: {"input_features": torch.randn(2, 80, 400),
                       "decoder_input_ids": torch.randint(3, 1000, (2, 32))})


# ------------------------------------------------------------------------------------ synthetic
class MLP(nn.Module):
    def __init__(self, d: int = 512, hidden: int = 2048, layers: int = 3):
        super().__init__()
        dims = [d] + [hidden] * layers + [d]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class GPTBlock(nn.Module):
    """nanoGPT's Block: pre-norm causal self-attention + GELU MLP."""

    def __init__(self, d: int = 384, heads: int = 6):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 384, layers: int = 2, seq: int = 128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(GPTBlock(d) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class ConvBlock(nn.Module):
    def __init__(self, c: int = 64, n: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.body = nn.Sequential(*[nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False),
                                                  nn.BatchNorm2d(c), nn.ReLU()) for _ in range(n)])
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


class LayerNormGELU(nn.Module):
    """The allocator-sensitive case from DESIGN §5: LayerNorm + GELU on a 16 MB activation."""

    def __init__(self, d: int = 1024):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return nn.functional.gelu(self.ln(x)) * torch.sigmoid(self.fc(x))


_add(ModelSpec("syn_mlp", "synthetic", MLP, lambda: (torch.randn(64, 512),), quick=True))
_add(ModelSpec("syn_nanogpt", "synthetic", NanoGPT,
               lambda: (torch.randint(0, 1000, (4, 128)),), quick=True))
_add(ModelSpec("syn_gpt_block", "synthetic", GPTBlock, lambda: (torch.randn(4, 128, 384),)))
_add(ModelSpec("syn_conv_block", "synthetic", ConvBlock, lambda: (torch.randn(8, 3, 32, 32),)))
_add(ModelSpec("syn_layernorm_gelu", "synthetic", LayerNormGELU,
               lambda: (torch.randn(4, 1024, 1024),)))


# ---------------------------------------------------------------------------- test-only models
class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        raise RuntimeError("deliberate failure from the test-only model\nsecond line")


class Crashes(nn.Module):
    """Kills its own process: the suite must record it and go on."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        import os
        os._exit(3)


class Hangs(nn.Module):
    """Never returns: the harness's timeout must end it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        import time
        while True:
            time.sleep(1)


# failing ones first, so the tests see the suite go on after them
_add(ModelSpec("test_raises", "test", Raises, lambda: (torch.randn(2, 4),)))
_add(ModelSpec("test_crashes", "test", Crashes, lambda: (torch.randn(2, 4),)))
_add(ModelSpec("test_tiny_mlp", "test", TinyMLP, lambda: (torch.randn(8, 16),)))
_add(ModelSpec("test_hangs", "test_hang", Hangs, lambda: (torch.randn(2, 4),)))


# --------------------------------------------------------------------------------- selection
def select(suite: str = "all", pattern: str | None = None, quick: bool = False,
           family: str | None = None, shard: str | None = None) -> list[ModelSpec]:
    """Models of `suite` ("all" = every suite but the hidden and broad ones) matching `pattern`.

    `family`: comma list of families (`ModelSpec.family`, e.g. "timm,tv_seg"); `shard` "K/N":
    every N-th model from the K-th (1-based) of the filtered list, so shards mix families.
    """
    if suite not in (*SUITES, "all"):
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}, all")
    specs = [s for s in REGISTRY.values()
             if (s.suite == suite or (suite == "all" and s.suite not in NOT_IN_ALL))]
    if quick:
        specs = [s for s in specs if s.quick] or specs[:3]
    if pattern:
        rx = re.compile(pattern)
        specs = [s for s in specs if rx.search(s.name)]
    if family:
        wanted = {f.strip() for f in family.split(",") if f.strip()}
        specs = [s for s in specs if s.family in wanted]
    if shard:
        k, n = parse_shard(shard)
        specs = specs[k - 1::n]
    return specs


def parse_shard(text: str) -> tuple[int, int]:
    """"K/N" -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard wants K/N (e.g. 2/8), got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text}: need 1 <= K <= N")
    return k, n


def quiet_randomness(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off, so every compiler computes the same function."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        name = type(m).__name__
        if "StochasticDepth" in name or "DropPath" in name:
            for attr in ("p", "drop_prob"):
                if isinstance(getattr(m, attr, None), float):
                    setattr(m, attr, 0.0)
    return model


def no_zero_weights(model: nn.Module) -> nn.Module:
    """Give all-zero weight matrices small random values.

    Some inits zero a layer (torchvision ViT's head, residual branches' last norms): the output
    is then a constant and comparing it says nothing about the layers before.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.normal_(0.0, 0.02)
    return model


def calibrate_batchnorm(model: nn.Module, args: tuple, kwargs: dict) -> nn.Module:
    """Set BatchNorm running stats to the example batch's statistics (one train-mode forward).

    With fresh stats (mean 0, var 1) and random weights, deep nets in eval mode collapse: an
    EfficientNet's logits come out ~1e-13 and any comparison of them is vacuous.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    saved = [(m, m.momentum) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None            # cumulative average: after one batch, exactly its stats
    was_training = model.training
    model.train()
    with torch.no_grad():
        model(*args, **kwargs)
    for m, momentum in saved:
        m.momentum = momentum
        m.num_batches_tracked.zero_()
    model.train(was_training)
    return model


def instantiate(spec: ModelSpec, seed: int = 0):
    """(model, args, kwargs) with weights and inputs from `seed`."""
    torch.manual_seed(seed)
    model = no_zero_weights(quiet_randomness(spec.build()))
    torch.manual_seed(seed + 1)
    args = spec.inputs()
    kwargs = spec.kwargs()
    calibrate_batchnorm(model, args, kwargs)
    return model, args, kwargs


def count() -> dict[str, int]:
    out: dict[str, int] = {}
    for s in REGISTRY.values():
        out[s.suite] = out.get(s.suite, 0) + 1
    return out
