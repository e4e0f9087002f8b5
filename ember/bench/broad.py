"""The broad model suite for ember bench (`ember bench --suite broad`): realistic sizes, offline.

Registers ~70 `ModelSpec`s of suite "broad" into `spec.REGISTRY` (names start with "b_", apart
from the smaller suites' models of the same architecture), each with a `family`
(tv_cls, tv_seg, timm, hf_encoder, hf_decoder, hf_seq2seq, hf_vision_audio, custom). Every model
is built from code or a config with random weights (torchvision weights=None and
weights_backbone=None, timm pretrained=False, transformers from a *Config): nothing downloads.

Sizes: images at 224x224 or the model's native size; batch 8 unless one step of the model
would take over ~1 s on 2 cores, then a smaller batch, named in the spec's note (batches were
set from the model's FLOPs per image: about 24 GFLOP per inference step at most).
Transformers: hidden 384-768, 2-4 layers, sequences 128-256 (Whisper: 30 s of audio, 1500
encoder positions; wav2vec2: 1 s at 16 kHz). Dropout, layer drop, stochastic depth and
SpecAugment masking are off in the configs, so every compiler computes the same function.

`tiny_spec(name)` returns the same model at a tiny size (batch 1, 64x64 images, 1-layer
transformers, 16 tokens) for the smoke test.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .spec import REGISTRY, ModelSpec

FAMILIES = ("tv_cls", "tv_seg", "timm", "hf_encoder", "hf_decoder", "hf_seq2seq",
            "hf_vision_audio", "custom")
_MAKERS: dict[str, Callable[[bool], ModelSpec]] = {}


def _register(name: str, make: Callable[[bool], ModelSpec]) -> None:
    assert name not in REGISTRY, f"duplicate model name {name}"     # names carry a b_ prefix
    _MAKERS[name] = make
    REGISTRY[name] = make(False)


def tiny_spec(name: str) -> ModelSpec:
    """The broad model `name` at smoke-test size."""
    return _MAKERS[name](True)


def _note(batch: int, extra: str = "") -> str:
    parts = [f"batch {batch}" + ("" if batch == 8 else " (not 8: a training step would take "
                                                        "well over 1 s on 2 cores, from FLOPs)")]
    return "; ".join(parts + ([extra] if extra else []))


def _images(batch: int, size: int, channels: int = 3):
    return lambda: (torch.randn(batch, channels, size, size),)


# ---------------------------------------------------------------------------------- torchvision
def _tv(name: str, batch: int = 8, size: int = 224, family: str = "tv_cls", fixed_size=False,
        **kw):
    def make(tiny: bool) -> ModelSpec:
        b, s = (1, size if fixed_size else 64) if tiny else (batch, size)

        def build():
            import torchvision
            if family == "tv_seg":
                fn = getattr(torchvision.models.segmentation, name)
                return fn(weights=None, weights_backbone=None, **kw)
            return getattr(torchvision.models, name)(weights=None, **kw)
        return ModelSpec(f"b_tv_{name}", "broad", build, _images(b, s), family=family,
                         note=_note(batch, f"{size}x{size}"))
    _register(f"b_tv_{name}", make)


for _name, _batch in (("resnet18", 4), ("resnet50", 2), ("resnext50_32x4d", 2),
                      ("wide_resnet50_2", 1), ("densenet121", 2), ("mobilenet_v2", 8),
                      ("mobilenet_v3_large", 8), ("mnasnet1_0", 8), ("shufflenet_v2_x1_0", 8),
                      ("squeezenet1_1", 8), ("efficientnet_b0", 8), ("efficientnet_v2_s", 1),
                      ("regnet_y_400mf", 8), ("convnext_tiny", 2), ("swin_t", 2),
                      ("swin_v2_t", 2)):
    _tv(_name, _batch)
_tv("vit_b_16", 1, fixed_size=True)
_tv("maxvit_t", 2, fixed_size=True)
_tv("fcn_resnet50", 1, family="tv_seg", num_classes=21, aux_loss=False)
_tv("deeplabv3_mobilenet_v3_large", 4, family="tv_seg", num_classes=21, aux_loss=False)
_tv("lraspp_mobilenet_v3_large", 8, family="tv_seg", num_classes=21)


# ---------------------------------------------------------------------------------------- timm
def _timm(name: str, batch: int = 8, size: int = 224, fixed_size: bool = False):
    def make(tiny: bool) -> ModelSpec:
        b, s = (1, size if fixed_size else 64) if tiny else (batch, size)

        def build():
            import timm
            return timm.create_model(name, pretrained=False)
        return ModelSpec(f"b_timm_{name}", "broad", build, _images(b, s), family="timm",
                         note=_note(batch, f"{size}x{size}"))
    _register(f"b_timm_{name}", make)


for _name, _batch, _size, _fixed in (
        ("ghostnet_100", 8, 224, False), ("rexnet_100", 8, 224, False),
        ("mixnet_s", 8, 224, False), ("levit_128s", 8, 224, True),
        ("poolformer_s12", 4, 224, False), ("coat_lite_tiny", 4, 224, True),
        ("crossvit_tiny_240", 4, 240, True), ("beit_base_patch16_224", 1, 224, True),
        ("deit_small_patch16_224", 2, 224, True), ("resmlp_12_224", 4, 224, True),
        ("eca_nfnet_l0", 2, 224, False), ("hrnet_w18_small", 4, 224, False),
        ("dla34", 4, 224, False), ("dpn68", 4, 224, False), ("cspresnet50", 4, 224, False),
        ("edgenext_xx_small", 8, 256, False), ("efficientformer_l1", 8, 224, True),
        ("mobilevit_xs", 4, 256, False), ("fastvit_t8", 8, 256, False),
        ("repvit_m1", 8, 224, False), ("resnest14d", 4, 224, False),
        ("inception_v3", 2, 299, False), ("res2net50_14w_8s", 2, 224, False),
        ("selecsls42b", 4, 224, False), ("mobileone_s0", 8, 224, False)):
    _timm(_name, _batch, _size, _fixed)


# ---------------------------------------------------------------------------------- transformers
_NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _hf(name: str, family: str, model_cls: str, config_cls: str, config: dict,
        inputs: Callable[[int, int], dict], batch: int, seq: int, tiny_config: dict,
        note: str = ""):
    """A transformers model from `config_cls(**config)`; `inputs(batch, seq)` -> kwargs."""
    def make(tiny: bool) -> ModelSpec:
        cfg = {**config, **tiny_config} if tiny else config
        b, s = (1, 16) if tiny else (batch, seq)

        def build():
            import transformers
            return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
        return ModelSpec(f"b_hf_{name}", "broad", build, lambda: (), kwargs=lambda: inputs(b, s),
                         family=family, note=f"batch {b}, seq {s}" + (f"; {note}" if note else ""))
    _register(f"b_hf_{name}", make)


def _ids(vocab: int, low: int = 4, mask: bool = True):
    def make(b, s):
        out = {"input_ids": torch.randint(low, vocab, (b, s))}
        if mask:
            out["attention_mask"] = torch.ones(b, s, dtype=torch.long)
        return out
    return make


def _seq2seq(vocab: int):
    return lambda b, s: {"input_ids": torch.randint(4, vocab, (b, s)),
                         "attention_mask": torch.ones(b, s, dtype=torch.long),
                         "decoder_input_ids": torch.randint(4, vocab, (b, s // 2))}


_V = 8192          # vocabulary of the text models (embedding rows; realistic enough, fast to train)
_ENC = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
            vocab_size=_V, max_position_embeddings=514, **_NO_DROP)
_TINY = dict(num_hidden_layers=1)
_DEC = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
            intermediate_size=1376, vocab_size=_V, max_position_embeddings=512, use_cache=False)

_hf("bert", "hf_encoder", "BertModel", "BertConfig", _ENC, _ids(_V), 4, 128, _TINY)
_hf("roberta", "hf_encoder", "RobertaModel", "RobertaConfig", {**_ENC, "pad_token_id": 1},
    _ids(_V), 4, 128, _TINY)
_hf("albert", "hf_encoder", "AlbertModel", "AlbertConfig", {**_ENC, "embedding_size": 128},
    _ids(_V), 4, 128, _TINY)
_hf("electra", "hf_encoder", "ElectraModel", "ElectraConfig", {**_ENC, "embedding_size": 128},
    _ids(_V), 4, 128, _TINY)
_hf("deberta_v2", "hf_encoder", "DebertaV2Model", "DebertaV2Config",
    {**_ENC, "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "max_relative_positions": -1,
     "position_buckets": 256}, _ids(_V), 4, 128, _TINY)
_hf("distilbert", "hf_encoder", "DistilBertModel", "DistilBertConfig",
    dict(dim=512, n_layers=4, n_heads=8, hidden_dim=2048, vocab_size=_V,
         max_position_embeddings=512, dropout=0.0, attention_dropout=0.0),
    _ids(_V), 4, 128, {"n_layers": 1})
_hf("gpt2", "hf_decoder", "GPT2Model", "GPT2Config",
    dict(n_embd=512, n_layer=4, n_head=8, vocab_size=_V, n_positions=512, resid_pdrop=0.0,
         embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0),
    _ids(_V), 2, 256, {"n_layer": 1})
_hf("gpt_neo", "hf_decoder", "GPTNeoModel", "GPTNeoConfig",
    dict(hidden_size=512, num_layers=4, num_heads=8, attention_types=[[["global", "local"], 2]],
         window_size=128, vocab_size=_V, max_position_embeddings=512, embed_dropout=0.0,
         attention_dropout=0.0, resid_dropout=0.0, use_cache=False),
    _ids(_V), 2, 256, {"num_layers": 2}, note="local attention, window 128")
_hf("opt", "hf_decoder", "OPTModel", "OPTConfig",
    dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, ffn_dim=2048,
         word_embed_proj_dim=512, vocab_size=_V, max_position_embeddings=512, dropout=0.0,
         attention_dropout=0.0, layerdrop=0.0, use_cache=False), _ids(_V), 2, 256, _TINY)
_hf("llama", "hf_decoder", "LlamaModel", "LlamaConfig", _DEC, _ids(_V), 2, 256, _TINY)
_hf("mistral", "hf_decoder", "MistralModel", "MistralConfig", {**_DEC, "sliding_window": 128},
    _ids(_V), 2, 256, _TINY, note="sliding window 128")
_hf("qwen2", "hf_decoder", "Qwen2Model", "Qwen2Config", _DEC, _ids(_V), 2, 256, _TINY)
_hf("phi", "hf_decoder", "PhiModel", "PhiConfig",
    {**_DEC, "intermediate_size": 2048, "partial_rotary_factor": 0.5, "resid_pdrop": 0.0,
     "embd_pdrop": 0.0, "attention_dropout": 0.0}, _ids(_V), 2, 256, _TINY)
_hf("t5", "hf_seq2seq", "T5Model", "T5Config",
    dict(d_model=512, d_kv=64, d_ff=2048, num_layers=3, num_decoder_layers=3, num_heads=8,
         vocab_size=_V, dropout_rate=0.0, use_cache=False),
    _seq2seq(_V), 4, 128, {"num_layers": 1, "num_decoder_layers": 1}, note="decoder seq 64")
_hf("bart", "hf_seq2seq", "BartModel", "BartConfig",
    dict(d_model=512, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
         decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=_V,
         max_position_embeddings=512, dropout=0.0, attention_dropout=0.0,
         activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, use_cache=False),
    _seq2seq(_V), 4, 128, {"encoder_layers": 1, "decoder_layers": 1}, note="decoder seq 64")
_hf("whisper", "hf_seq2seq", "WhisperModel", "WhisperConfig",
    dict(d_model=384, encoder_layers=2, decoder_layers=2, encoder_attention_heads=6,
         decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, vocab_size=_V,
         num_mel_bins=80, max_source_positions=1500, max_target_positions=448, dropout=0.0,
         attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
         decoder_layerdrop=0.0, use_cache=False, pad_token_id=0, decoder_start_token_id=1,
         bos_token_id=1, eos_token_id=2),
    lambda b, s: {"input_features": torch.randn(b, 80, 2 * s if s < 100 else 3000),
                  "decoder_input_ids": torch.randint(3, _V, (b, 64 if s >= 100 else 8))},
    1, 1500, {"encoder_layers": 1, "decoder_layers": 1, "max_source_positions": 16},
    note="whisper-tiny width, 30 s of audio (3000 frames), decoder seq 64")
_hf("wav2vec2", "hf_vision_audio", "Wav2Vec2Model", "Wav2Vec2Config",
    dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6, intermediate_size=1536,
         hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
         final_dropout=0.0, layerdrop=0.0, apply_spec_augment=False, mask_time_prob=0.0),
    lambda b, s: {"input_values": torch.randn(b, 16000 if s >= 100 else 4000)},
    2, 16000, _TINY, note="1 s of 16 kHz audio, group-norm feature extractor")
_hf("vit", "hf_vision_audio", "ViTModel", "ViTConfig",
    dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072,
         image_size=224, patch_size=16, **_NO_DROP),
    lambda b, s: {"pixel_values": torch.randn(b, 3, 224, 224)}, 4, 197, _TINY,
    note="224x224, patch 16")
_hf("swin", "hf_vision_audio", "SwinModel", "SwinConfig",
    dict(image_size=224, embed_dim=96, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24],
         window_size=7, drop_path_rate=0.0, **_NO_DROP),
    lambda b, s: {"pixel_values": torch.randn(b, 3, 224, 224)}, 4, 3136,
    {"depths": [1, 1, 1, 1]}, note="224x224, depths 2-2-2-2")
_hf("clip_text", "hf_encoder", "CLIPTextModel", "CLIPTextConfig",
    dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
         vocab_size=_V, max_position_embeddings=77, bos_token_id=1, eos_token_id=2),
    _ids(_V), 8, 77, _TINY, note="seq 77 as CLIP")
_hf("clip_vision", "hf_vision_audio", "CLIPVisionModel", "CLIPVisionConfig",
    dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072,
         image_size=224, patch_size=32),
    lambda b, s: {"pixel_values": torch.randn(b, 3, 224, 224)}, 8, 50, _TINY,
    note="224x224, patch 32")


# ------------------------------------------------------------------------------------ custom
class ResBlock(nn.Module):
    """Diffusion-UNet residual block: GroupNorm -> SiLU -> conv, twice, plus a 1x1 skip."""

    def __init__(self, cin: int, cout: int, groups: int = 32):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(nn.functional.silu(self.n1(x)))
        h = self.c2(nn.functional.silu(self.n2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """GroupNorm/SiLU UNet as in latent diffusion: down with strided convs, nearest up + cat."""

    def __init__(self, cin: int = 4, widths=(64, 128, 256), groups: int = 32):
        super().__init__()
        self.stem = nn.Conv2d(cin, widths[0], 3, padding=1)
        self.down = nn.ModuleList()
        self.pool = nn.ModuleList()
        c = widths[0]
        for w in widths:
            self.down.append(ResBlock(c, w, groups))
            self.pool.append(nn.Conv2d(w, w, 3, stride=2, padding=1))
            c = w
        self.mid = ResBlock(c, c, groups)
        self.up = nn.ModuleList()
        for w in reversed(widths):
            self.up.append(ResBlock(c + w, w, groups))
            c = w
        self.out = nn.Sequential(nn.GroupNorm(groups, c), nn.SiLU(), nn.Conv2d(c, cin, 3, padding=1))

    def forward(self, x):
        h = self.stem(x)
        skips = []
        for block, pool in zip(self.down, self.pool):
            h = block(h)
            skips.append(h)
            h = pool(h)
        h = self.mid(h)
        for block in self.up:
            h = nn.functional.interpolate(h, scale_factor=2.0, mode="nearest")
            h = block(torch.cat([h, skips.pop()], dim=1))
        return self.out(h)


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer nn.LSTM -> per-token linear head."""

    def __init__(self, vocab: int = 8192, d: int = 256, hidden: int = 512, tags: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, tags)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.head(out)


class LSTMCells(nn.Module):
    """An LSTM written out: per time step one matmul and the gate math (the pattern users write)."""

    def __init__(self, d: int = 256, hidden: int = 256):
        super().__init__()
        self.hidden = hidden
        self.x2h, self.h2h = nn.Linear(d, 4 * hidden), nn.Linear(hidden, 4 * hidden, bias=False)
        self.head = nn.Linear(hidden, d)

    def forward(self, x):
        b, t, _ = x.shape
        h = x.new_zeros(b, self.hidden)
        c = x.new_zeros(b, self.hidden)
        gx = self.x2h(x)
        outs = []
        for i in range(t):
            i_g, f_g, g_g, o_g = (gx[:, i] + self.h2h(h)).chunk(4, dim=1)
            c = torch.sigmoid(f_g) * c + torch.sigmoid(i_g) * torch.tanh(g_g)
            h = torch.sigmoid(o_g) * torch.tanh(c)
            outs.append(h)
        return self.head(torch.stack(outs, dim=1))


def _custom(name: str, build: Callable[[bool], nn.Module], inputs: Callable[[bool], tuple],
            note: str):
    def make(tiny: bool) -> ModelSpec:
        return ModelSpec(f"b_{name}", "broad", lambda: build(tiny), lambda: inputs(tiny),
                         family="custom", note=note)
    _register(f"b_{name}", make)


_custom("unet_groupnorm_silu", lambda tiny: UNet(widths=(32, 64) if tiny else (64, 128, 256)),
        lambda tiny: (torch.randn(1 if tiny else 4, 4, 16 if tiny else 64, 16 if tiny else 64),),
        "batch 4, 4x64x64 latents (SD-like), GroupNorm(32)+SiLU, widths 64-128-256")
_custom("lstm", lambda tiny: LSTMTagger(hidden=64 if tiny else 512),
        lambda tiny: (torch.randint(0, 8192, (1 if tiny else 8, 8 if tiny else 128)),),
        "batch 8, seq 128, nn.LSTM 2 layers hidden 512")
_custom("lstm_cells", lambda tiny: LSTMCells(),
        lambda tiny: (torch.randn(1 if tiny else 16, 4 if tiny else 32, 256),),
        "batch 16, seq 32 unrolled, hidden 256: LSTM gate math written out")
