"""Survey ember on models outside every suite: correctness, graphs, breaks, fallbacks, speed.

    PYTHONPATH=. python benchmarks/survey.py --list
    PYTHONPATH=. python benchmarks/survey.py --table run1.jsonl run2.jsonl
    PYTHONPATH=. python benchmarks/survey.py [--models a,b | --suite survey3] [--modes infer,train] \
        [--timeout 420] [--reps 3] --out benchmarks/results/survey2_<tag>.jsonl

Sets: `survey` (63 models, survey2), `survey3` (38 more: timm, torchvision, HF) and `survey4`
(10 more, run in both modes).

PYTHONPATH picks the ember tree measured (the workers inherit it). One subprocess per (model, mode) with a timeout (a crash or hang is a row, the run goes on), the
timing-hygiene environment of `ember bench` (1 thread, tuned glibc malloc) and
EMBER_LOGS=graph_breaks,fallbacks,recompiles, whose lines are parsed back into each row as
`breaks` / `fallback_log` / `recompile_log`. Inside the worker `ember.bench.harness.measure` does
the rest, as for `ember bench`: fp64-eager reference, per-tensor tolerance of 10x eager-fp32's
error, paired alternating eager/ember timings (median ratio), fallback detection from warnings.
Training mode compares the outputs, the loss and every parameter gradient of one step.

Every model is built offline with random weights: timm pretrained=False, torchvision
weights=None, transformers from a *Config (2-4 layers where the real one is larger).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import torch

from ember.bench import harness, hygiene
from ember.bench.spec import ModelSpec

SPECS: dict[str, ModelSpec] = {}


def _add(spec: ModelSpec) -> None:
    assert spec.name not in SPECS, spec.name
    SPECS[spec.name] = spec


def _images(shape):
    return lambda: (torch.randn(*shape),)


def timm_model(name: str, batch: int = 2, size: int = 224, suite: str = "survey", **kw):
    def build():
        import timm
        return timm.create_model(name, pretrained=False, **kw)
    _add(ModelSpec(f"s_timm_{name}", suite, build, _images((batch, 3, size, size)),
                   family="timm", note=f"batch {batch}, {size}x{size}"))


def tv_model(name: str, shape, sub: str = "", suite: str = "survey", **kw):
    def build():
        import torchvision
        mod = getattr(torchvision.models, sub) if sub else torchvision.models
        return getattr(mod, name)(weights=None, **kw)
    _add(ModelSpec(f"s_tv_{name}", suite, build, _images(shape), family="tv",
                   note="x".join(map(str, shape))))


def hf_model(name: str, model_cls: str, config_cls: str, config: dict, inputs, note: str = "",
             suite: str = "survey"):
    def build():
        import transformers
        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg)
    _add(ModelSpec(f"s_hf_{name}", suite, build, lambda: (), kwargs=inputs, family="hf",
                   note=note))


def ids(batch=2, seq=128, vocab=1000, mask=True, low=4, **extra):
    def make():
        out = {"input_ids": torch.randint(low, vocab, (batch, seq))}
        if mask:
            out["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        out.update({k: v() for k, v in extra.items()})
        return out
    return make


def pixels(batch=2, size=224, channels=3):
    return lambda: {"pixel_values": torch.randn(batch, channels, size, size)}


def audio(batch=2, samples=16000):
    return lambda: {"input_values": torch.randn(batch, samples)}


# ------------------------------------------------------------------------------------- timm
for _n, _b, _s in (("skresnet18", 2, 224), ("tresnet_m", 2, 224), ("twins_svt_small", 2, 224),
                   ("pit_xs_224", 2, 224), ("tnt_s_patch16_224", 1, 224), ("nest_tiny", 1, 224),
                   ("volo_d1_224", 1, 224), ("eva02_tiny_patch14_224", 2, 224),
                   ("efficientformerv2_s0", 2, 224), ("fastvit_sa12", 2, 256),
                   ("inception_v4", 1, 299), ("xception41", 1, 299), ("repghostnet_050", 4, 224),
                   ("tiny_vit_5m_224", 2, 224), ("maxxvit_rmlp_nano_rw_256", 1, 256),
                   ("nextvit_small", 1, 224), ("focalnet_tiny_srf", 1, 224),
                   ("hiera_tiny_224", 1, 224), ("vitamin_small_224", 1, 224),
                   ("gcvit_xxtiny", 2, 224), ("mvitv2_tiny", 1, 224), ("halonet26t", 2, 256),
                   ("botnet26t_256", 2, 256), ("lambda_resnet26t", 2, 256),
                   ("inception_next_tiny", 1, 224), ("starnet_s1", 2, 224),
                   ("mobilenetv4_hybrid_medium", 2, 224), ("swiftformer_xs", 2, 224),
                   ("efficientvit_m0", 4, 224), ("cs3darknet_s", 2, 256),
                   ("mambaout_femto", 2, 224), ("caformer_s18", 1, 224),
                   ("regnetz_b16", 2, 224), ("gernet_s", 4, 224)):
    timm_model(_n, _b, _s)

# ------------------------------------------------------------------------------ torchvision
tv_model("swin3d_t", (1, 3, 8, 112, 112), sub="video")


class _Raft(torch.nn.Module):
    """raft_small on two frames, 4 refinement iterations; the output is the last flow."""

    def __init__(self):
        super().__init__()
        import torchvision
        self.raft = torchvision.models.optical_flow.raft_small(weights=None)

    def forward(self, a, b):
        return self.raft(a, b, num_flow_updates=4)[-1]


_add(ModelSpec("s_tv_raft_small", "survey", _Raft,
               lambda: (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128)), family="tv",
               note="2 frames 128x128, 4 updates"))

# --------------------------------------------------------------------------------- transformers
_ENC = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
            vocab_size=1000, max_position_embeddings=512, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
_DEC = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, vocab_size=1000, max_position_embeddings=512,
            attention_dropout=0.0)

hf_model("esm", "EsmModel", "EsmConfig", {**_ENC, "pad_token_id": 1, "mask_token_id": 2,
                                           "position_embedding_type": "rotary"}, ids())
hf_model("deberta", "DebertaModel", "DebertaConfig",
         {**_ENC, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
          "max_relative_positions": -1}, ids())
hf_model("led", "LEDModel", "LEDConfig",
         dict(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
              vocab_size=1000, attention_window=64, max_encoder_position_embeddings=512,
              max_decoder_position_embeddings=512, dropout=0.0, attention_dropout=0.0),
         ids(decoder_input_ids=lambda: torch.randint(4, 1000, (2, 32))), "seq 128, window 64")
hf_model("longformer", "LongformerModel", "LongformerConfig",
         {**_ENC, "attention_window": 64, "pad_token_id": 1}, ids(), "seq 128, window 64")
hf_model("prophetnet", "ProphetNetModel", "ProphetNetConfig",
         dict(hidden_size=256, encoder_ffn_dim=512, decoder_ffn_dim=512, num_encoder_layers=2,
              num_decoder_layers=2, num_encoder_attention_heads=4,
              num_decoder_attention_heads=4, vocab_size=1000, dropout=0.0,
              attention_dropout=0.0, activation_dropout=0.0, ngram=2),
         ids(decoder_input_ids=lambda: torch.randint(4, 1000, (2, 32))))
hf_model("bigbird", "BigBirdModel", "BigBirdConfig",
         {**_ENC, "attention_type": "block_sparse", "block_size": 16, "num_random_blocks": 2},
         ids(seq=256), "seq 256, block sparse (random blocks: eval mode only)")
hf_model("nystromformer", "NystromformerModel", "NystromformerConfig",
         {**_ENC, "num_landmarks": 32, "segment_means_seq_len": 128}, ids())
hf_model("rembert", "RemBertModel", "RemBertConfig",
         {**_ENC, "input_embedding_size": 128, "output_embedding_size": 256}, ids())
hf_model("yoso", "YosoModel", "YosoConfig", {**_ENC, "use_expectation": True,
                                              "use_fast_hash": False}, ids())
hf_model("ibert", "IBertModel", "IBertConfig", {**_ENC, "quant_mode": False}, ids())
hf_model("layoutlm", "LayoutLMModel", "LayoutLMConfig", _ENC,
         ids(bbox=lambda: torch.randint(0, 500, (2, 128, 4)).sort(-1).values))
hf_model("perceiver", "PerceiverModel", "PerceiverConfig",
         dict(num_latents=64, d_latents=256, d_model=128, num_blocks=1,
              num_self_attends_per_block=2, num_self_attention_heads=4,
              num_cross_attention_heads=1, attention_probs_dropout_prob=0.0),
         lambda: {"inputs": torch.randn(2, 128, 128)}, "64 latents over 128 inputs")
hf_model("data2vec_audio", "Data2VecAudioModel", "Data2VecAudioConfig",
         {**_ENC, "hidden_dropout": 0.0, "attention_dropout": 0.0, "feat_proj_dropout": 0.0,
          "layerdrop": 0.0, "mask_time_prob": 0.0, "num_conv_pos_embeddings": 16,
          "num_conv_pos_embedding_groups": 4}, audio(), "1 s of 16 kHz")
hf_model("hubert", "HubertModel", "HubertConfig",
         {**_ENC, "hidden_dropout": 0.0, "attention_dropout": 0.0, "feat_proj_dropout": 0.0,
          "layerdrop": 0.0, "mask_time_prob": 0.0}, audio(), "1 s of 16 kHz")
hf_model("sew", "SEWModel", "SEWConfig",
         {**_ENC, "hidden_dropout": 0.0, "attention_dropout": 0.0, "feat_proj_dropout": 0.0,
          "layerdrop": 0.0, "mask_time_prob": 0.0}, audio(), "1 s of 16 kHz")
hf_model("segformer", "SegformerForSemanticSegmentation", "SegformerConfig",
         dict(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=256,
              num_labels=19, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              drop_path_rate=0.0, classifier_dropout_prob=0.0), pixels(2, 256), "b0 widths")
hf_model("dpt", "DPTForDepthEstimation", "DPTConfig",
         dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
              intermediate_size=768, image_size=224, backbone_out_indices=[0, 1, 2, 3],
              neck_hidden_sizes=[48, 96, 192, 384], fusion_hidden_size=64,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), pixels(1, 224))
hf_model("mobilevit", "MobileViTModel", "MobileViTConfig", {"hidden_dropout_prob": 0.0},
         pixels(2, 256))
hf_model("convnextv2", "ConvNextV2Model", "ConvNextV2Config",
         dict(depths=[2, 2, 2, 2], hidden_sizes=[40, 80, 160, 320]), pixels(2, 224), "atto")
hf_model("dinov2", "Dinov2Model", "Dinov2Config",
         dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6, image_size=224,
              patch_size=14), pixels(2, 224))
hf_model("swinv2", "Swinv2Model", "Swinv2Config",
         dict(embed_dim=48, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24], window_size=7,
              image_size=224), pixels(2, 224))
hf_model("mamba", "MambaModel", "MambaConfig",
         dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000, state_size=16),
         ids(mask=False), "pure-torch scan (no mamba_ssm kernels)")
hf_model("rwkv", "RwkvModel", "RwkvConfig",
         dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000, context_length=256,
              attention_hidden_size=256, intermediate_size=1024), ids(mask=False))
hf_model("qwen2_moe", "Qwen2MoeModel", "Qwen2MoeConfig",
         {**_DEC, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
          "shared_expert_intermediate_size": 512}, ids(), "8 experts, top-2")
hf_model("mixtral", "MixtralModel", "MixtralConfig",
         {**_DEC, "num_local_experts": 4, "num_experts_per_tok": 2}, ids(), "4 experts, top-2")
hf_model("stablelm", "StableLmModel", "StableLmConfig", _DEC, ids())
hf_model("persimmon", "PersimmonModel", "PersimmonConfig",
         {k: v for k, v in _DEC.items() if k != "num_key_value_heads"}, ids())


# ----------------------------------------------------------- survey3: 36 more models, none tuned for
_S3 = "survey3"
for _n, _b, _s in (("sequencer2d_s", 1, 224), ("convit_tiny", 2, 224), ("cait_xxs24_224", 2, 224),
                   ("xcit_nano_12_p16_224", 2, 224), ("visformer_tiny", 2, 224),
                   ("gmlp_ti16_224", 2, 224), ("resnetv2_50x1_bit", 1, 224),
                   ("ese_vovnet19b_dw", 2, 224), ("coatnet_nano_rw_224", 1, 224),
                   ("davit_tiny", 1, 224), ("pvt_v2_b0", 2, 224), ("efficientvit_b0", 2, 224),
                   ("ghostnetv2_100", 2, 224), ("hgnetv2_b0", 2, 224), ("mobilevitv2_050", 2, 256),
                   ("mixer_s16_224", 2, 224), ("vit_relpos_small_patch16_224", 1, 224)):
    timm_model(_n, _b, _s, suite=_S3)
tv_model("googlenet", (2, 3, 224, 224), suite=_S3, aux_logits=False, init_weights=False)
tv_model("inception_v3", (1, 3, 299, 299), suite=_S3, aux_logits=False, init_weights=False)
_GPT = dict(n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=512, rotary_dim=32,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
for _name, _model, _cfg, _inputs, _note in (
        ("splinter", "SplinterModel", _ENC, ids(), ""),
        ("mra", "MraModel", _ENC, ids(), "multi-resolution attention"),
        ("convbert", "ConvBertModel", _ENC, ids(), ""),
        ("canine", "CanineModel", {**_ENC, "num_hash_buckets": 1000}, ids(seq=256, mask=False),
         "characters, seq 256"),
        ("funnel", "FunnelModel", dict(d_model=256, n_head=4, d_head=64, d_inner=1024,
                                       block_sizes=[1, 1, 1], vocab_size=1000, hidden_dropout=0.0,
                                       attention_dropout=0.0, activation_dropout=0.0), ids(), ""),
        ("xlnet", "XLNetModel", dict(d_model=256, n_layer=2, n_head=4, d_inner=1024,
                                     vocab_size=1000, dropout=0.0), ids(), ""),
        ("fnet", "FNetModel", dict(hidden_size=256, num_hidden_layers=2, intermediate_size=1024,
                                   vocab_size=1000, max_position_embeddings=512,
                                   hidden_dropout_prob=0.0), ids(mask=False), "FFT mixing"),
        ("phi3", "Phi3Model", {**_DEC, "pad_token_id": 0}, ids(), ""),
        ("gemma2", "Gemma2Model", {**_DEC, "head_dim": 64, "sliding_window": 64}, ids(),
         "sliding window 64, soft-capping"),
        ("olmo", "OlmoModel", _DEC, ids(), ""),
        ("cohere", "CohereModel", _DEC, ids(), ""),
        ("olmoe", "OlmoeModel", {**_DEC, "num_experts": 8, "num_experts_per_tok": 2}, ids(),
         "8 experts, top-2"),
        ("gpt_neox", "GPTNeoXModel", dict(hidden_size=256, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=1024,
                                          vocab_size=1000, max_position_embeddings=512), ids(), ""),
        ("codegen", "CodeGenModel", _GPT, ids(), ""),
        ("falcon", "FalconModel", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                       vocab_size=1000, alibi=True, multi_query=True,
                                       new_decoder_architecture=False, hidden_dropout=0.0,
                                       attention_dropout=0.0), ids(), "alibi, multi-query"),
        ("bloom", "BloomModel", dict(hidden_size=256, n_layer=2, n_head=4, vocab_size=1000,
                                     hidden_dropout=0.0, attention_dropout=0.0), ids(), "alibi"),
        ("siglip_vision", "SiglipVisionModel", dict(hidden_size=256, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=1024,
                                                    image_size=224, patch_size=16),
         pixels(2, 224), ""),
        ("mobilevitv2", "MobileViTV2Model", {}, pixels(2, 256), ""),
        ("wavlm", "WavLMModel", {**_ENC, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                                 "feat_proj_dropout": 0.0, "layerdrop": 0.0,
                                 "mask_time_prob": 0.0}, audio(), "1 s of 16 kHz")):
    hf_model(_name, _model, _model.replace("Model", "Config"), _cfg, _inputs, _note, suite=_S3)


# ------------------------------------------------ survey4: 10 more models a new user would try
_S4 = "survey4"
for _n, _b, _s in (("lcnet_050", 4, 224), ("ecaresnet26t", 2, 256), ("rdnet_tiny", 1, 224),
                   ("fasternet_t0", 2, 224)):
    timm_model(_n, _b, _s, suite=_S4)
tv_model("alexnet", (4, 3, 224, 224), suite=_S4)
for _name, _model, _cfg, _inputs, _note in (
        ("roformer", "RoFormerModel", {**_ENC, "embedding_size": 256}, ids(), "rotary"),
        ("squeezebert", "SqueezeBertModel", {**_ENC, "embedding_size": 256, "q_groups": 4,
                                             "k_groups": 4, "v_groups": 4, "post_attention_groups":
                                             4, "intermediate_groups": 4, "output_groups": 4},
         ids(), "grouped 1x1 convs"),
        ("mpnet", "MPNetModel", _ENC, ids(), "relative position buckets"),
        ("gpt_bigcode", "GPTBigCodeModel", dict(n_embd=256, n_layer=2, n_head=4, vocab_size=1000,
                                                n_positions=512, multi_query=True,
                                                bos_token_id=0, eos_token_id=0,
                                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
         ids(), "multi-query"),
        ("speech2text", "Speech2TextModel",
         dict(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
              vocab_size=1000, conv_channels=256, dropout=0.0, attention_dropout=0.0,
              activation_dropout=0.0),
         lambda: {"input_features": torch.randn(2, 400, 80),
                  "decoder_input_ids": torch.randint(4, 1000, (2, 32))},
         "4 s of 80 filterbanks, 32 decoder tokens")):
    hf_model(_name, _model, _model.replace("Model", "Config"), _cfg, _inputs, _note, suite=_S4)


# ------------------------------------------- survey5: 31 more models, in no suite and no survey
_S5 = "survey5"
for _n, _b, _s, _kw in (("tf_efficientnet_b0", 2, 224, {}), ("resnetblur18", 2, 224, {}),
                        ("sebotnet33ts_256", 1, 256, {}), ("nf_resnet26", 2, 224, {}),
                        ("convformer_s18", 1, 224, {}), ("twins_pcpvt_small", 1, 224, {}),
                        ("repvgg_a0", 2, 224, {}), ("hgnet_tiny", 2, 224, {}),
                        ("vit_small_patch14_dinov2", 1, 224, {"img_size": 224}),
                        ("swinv2_cr_tiny_ns_224", 1, 224, {}), ("gcresnet50t", 1, 224, {}),
                        ("coat_tiny", 1, 224, {})):
    timm_model(_n, _b, _s, suite=_S5, **_kw)
tv_model("vgg11_bn", (1, 3, 224, 224), suite=_S5)
tv_model("mobilenet_v3_small", (8, 3, 224, 224), suite=_S5)
tv_model("r2plus1d_18", (1, 3, 8, 112, 112), sub="video", suite=_S5)


class _SSDLite(torch.nn.Module):
    """ssdlite320 (eval: boxes after NMS); the outputs are the first image's boxes and scores."""

    def __init__(self):
        super().__init__()
        import torchvision
        self.det = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
            weights=None, weights_backbone=None, score_thresh=0.0)

    def train(self, mode: bool = True):
        """Inference only: the detector's training mode needs targets (the harness's BatchNorm
        calibration calls train())."""
        super().train(mode)
        self.det.eval()
        return self

    def forward(self, x):
        out = self.det(list(x))[0]
        return out["boxes"], out["scores"]


_add(ModelSpec("s_tv_ssdlite320", _S5, _SSDLite, _images((1, 3, 320, 320)), family="tv",
               note="1x3x320x320, eval-mode detection (NMS)"))
for _name, _model, _cfg, _inputs, _note in (
        ("gptj", "GPTJModel", _GPT, ids(), "rotary, parallel attn+MLP"),
        ("gemma3_text", "Gemma3TextModel", {**_DEC, "head_dim": 64, "sliding_window": 64}, ids(),
         "sliding window 64, qk-norm"),
        ("qwen3", "Qwen3Model", {**_DEC, "head_dim": 64}, ids(), "qk-norm"),
        ("starcoder2", "Starcoder2Model", {**_DEC, "sliding_window": None, "residual_dropout": 0.0,
                                           "embedding_dropout": 0.0}, ids(), ""),
        ("mpt", "MptModel", dict(d_model=256, n_heads=4, n_layers=2, expansion_ratio=4,
                                 max_seq_len=512, vocab_size=1000), ids(), "alibi"),
        ("mamba2", "Mamba2Model", dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000,
                                       state_size=16, num_heads=8, head_dim=64, n_groups=1,
                                       chunk_size=64), ids(mask=False),
         "pure-torch chunked scan"),
        ("wav2vec2_conformer", "Wav2Vec2ConformerModel",
         {**_ENC, "hidden_dropout": 0.0, "attention_dropout": 0.0, "feat_proj_dropout": 0.0,
          "layerdrop": 0.0, "mask_time_prob": 0.0, "position_embeddings_type": "rotary"},
         audio(), "1 s of 16 kHz, rotary"),
        ("longt5", "LongT5Model", dict(d_model=256, d_kv=64, d_ff=1024, num_layers=2,
                                       num_heads=4, vocab_size=1000, local_radius=32,
                                       global_block_size=16, dropout_rate=0.0,
                                       encoder_attention_type="transient-global"),
         ids(decoder_input_ids=lambda: torch.randint(4, 1000, (2, 32))), "transient-global"),
        ("switch_transformers", "SwitchTransformersModel",
         dict(d_model=256, d_kv=64, d_ff=512, num_layers=2, num_decoder_layers=2, num_heads=4,
              num_experts=4, vocab_size=1000, dropout_rate=0.0, router_jitter_noise=0.0,
              encoder_sparse_step=1, decoder_sparse_step=1),
         ids(decoder_input_ids=lambda: torch.randint(4, 1000, (2, 32))), "4 experts, top-1"),
        ("reformer", "ReformerModel",
         dict(hidden_size=256, num_attention_heads=4, attention_head_size=64,
              attn_layers=["local", "lsh"], axial_pos_embds=False, max_position_embeddings=512,
              vocab_size=1000, feed_forward_size=512, local_attn_chunk_length=64,
              lsh_attn_chunk_length=64, num_hashes=1, num_buckets=4, hash_seed=0,
              hidden_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
              local_attention_probs_dropout_prob=0.0, is_decoder=False),
         ids(), "local + LSH attention, reversible layers"),
        ("vit_mae", "ViTMAEModel", dict(hidden_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=1024,
                                        image_size=224, patch_size=16),
         lambda: {"pixel_values": torch.randn(2, 3, 224, 224), "noise": torch.rand(2, 196)},
         "75% masking from a given noise"),
        ("modernbert", "ModernBertModel", dict(hidden_size=256, num_hidden_layers=3,
                                               num_attention_heads=4, intermediate_size=512,
                                               vocab_size=1000, local_attention=64,
                                               global_attn_every_n_layers=3,
                                               max_position_embeddings=512, pad_token_id=0),
         ids(), "local attention 64, global every 3rd"),
        ("lfm2", "Lfm2Model", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=512, vocab_size=1000,
                                   layer_types=["conv", "full_attention"],
                                   max_position_embeddings=512), ids(), "short conv + attention"),
        ("deepseek_v3", "DeepseekV3Model",
         dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              intermediate_size=512, moe_intermediate_size=128, vocab_size=1000,
              kv_lora_rank=64, q_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
              v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
              first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=512),
         ids(), "MLA + 8 experts top-2"),
        ("ast", "ASTModel", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=1024, max_length=256, num_mel_bins=128),
         lambda: {"input_values": torch.randn(2, 256, 128)}, "256 frames x 128 mel")):
    hf_model(_name, _model, _model.replace("Model", "Config"), _cfg, _inputs, _note, suite=_S5)


# ------------------------------------------------------------------------------------ runner
_LOG = {"breaks": re.compile(r"\[ember:graph_breaks\] (.*)"),
        "fallback_log": re.compile(r"\[ember:fallbacks\] (.*)"),
        "recompile_log": re.compile(r"\[ember:recompiles\] (.*)")}


def _log_fields(path: str) -> dict:
    out: dict[str, list[str]] = {k: [] for k in _LOG}
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        for key, rx in _LOG.items():
            m = rx.search(line)
            if m and m.group(1)[:400] not in out[key]:
                out[key].append(m.group(1)[:400])
    out["warnings"] = sorted({ln.strip()[:300] for ln in lines if "ember:" in ln
                              and "Warning" in ln})[:8]
    return out


def run_one(name: str, mode: str, args) -> list[dict]:
    env, _ = hygiene.child_env(1)
    env["EMBER_LOGS"] = "graph_breaks,fallbacks,recompiles"
    if args.no_speed_check:
        env["EMBER_SPEED_CHECK"] = "0"
    with tempfile.TemporaryDirectory(prefix="ember-survey-") as tmp:
        out, log = os.path.join(tmp, "out.jsonl"), os.path.join(tmp, "log.txt")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--models", name,
               "--modes", mode, "--reps", str(args.reps), "--out", out] + ["--torch"] * args.torch
        records, outcome, wall = harness.run_worker(cmd, env, args.timeout, out, log)
        have = {r["compiler"] for r in records}
        for c in ("eager", "ember"):
            if c not in have:
                records.append({"model": name, "mode": mode, "compiler": c,
                                "status": "timeout" if outcome and "timeout" in outcome
                                else "crash", "error": f"{outcome}; {harness._tail(log)}"})
        extra = _log_fields(log)
        for r in records:
            r.update(extra, subprocess_wall_s=round(wall, 1),
                     speed_check=not args.no_speed_check)
        return records


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2g}"


def _summary(recs: list[dict]) -> str:
    e = next((r for r in recs if r["compiler"] == "ember"), {})
    st = e.get("ember_stats", {}).get("counts", {}) if isinstance(e.get("ember_stats"), dict) \
        else {}
    sp = e.get("speedup")
    t = next((r for r in recs if r["compiler"] == "torch"), None)
    tcol = "" if t is None else f"eager/torch={_fmt(t.get('speedup'))} "
    return (f"{e.get('model')} {e.get('mode')}: {e.get('status')} graphs={e.get('graphs')} "
            f"breaks={st.get('graph_breaks', 0)} fallbacks={st.get('fallbacks', 0)} "
            f"rel_err={_fmt(e.get('rel_err'))} "
            f"eager/ember={_fmt(sp)} {tcol}compile={_fmt(e.get('compile_s'))}s "
            f"{(e.get('error') or '')[:200]}")


def table(paths: list[str]) -> str:
    """A markdown table of the ember rows of JSON-lines files (a later file's row of a model and
    mode replaces an earlier one's)."""
    rows: dict = {}
    eager: dict = {}
    inductor: dict = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                key = (r["model"], r["mode"])
                if r.get("compiler") == "ember":
                    rows[key] = r
                    inductor.pop(key, None)      # a later run without the column drops it
                elif r.get("compiler") == "eager":
                    eager[key] = r
                elif r.get("compiler") == "torch":
                    inductor[key] = r
    out = ["| model | mode | status | path | graphs | breaks | fallbacks | max rel err | "
           "eager/ember (min-max of rounds) | eager/torch | compile s ember / torch | "
           "first break or error |", "|" + "---|" * 12]
    for (model, mode), r in sorted(rows.items()):
        counts = (r.get("ember_stats") or {}).get("counts", {})
        te, tc = (eager.get((model, mode)) or {}).get("times") or [], r.get("times") or []
        ratios = [a / b for a, b in zip(te, tc)]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
        t = inductor.get((model, mode)) or {}
        why = (r.get("breaks") or [r.get("error") or ""])[0]
        why = re.sub(r".*site-packages/", "", why).replace("|", "/")[:110]
        out.append(f"| {model[2:]} | {mode} | {r.get('status')} | {r.get('backend') or '-'} | "
                   f"{r.get('graphs')} | {counts.get('graph_breaks', 0)} | "
                   f"{len(r.get('fallback_log') or [])} | {_fmt(r.get('rel_err'))} | "
                   f"{_fmt(r.get('speedup'))}{spread} | {_fmt(t.get('speedup'))} | "
                   f"{_fmt(r.get('compile_s'))} / {_fmt(t.get('compile_s'))} | {why} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="")
    p.add_argument("--suite", default="", help="only this suite's models (survey, survey3, survey4)")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--timeout", type=int, default=420)
    p.add_argument("--out", default="")
    p.add_argument("--list", action="store_true")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print a markdown table of runs")
    p.add_argument("--no-speed-check", action="store_true", help="EMBER_SPEED_CHECK=0")
    p.add_argument("--torch", action="store_true", help="also time torch.compile (Inductor)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or [
        n for n, s in SPECS.items() if not args.suite or s.suite == args.suite]
    names = [n if n in SPECS else f"s_{n}" for n in names]
    if args.table:
        print(table(args.table))
        return 0
    if args.list:
        print("\n".join(f"{n}  ({SPECS[n].note})" for n in names))
        return 0
    if args.worker:
        hygiene.apply_threads()
        with open(args.out, "a") as f:
            def emit(rec):
                f.write(json.dumps(rec, default=str) + "\n")
                f.flush()
            harness.measure(SPECS[names[0]], args.modes, ["ember"] + ["torch"] * args.torch,
                            args.reps, 1, "ember", "ember", False, emit)
        return 0
    for name in names:
        for mode in args.modes.split(","):
            recs = run_one(name, mode, args)
            print(_summary(recs), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    for r in recs:
                        f.write(json.dumps(r, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
