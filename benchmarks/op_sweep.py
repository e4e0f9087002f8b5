"""Op-pattern sweep (#23 item 2): common layer/op patterns at realistic sizes, eager vs ember vs
torch.compile (Inductor), inference (no_grad) and forward+backward, side by side in one process.

    python benchmarks/op_sweep.py [--mode infer|train|both] [--only REGEX] [--rounds 7]
                                  [--no-torch] [--json out.jsonl] [--scale 1.0] [--threads 2]

Each pattern is a small nn.Module (parameters included) built three times from one seed: eager,
`ember.compile(m)` (our capture and backend) and `torch.compile(m)`. Per mode:
  1. first call of each compiler = cold compile (caches start empty: a temporary dir); the
     reported compile seconds are first call minus the median steady call;
  2. correctness against eager fp32: every output (infer) and every output + input/parameter
     gradient (train) must have max|err| <= TOL[mode] * max|eager| per tensor (integer outputs:
     exactly equal); ember's counters must show no fallback to eager. In training a pattern with
     a kinked activation (ReLU, ...) may exceed that by its kink allowance (ember.bench.kinks, as
     `ember bench` checks): where a pre-activation lies within rounding of the kink, ember's and
     eager's fp32 may put it on either side and move every gradient upstream by a whole element;
     the allowance is how far the fp64 gradients move when each kinked input is shifted by 10x
     eager-fp32's error there. It is measured only for rows over TOL and shown in the row;
  3. paired timing: `--rounds` rounds, each calling eager, ember, inductor `reps` times (reps so a
     round of eager takes ~40 ms), order reversed every other round; medians per compiler and the
     per-round ratios' median and quartiles (the spread).
Speed ratios are "x as fast": ember_vs_eager = eager ms / ember ms (0.5x = twice as slow).
Training calls backward with a fixed random gradient per output (no loss ops in the timing) and
sets every leaf's .grad to None first. The summary lists every pattern below 0.95x and 0.9x eager.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import re
import statistics
import sys
import time
import traceback
import warnings

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.backends import speed  # noqa: E402
from ember.bench import harness, hygiene, kinks  # noqa: E402

TOL = {"infer": 2e-4, "train": 1e-3}   # max |err| / max |eager| per tensor


# ------------------------------------------------------------------------------------ patterns
@dataclasses.dataclass
class Case:
    """fn(m, *inputs) with m holding `params` (nn.Parameter) and `mods` (submodules); inputs in
    `const` (indices; also every non-float input) get no gradient in training."""
    fn: object
    inputs: list
    params: dict = dataclasses.field(default_factory=dict)
    mods: dict = dataclasses.field(default_factory=dict)
    const: tuple = ()


class Pattern(nn.Module):
    def __init__(self, case: Case):
        super().__init__()
        self.fn = case.fn
        for k, v in case.params.items():
            self.register_parameter(k, nn.Parameter(v))
        for k, v in case.mods.items():
            self.add_module(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


PATTERNS: dict[str, tuple] = {}   # name -> (build(scale) -> Case, train?)


def pattern(name, train=True):
    def deco(build):
        PATTERNS[name] = (build, train)
        return build
    return deco


def S(n, s):  # a size scaled down by --scale (tests use toy sizes), at least 1
    return max(1, int(round(n * s)))


def img(s, c=64, hw=56, n=8):
    return torch.randn(S(n, s), c, S(hw, s), S(hw, s))


def seq(s, b=8, t=512, h=768):
    return torch.randn(S(b, s), S(t, s), h)


def simple(name, fn, make_inputs, train=True, params=None, mods=None, const=()):
    """Register a pattern from a function and an input factory (both given the scale)."""
    pattern(name, train)(lambda s: Case(fn, make_inputs(s), (params or (lambda s: {}))(s),
                                        (mods or (lambda s: {}))(s), const))


# norms --------------------------------------------------------------------------------------
simple("batchnorm2d", lambda m, x: m.bn(x), lambda s: [img(s)], mods=lambda s: {"bn": nn.BatchNorm2d(64)})
simple("batchnorm2d_channels_last", lambda m, x: m.bn(x),
       lambda s: [img(s).to(memory_format=torch.channels_last)], mods=lambda s: {"bn": nn.BatchNorm2d(64)})
simple("batchnorm1d_ncl", lambda m, x: m.bn(x), lambda s: [torch.randn(S(32, s), 256, S(128, s))],
       mods=lambda s: {"bn": nn.BatchNorm1d(256)})
simple("batchnorm1d_nc", lambda m, x: m.bn(x), lambda s: [torch.randn(S(4096, s), 768)],
       mods=lambda s: {"bn": nn.BatchNorm1d(768)})
simple("layernorm_last_768", lambda m, x: m.ln(x), lambda s: [seq(s)], mods=lambda s: {"ln": nn.LayerNorm(768)})
simple("layernorm_last_64", lambda m, x: m.ln(x), lambda s: [torch.randn(S(8 * 3136, s), 64)],
       mods=lambda s: {"ln": nn.LayerNorm(64)})
simple("layernorm_chw", lambda m, x: F.layer_norm(x, x.shape[1:], m.w, m.b), lambda s: [img(s, c=32)],
       params=lambda s: {"w": torch.randn(32, S(56, s), S(56, s)), "b": torch.randn(32, S(56, s), S(56, s))})
simple("layernorm2d_permute", lambda m, x: m.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
       lambda s: [img(s)], mods=lambda s: {"ln": nn.LayerNorm(64)})
simple("layernorm_permute_to_nhwc", lambda m, x: m.ln(x.permute(0, 2, 3, 1)),   # ConvNeXt/EdgeNeXt
       lambda s: [img(s)], mods=lambda s: {"ln": nn.LayerNorm(64)})               # block before its MLP


def _ln2d_manual(m, x):  # ConvNeXt's LayerNorm2d: a reduction over the channel (non-last) dim
    u = x.mean(1, keepdim=True)
    v = (x - u).pow(2).mean(1, keepdim=True)
    return (x - u) / torch.sqrt(v + 1e-6) * m.w[:, None, None] + m.b[:, None, None]


simple("layernorm2d_manual_dim1", _ln2d_manual, lambda s: [img(s)],
       params=lambda s: {"w": torch.randn(64), "b": torch.randn(64)})
simple("groupnorm_32g", lambda m, x: m.gn(x), lambda s: [img(s)], mods=lambda s: {"gn": nn.GroupNorm(32, 64)})
simple("groupnorm_silu_unet", lambda m, x: F.silu(m.gn(x)), lambda s: [img(s, c=128, hw=64, n=4)],
       mods=lambda s: {"gn": nn.GroupNorm(32, 128)})
simple("groupnorm_silu_issue", lambda m, x: F.silu(m.gn(x)), lambda s: [img(s, c=16, hw=80, n=4)],
       mods=lambda s: {"gn": nn.GroupNorm(4, 16)})
simple("groupnorm_1d", lambda m, x: m.gn(x), lambda s: [torch.randn(S(16, s), 256, S(512, s))],
       mods=lambda s: {"gn": nn.GroupNorm(8, 256)})
simple("instancenorm2d", lambda m, x: m.n(x), lambda s: [img(s)],
       mods=lambda s: {"n": nn.InstanceNorm2d(64, affine=True)})
simple("instancenorm1d", lambda m, x: m.n(x), lambda s: [torch.randn(S(16, s), 256, S(512, s))],
       mods=lambda s: {"n": nn.InstanceNorm1d(256, affine=True)})


def _rms_manual(m, x):  # LLaMA's RMSNorm as written in HF
    v = x.pow(2).mean(-1, keepdim=True)
    return m.w * (x * torch.rsqrt(v + 1e-6))


simple("rmsnorm_manual_last", _rms_manual, lambda s: [seq(s)], params=lambda s: {"w": torch.randn(768)})
simple("rmsnorm_module_last", lambda m, x: m.n(x), lambda s: [seq(s)], mods=lambda s: {"n": nn.RMSNorm(768)})
simple("rmsnorm_dim1", lambda m, x: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * m.w[:, None, None],
       lambda s: [img(s)], params=lambda s: {"w": torch.randn(64)})
simple("l2_normalize_last", lambda m, x: F.normalize(x, dim=-1), lambda s: [seq(s)])

# softmax / losses ---------------------------------------------------------------------------
simple("softmax_attn_scores", lambda m, x: torch.softmax(x, -1), lambda s: [torch.randn(S(8, s), 12, S(128, s), 128)])
simple("softmax_vocab_32000", lambda m, x: torch.softmax(x, -1), lambda s: [torch.randn(S(128, s), 32000)])
simple("softmax_dim_minus2", lambda m, x: torch.softmax(x, -2), lambda s: [torch.randn(S(8, s), 12, S(128, s), 128)])
simple("softmax_masked_scale", lambda m, x, mask: torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), -1),
       lambda s: [torch.randn(S(8, s), 12, S(128, s), S(128, s)),
                  torch.ones(S(128, s), S(128, s), dtype=torch.bool).triu(1)])
simple("log_softmax_8000", lambda m, x: F.log_softmax(x, -1), lambda s: [torch.randn(S(512, s), 8000)])
simple("logsumexp_8000", lambda m, x: torch.logsumexp(x, -1), lambda s: [torch.randn(S(512, s), 8000)])
simple("cross_entropy_8000", lambda m, x, t: F.cross_entropy(x, t),
       lambda s: [torch.randn(S(512, s), 8000), torch.randint(0, 8000, (S(512, s),))])
simple("cross_entropy_smooth", lambda m, x, t: F.cross_entropy(x, t, label_smoothing=0.1),
       lambda s: [torch.randn(S(512, s), 8000), torch.randint(0, 8000, (S(512, s),))])
simple("cross_entropy_segmentation", lambda m, x, t: F.cross_entropy(x, t),
       lambda s: [torch.randn(S(8, s), 21, S(128, s), S(128, s)), torch.randint(0, 21, (S(8, s), S(128, s), S(128, s)))])
simple("bce_with_logits", lambda m, x, t: F.binary_cross_entropy_with_logits(x, t),
       lambda s: [seq(s, t=256), torch.rand(S(8, s), S(256, s), 768)], const=(1,))
simple("mse_loss", lambda m, x, t: F.mse_loss(x, t), lambda s: [seq(s), seq(s)], const=(1,))

# pooling ------------------------------------------------------------------------------------
simple("maxpool_3x3s2_stem", lambda m, x: F.max_pool2d(x, 3, 2, 1), lambda s: [img(s, hw=112)])
simple("maxpool_2x2", lambda m, x: F.max_pool2d(x, 2), lambda s: [img(s)])
simple("maxpool1d_k3s2", lambda m, x: F.max_pool1d(x, 3, 2, 1), lambda s: [torch.randn(S(16, s), 256, S(512, s))])
simple("avgpool_3x3s1_poolformer", lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False) - x,
       lambda s: [img(s)])
simple("avgpool_2x2", lambda m, x: F.avg_pool2d(x, 2), lambda s: [img(s)])
simple("global_avgpool", lambda m, x: F.adaptive_avg_pool2d(x, 1).flatten(1), lambda s: [img(s, c=2048, hw=7)])
simple("adaptive_avgpool_7_from_30", lambda m, x: F.adaptive_avg_pool2d(x, 7), lambda s: [img(s, c=256, hw=30)])
simple("adaptive_maxpool_1", lambda m, x: F.adaptive_max_pool2d(x, 1).flatten(1), lambda s: [img(s, c=512, hw=14)])

# interpolation ------------------------------------------------------------------------------
simple("nearest_up2", lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"), lambda s: [img(s)])
simple("nearest_down2", lambda m, x: F.interpolate(x, scale_factor=0.5, mode="nearest"), lambda s: [img(s, hw=112)])
simple("bilinear_up2", lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
       lambda s: [img(s)])
simple("bilinear_up2_align", lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
       lambda s: [img(s)])
simple("bilinear_down2", lambda m, x: F.interpolate(x, scale_factor=0.5, mode="bilinear"), lambda s: [img(s, hw=112)])
simple("bicubic_up2", lambda m, x: F.interpolate(x, scale_factor=2, mode="bicubic"), lambda s: [img(s, c=32)])
simple("bicubic_down2", lambda m, x: F.interpolate(x, scale_factor=0.5, mode="bicubic"), lambda s: [img(s, c=32, hw=112)])
simple("nearest_up2_cat_fpn", lambda m, x, y: torch.cat([F.interpolate(x, scale_factor=2.0, mode="nearest"), y], 1),
       lambda s: [img(s, c=128, hw=28), img(s, c=64, hw=56)])

# shuffles / layout --------------------------------------------------------------------------
simple("pixel_shuffle_2", lambda m, x: F.pixel_shuffle(x, 2), lambda s: [img(s, c=256, hw=28)])
simple("pixel_unshuffle_2", lambda m, x: F.pixel_unshuffle(x, 2), lambda s: [img(s)])


def _channel_shuffle(m, x):  # ShuffleNet v2
    n, c, h, w = x.shape
    return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


simple("channel_shuffle", _channel_shuffle, lambda s: [img(s, c=232, hw=28)])


def _window_partition(m, x):  # Swin: (B, H, W, C) -> (B*nW, 7*7, C)
    b, h, w, c = x.shape
    x = x.view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, 49, c) * 1.0


simple("swin_window_partition", _window_partition, lambda s: [torch.randn(S(8, s), 56, 56, 96)])
simple("head_split_transpose", lambda m, x: x.view(x.shape[0], x.shape[1], 12, 64).transpose(1, 2).contiguous(),
       lambda s: [seq(s)])
simple("reflect_pad", lambda m, x: F.pad(x, (3, 3, 3, 3), mode="reflect"), lambda s: [img(s)])

# cat / pad / stack along outer dims (selects on a var the simd loop does not move) -----------
def _parts(n, c, hw=56):
    return lambda s_: [img(s_, c=c, hw=hw) for _ in range(n)]


simple("cat2_channels_relu", lambda m, *xs: torch.cat(xs, 1).relu(), _parts(2, 64))      # UNet skip
simple("cat4_channels_relu", lambda m, *xs: torch.cat(xs, 1).relu(), _parts(4, 32))      # Inception
simple("cat16_channels_relu", lambda m, *xs: torch.cat(xs, 1).relu(), _parts(16, 16, hw=28))  # DenseNet
simple("pad_h_relu", lambda m, x: F.pad(x, (0, 0, 2, 2)).relu(), lambda s: [img(s)])
simple("stack8_dim1", lambda m, *xs: torch.stack(xs, 1) * 0.5,
       lambda s: [seq(s, t=256, h=96) for _ in range(8)])


def _selective_scan(m, a, bu, c):  # HF Mamba's pure-torch scan (slow_forward), T steps
    state = torch.zeros(a.shape[0], a.shape[1], a.shape[3])
    outs = []
    for i in range(a.shape[2]):
        state = a[:, :, i] * state + bu[:, :, i]
        outs.append(torch.matmul(state, c[:, i, :].unsqueeze(-1))[:, :, 0])
    return torch.stack(outs, -1)


simple("mamba_selective_scan", _selective_scan,
       lambda s: [torch.rand(2, S(512, s), 128, 16), torch.randn(2, S(512, s), 128, 16),
                  torch.randn(2, 128, 16)])

# gathers / scatters -------------------------------------------------------------------------
simple("embedding_bert", lambda m, i: m.e(i), lambda s: [torch.randint(0, 30522, (S(8, s), S(512, s)))],
       mods=lambda s: {"e": nn.Embedding(30522, 768)})
simple("embedding_bag_mean", lambda m, i, o: F.embedding_bag(i, m.w, o, mode="mean"),
       lambda s: [torch.randint(0, 100000, (S(16384, s),)), torch.arange(0, S(16384, s), 16)],
       params=lambda s: {"w": torch.randn(100000, 64)})
simple("gather_last", lambda m, x, i: torch.gather(x, -1, i),
       lambda s: [seq(s), torch.randint(0, 768, (S(8, s), S(512, s), 64))])
simple("index_select_rows", lambda m, x, i: x[i], lambda s: [torch.randn(50000, 256), torch.randint(0, 50000, (S(16384, s),))])
simple("index_add_segment_sum", lambda m, x, i: torch.zeros(8192, 128).index_add(0, i, x),
       lambda s: [torch.randn(S(65536, s), 128), torch.randint(0, 8192, (S(65536, s),))])
simple("scatter_add_dim1", lambda m, x, i: torch.zeros(x.shape[0], 1024).scatter_add(1, i, x),
       lambda s: [torch.randn(S(512, s), 4096), torch.randint(0, 1024, (S(512, s), 4096))])
simple("index_put_accumulate", lambda m, x, i, v: x.index_put((i,), v, accumulate=True),
       lambda s: [torch.randn(8192, 128), torch.randint(0, 8192, (S(65536, s),)), torch.randn(S(65536, s), 128)])
simple("index_put_assign", lambda m, x, i, v: x.index_put((i,), v),
       lambda s: [torch.randn(65536, 128), torch.randperm(65536)[:S(16384, s)], torch.randn(S(16384, s), 128)])
simple("masked_fill_where", lambda m, x, mask: torch.where(mask, x, torch.zeros_like(x)) + x.masked_fill(~mask, -1.0),
       lambda s: [seq(s), torch.rand(S(8, s), S(512, s), 768) > 0.5])

# scans / selection --------------------------------------------------------------------------
simple("cumsum_last", lambda m, x: torch.cumsum(x, -1), lambda s: [torch.randn(S(256, s), 4096)])
simple("cumsum_dim1", lambda m, x: torch.cumsum(x, 1), lambda s: [seq(s, t=256)])
simple("sort_last", lambda m, x: torch.sort(x, -1)[0], lambda s: [torch.randn(S(256, s), 4096)])
simple("topk_10", lambda m, x: torch.topk(x, 10, -1), lambda s: [torch.randn(S(512, s), 8000)])
simple("argmax_gather", lambda m, x: x.gather(-1, x.argmax(-1, keepdim=True)), lambda s: [torch.randn(S(512, s), 32000)])
simple("max_dim_values", lambda m, x: x.max(1)[0], lambda s: [seq(s)])

# reductions ---------------------------------------------------------------------------------
simple("masked_mean_pooling", lambda m, x, mask: (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9),
       lambda s: [seq(s), (torch.rand(S(8, s), S(512, s)) > 0.3).float()], const=(1,))
simple("masked_max_pooling", lambda m, x, mask: x.masked_fill(~mask[..., None], float("-inf")).amax(1),
       lambda s: [seq(s), torch.rand(S(8, s), S(512, s)) > 0.3])
simple("sum_dim1_of_3d", lambda m, x: x.sum(1), lambda s: [seq(s)])
simple("sum_dim0_bias_grad", lambda m, x: x.sum(0), lambda s: [torch.randn(S(8192, s), 768)])
simple("mean_hw", lambda m, x: x.mean((2, 3)), lambda s: [img(s, c=256, hw=28)])
simple("var_mean_last", lambda m, x: torch.var_mean(x, -1), lambda s: [seq(s)])
simple("std_dim0", lambda m, x: x.std(0), lambda s: [torch.randn(S(8192, s), 768)])


# transformer pieces -------------------------------------------------------------------------
def _rope_rotate_half(m, q, cos, sin):  # HF LLaMA
    x1, x2 = q[..., :32], q[..., 32:]
    return q * cos + torch.cat((-x2, x1), -1) * sin


def _rope_inputs(s):
    t = S(512, s)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    emb = torch.cat([torch.outer(torch.arange(t).float(), inv)] * 2, -1)
    return [torch.randn(S(8, s), 12, t, 64), emb.cos(), emb.sin()]


simple("rope_rotate_half", _rope_rotate_half, _rope_inputs, const=(1, 2))


def _rope_interleaved(m, q, cos, sin):  # GPT-J / Meta LLaMA (real form)
    a, b = q[..., 0::2], q[..., 1::2]
    c, s_ = cos[..., 0::2], sin[..., 0::2]
    return torch.stack([a * c - b * s_, a * s_ + b * c], -1).flatten(-2)


simple("rope_interleaved", _rope_interleaved, _rope_inputs, const=(1, 2))
simple("swiglu_act", lambda m, x: (lambda a, b: F.silu(a) * b)(*x.chunk(2, -1)), lambda s: [seq(s, h=4096)])
simple("swiglu_mlp", lambda m, x: m.down(F.silu(m.gate(x)) * m.up(x)), lambda s: [seq(s, t=256)],
       mods=lambda s: {"gate": nn.Linear(768, 2048, bias=False), "up": nn.Linear(768, 2048, bias=False),
                       "down": nn.Linear(2048, 768, bias=False)})
simple("geglu_tanh", lambda m, x: (lambda a, b: F.gelu(a, approximate="tanh") * b)(*x.chunk(2, -1)),
       lambda s: [seq(s, h=4096)])
simple("linear_gelu", lambda m, x: F.gelu(m.fc(x)), lambda s: [seq(s, t=256)], mods=lambda s: {"fc": nn.Linear(768, 3072)})
simple("gqa_repeat_kv", lambda m, k: k[:, :, None].expand(-1, -1, 3, -1, -1).reshape(k.shape[0], 12, k.shape[2], 64) * 1.0,
       lambda s: [torch.randn(S(8, s), 4, S(512, s), 64)])


def _qkv(s, t=256):
    return [torch.randn(S(8, s), 12, S(t, s), 64) for _ in range(3)]


simple("sdpa", lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v), _qkv)
simple("sdpa_causal", lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _qkv)


def _sdpa_causal_mask(m, q, k, v, fill=None):
    """A decoder's explicit causal mask built from aranges: bool as transformers 5 passes it,
    or additive with finfo.min above the diagonal as transformers 4 did."""
    i = torch.arange(q.shape[2])
    keep = (i[None, :] <= i[:, None])[None, None].expand(q.shape[0], 1, -1, -1)
    mask = keep if fill is None else torch.zeros(keep.shape).masked_fill(~keep, fill)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


simple("sdpa_causal_bool_mask", _sdpa_causal_mask, _qkv)
simple("sdpa_causal_fmin_mask", lambda m, q, k, v: _sdpa_causal_mask(
    m, q, k, v, torch.finfo(torch.float32).min), _qkv)


def _attn_explicit(m, q, k, v, bias):
    a = torch.softmax(q @ k.transpose(-2, -1) * 0.125 + bias, -1)
    return a @ v


simple("attention_explicit_bias", _attn_explicit,
       lambda s: _qkv(s, 128) + [torch.randn(S(8, s), 1, 1, S(128, s))], const=(3,))


def _se(m, x):  # squeeze-excite
    w = x.mean((2, 3), keepdim=True)
    w = torch.sigmoid(m.fc2(F.relu(m.fc1(w))))
    return x * w


simple("squeeze_excite", _se, lambda s: [img(s, c=256, hw=28)],
       mods=lambda s: {"fc1": nn.Conv2d(256, 16, 1), "fc2": nn.Conv2d(16, 256, 1)})
simple("squeeze_excite_hardsigmoid", lambda m, x: x * F.hardsigmoid(m.fc2(F.relu(m.fc1(F.adaptive_avg_pool2d(x, 1))))),
       lambda s: [img(s, c=96, hw=56)], mods=lambda s: {"fc1": nn.Conv2d(96, 24, 1), "fc2": nn.Conv2d(24, 96, 1)})

# conv chains --------------------------------------------------------------------------------
simple("conv3x3_bn_relu", lambda m, x: F.relu(m.bn(m.conv(x))), lambda s: [img(s)],
       mods=lambda s: {"conv": nn.Conv2d(64, 64, 3, padding=1, bias=False), "bn": nn.BatchNorm2d(64)})
simple("conv1x1_bn_silu", lambda m, x: F.silu(m.bn(m.conv(x))), lambda s: [img(s, c=128, hw=28)],
       mods=lambda s: {"conv": nn.Conv2d(128, 256, 1, bias=False), "bn": nn.BatchNorm2d(256)})
simple("dwconv_bn_relu6", lambda m, x: F.relu6(m.bn(m.conv(x))), lambda s: [img(s, c=144)],
       mods=lambda s: {"conv": nn.Conv2d(144, 144, 3, padding=1, groups=144, bias=False), "bn": nn.BatchNorm2d(144)})
simple("basicblock_tail", lambda m, x, r: F.relu(m.bn(m.conv(x)) + r), lambda s: [img(s), img(s)],
       mods=lambda s: {"conv": nn.Conv2d(64, 64, 3, padding=1, bias=False), "bn": nn.BatchNorm2d(64)})


# recurrent cells ----------------------------------------------------------------------------
def _lstm_cell(m, x, h, c):
    gates = m.ih(x) + m.hh(h)
    i, f, g, o = gates.chunk(4, 1)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c2), c2


simple("lstm_cell_math", _lstm_cell, lambda s: [torch.randn(S(256, s), 512), torch.randn(S(256, s), 1024),
                                               torch.randn(S(256, s), 1024)],
       mods=lambda s: {"ih": nn.Linear(512, 4096), "hh": nn.Linear(1024, 4096)})


def _gru_cell(m, x, h):
    gi, gh = m.ih(x), m.hh(h)
    ir, iz, in_ = gi.chunk(3, 1)
    hr, hz, hn = gh.chunk(3, 1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    return (1 - z) * n + z * h


simple("gru_cell_math", _gru_cell, lambda s: [torch.randn(S(256, s), 512), torch.randn(S(256, s), 1024)],
       mods=lambda s: {"ih": nn.Linear(512, 3072), "hh": nn.Linear(1024, 3072)})

# activations --------------------------------------------------------------------------------
simple("gelu_erf", lambda m, x: F.gelu(x), lambda s: [seq(s)])
simple("hardswish", lambda m, x: F.hardswish(x), lambda s: [img(s, c=96, hw=112)])
simple("bias_add_dropout_free_residual", lambda m, x, r: (x + m.b) * 0.5 + r, lambda s: [seq(s), seq(s)],
       params=lambda s: {"b": torch.randn(768)})


# ---------------------------------------------------------------------------------------- running
def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]


class Step:
    """One call of a compiled pattern in one mode: no_grad forward, or forward + backward."""

    def __init__(self, mod, inputs, mode, grads=None):
        self.mod, self.inputs, self.mode, self.grads = mod, inputs, mode, grads
        self.leaves = [x for x in inputs if x.requires_grad] + [p for p in mod.parameters()]

    def __call__(self):
        if self.mode == "infer":
            with torch.no_grad():
                return flat(self.mod(*self.inputs))
        for t in self.leaves:
            t.grad = None
        outs = [o for o in flat(self.mod(*self.inputs)) if o.requires_grad]
        torch.autograd.backward(outs, self.grads)
        return outs

    def observed(self, outs):
        got = [o.detach().clone() for o in outs]
        if self.mode == "train":
            got += [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in self.leaves]
        return got


def rel_errs(got, ref):
    """Per tensor: max |err| / max |ref| (integer tensors: 0 or inf)."""
    errs = []
    for g, r in zip(got, ref, strict=True):
        if g.shape != r.shape:
            errs.append(math.inf)
            continue
        if not r.is_floating_point():
            errs.append(math.inf if not torch.equal(g, r) else 0.0)
            continue
        d = (g.double() - r.double()).abs()
        d = torch.where(torch.isnan(d) & torch.isnan(r.double()) & torch.isnan(g.double()), 0.0, d)
        scale = float(r.double().abs().nan_to_num(posinf=0, neginf=0).max()) if r.numel() else 0.0
        errs.append(float(d.nan_to_num(nan=math.inf, posinf=0).max() if d.numel() else 0.0)
                    / max(scale, 1e-6))
    return errs


def kink_allowance(pristine, inputs, grads):
    """Per observed tensor of a training step, the relative movement of the fp64 step when every
    kinked activation's input moves by 10x eager-fp32's error there (kinks.allowance); None
    without a kink. `pristine` is an untouched fp32 copy of the pattern."""
    def step(m, double):
        xs = [x.detach().double().requires_grad_(x.requires_grad) if double and x.is_floating_point()
              else x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        st = Step(m, xs, "train", [g.double() for g in grads] if double else grads)
        return st.observed(st())
    fresh = lambda: copy.deepcopy(pristine)  # noqa: E731
    ref = step(fresh().double(), True)
    found = kinks.allowance(fresh, lambda m: step(m, True), lambda m: step(m, False), ref,
                            harness.compare)
    return None if found is None else (found[0], found[1])


def ember_counts():
    c = ember.stats()["counts"]
    return {k: c.get(k, 0) for k in ("graphs", "breaks", "fallbacks", "eager_calls", "kernels")}


def run_pattern(name, mode, scale, rounds, with_torch):
    build, trainable = PATTERNS[name]
    row = {"pattern": name, "mode": mode}
    torch.manual_seed(0)
    case = build(scale)
    base = Pattern(case)
    base.train(mode == "train")
    inputs = [x.clone() for x in case.inputs]
    if mode == "train":
        inputs = [x.requires_grad_() if x.is_floating_point() and i not in case.const else x
                  for i, x in enumerate(inputs)]
    compilers = {"eager": base, "ember": ember.compile(copy.deepcopy(base))}
    if with_torch:
        torch._dynamo.reset()
        compilers["inductor"] = torch.compile(copy.deepcopy(base))
    pristine = copy.deepcopy(base)
    ember.reset()
    decided = len(speed.DECISIONS)
    grads = None
    if mode == "train":
        with torch.no_grad():
            outs = [o for o in flat(base(*inputs)) if o.requires_grad or o.is_floating_point()]
        g = torch.Generator().manual_seed(1)
        grads = [torch.randn(o.shape, generator=g) for o in outs]
    steps = {k: Step(m, inputs, mode, grads) for k, m in compilers.items()}
    first, ref = {}, None
    for k, st in steps.items():
        before = ember_counts() if k == "ember" else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            outs = st()
            first[k] = time.perf_counter() - t0
        got = st.observed(outs)
        if k == "eager":
            ref = got
            continue
        errs = rel_errs(got, ref)
        row[f"{k}_err"] = err = max(errs, default=0.0)
        allowed = [TOL[mode]] * len(errs)
        if not err <= TOL[mode] and mode == "train":
            if "kink_found" not in row:   # once per row (ember and inductor share it)
                row["kink_found"] = kink_allowance(pristine, inputs, grads)
            found = row["kink_found"]
            if found is not None:
                allowed = [a + TOL[mode] for a in found[0]]
                row["kinks"] = {**found[1], "max_allowed": max(allowed)}
        if not all(e <= a for e, a in zip(errs, allowed)):
            worst = max(range(len(errs)), key=lambda i: errs[i] / allowed[i])
            row.setdefault("problems", []).append(
                f"{k}: max rel err {err:.3g}; tensor {worst}: {errs[worst]:.3g} > {allowed[worst]:.3g}"
                + (" (TOL + kink allowance)" if "kinks" in row else ""))
        if k == "ember":
            after = ember_counts()
            delta = {c: after[c] - before[c] for c in after}
            row["ember_counts"] = delta
            msgs = [str(w.message) for w in caught if str(w.message).startswith("ember:")]
            if delta["fallbacks"] or delta["eager_calls"] or delta["graphs"] == 0:
                row.setdefault("problems", []).append(
                    f"ember fell back: {delta}; {msgs[0][:160] if msgs else ''}")
    # past ember's speed check: a wide timing is timed again RECHECK_CALLS calls later, up to
    # TRIES timings, which inside the timed rounds made single rounds 3-5x slow (p25 ~0.2)
    for _ in range((speed.TRIES - 1) * speed.RECHECK_CALLS + 2):
        steps["ember"]()
    # the speed check's choices for this row's graphs (graph names match across processes)
    row["speed"] = speed.DECISIONS[decided:]
    samples, reps = _timing.paired(steps, (), rounds, target_s=0.04)
    med = {k: statistics.median(v) for k, v in samples.items()}
    row.update({f"{k}_ms": med[k] * 1e3 for k in med}, reps=reps, rounds=rounds)
    row["ember_vs_eager"] = _timing.ratio_stats(samples["eager"], samples["ember"])
    row["compile_s_ember"] = max(first["ember"] - med["ember"], 0.0)
    if with_torch:
        row["ember_vs_inductor"] = _timing.ratio_stats(samples["inductor"], samples["ember"])
        row["inductor_vs_eager"] = _timing.ratio_stats(samples["eager"], samples["inductor"])
        row["compile_s_inductor"] = max(first["inductor"] - med["inductor"], 0.0)
    row.pop("kink_found", None)
    row["status"] = "wrong/fallback" if row.get("problems") else "pass"
    return row


def fmt_ratio(r):
    return f"{r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}]" if r else "-"


def print_table(rows, header=True):
    hdr = f"{'pattern':30s} {'mode':5s} {'eager':>8s} {'ember':>8s} {'induct':>8s}  {'ember/eager':>18s}"
    hdr += f"  {'ember/inductor':>18s} {'comp_e':>6s} {'comp_i':>6s} status"
    if header:
        print(hdr)
    for r in rows:
        if "ember_ms" not in r:
            print(f"{r['pattern']:30s} {r['mode']:5s} FAILED: {r.get('error', '')[:100]}")
            continue
        print(f"{r['pattern']:30s} {r['mode']:5s} {r['eager_ms']:8.3f} {r['ember_ms']:8.3f} "
              f"{r.get('inductor_ms', float('nan')):8.3f}  {fmt_ratio(r['ember_vs_eager']):>18s}  "
              f"{fmt_ratio(r.get('ember_vs_inductor')):>18s} {r['compile_s_ember']:6.2f} "
              f"{r.get('compile_s_inductor', float('nan')):6.2f} {r['status']}")


def summary(rows):
    lines = []
    timed = [r for r in rows if "ember_ms" in r]
    for mode in ("infer", "train"):
        rs = [r for r in timed if r["mode"] == mode]
        if not rs:
            continue
        g = statistics.geometric_mean([r["ember_vs_eager"]["median"] for r in rs])
        gi = [r["ember_vs_inductor"]["median"] for r in rs if "ember_vs_inductor" in r]
        lines.append(f"{mode}: {len(rs)} patterns, geomean ember/eager {g:.2f}x"
                     + (f", ember/inductor {statistics.geometric_mean(gi):.2f}x" if gi else ""))
    for cut in (0.95, 0.9):
        slow = sorted((r for r in timed if r["ember_vs_eager"]["median"] < cut),
                      key=lambda r: r["ember_vs_eager"]["median"])
        lines.append(f"below {cut}x eager ({len(slow)}): " + ", ".join(
            f"{r['pattern']}/{r['mode']} {fmt_ratio(r['ember_vs_eager'])}" for r in slow))
    bad = [f"{r['pattern']}/{r['mode']}: {'; '.join(r.get('problems') or [r.get('error', '')])}"
           for r in rows if r.get("status") != "pass"]
    lines.append(f"not passing ({len(bad)}): " + ("; ".join(bad) if bad else "none"))
    return lines


def markdown(rows):
    """The results as a markdown table plus the summary (for benchmarks/README-op-sweep.md)."""
    out = ["| pattern | mode | eager ms | ember ms | inductor ms | ember/eager [p25-p75] "
           "| ember/inductor [p25-p75] | compile s ember | compile s inductor | status |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "ember_ms" not in r:
            out.append(f"| {r['pattern']} | {r['mode']} | | | | | | | | fail: {r.get('error', '')[:80]} |")
            continue
        ind = r.get("inductor_ms")
        ratio = r["ember_vs_eager"]["median"]
        mark = " **" if ratio < 0.9 else " *" if ratio < 0.95 else ""
        out.append(
            f"| {r['pattern']} | {r['mode']} | {r['eager_ms']:.3f} | {r['ember_ms']:.3f} | "
            f"{'%.3f' % ind if ind else '-'} | {fmt_ratio(r['ember_vs_eager'])}{mark} | "
            f"{fmt_ratio(r.get('ember_vs_inductor'))} | {r['compile_s_ember']:.2f} | "
            f"{'%.2f' % r['compile_s_inductor'] if 'compile_s_inductor' in r else '-'} | "
            f"{r['status']}{': ' + '; '.join(r['problems'])[:120] if r.get('problems') else ''} |")
    return "\n".join(out + [""] + [f"- {line}" for line in summary(rows)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("infer", "train", "both"), default="both")
    ap.add_argument("--only", default="", help="regex over pattern names (re.search)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile (Inductor)")
    ap.add_argument("--json", default="", help="write one JSON line per (pattern, mode)")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink sizes (tests use toy sizes)")
    ap.add_argument("--threads", type=int, default=hygiene.default_threads())
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--markdown", default="", metavar="JSONL",
                    help="print a results file (from --json) as markdown and exit")
    a = ap.parse_args(argv)
    if a.markdown:
        with open(a.markdown) as f:
            print(markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    names = [n for n in PATTERNS if re.search(a.only, n)]
    if a.list:
        print("\n".join(names))
        return 0
    torch.set_num_threads(a.threads)
    modes = ["infer", "train"] if a.mode == "both" else [a.mode]
    env = hygiene.describe()
    print(f"# op sweep: {len(names)} patterns x {modes}; threads={a.threads} rounds={a.rounds} "
          f"torch={torch.__version__} allocator={env['allocator']} scale={a.scale}", flush=True)
    out = open(a.json, "w") if a.json else None
    rows = []
    t_start = time.perf_counter()
    for name in names:
        for mode in modes:
            if mode == "train" and not PATTERNS[name][1]:
                continue
            try:
                row = run_pattern(name, mode, a.scale, a.rounds, not a.no_torch)
            except Exception as exc:  # noqa: BLE001 - one pattern's failure is reported, the sweep goes on
                row = {"pattern": name, "mode": mode, "status": "fail",
                       "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300],
                       "traceback": traceback.format_exc()[-2000:]}
            row.update(threads=a.threads, scale=a.scale, env=env)
            rows.append(row)
            print_table([row], header=len(rows) == 1)
            sys.stdout.flush()
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    print(f"\n# {len(rows)} rows in {time.perf_counter() - t_start:.0f} s; ratios = eager (or inductor) "
          f"ms / ember ms, median of per-round ratios [p25-p75]; tolerance {TOL}")
    print_table(rows)
    print()
    for line in summary(rows):
        print(line)
    if out:
        out.close()
    return 0 if all(r.get("status") == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
