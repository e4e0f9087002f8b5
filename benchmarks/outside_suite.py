"""outside_suite.py MODELS [REPS] [OUT.jsonl] [--train] [--source timm|hf|tv]: eager vs ember on
models that are in none of ember's suites (a check that speed and correctness generalize beyond
`ember bench`). Inference (no_grad, eval) by default; --train times a training step (train mode,
forward, the mean of every floating output, backward; dropout/drop-path at p=0) and checks the
parameter gradients too: the largest error over parameters, each against its own max |eager
grad| or 1e-3 of the largest gradient of the model, whichever is larger (a bias followed by a
norm has a gradient that is zero up to rounding, ~1e-11: its own scale would be meaningless).

MODELS is a comma list of names of the source (all random weights, nothing downloads):
- timm (default): timm names, pretrained=False, the model's own input size, batch 4;
- hf: keys of HF below: transformers models built from small configs (2 layers, hidden 256,
  sequence 128, batch 2; images 224x224, audio 1 s at 16 kHz), dropout 0; `all` runs the table;
- tv: keys of TV below: torchvision models in no suite (weights=None), `all` runs the table.
Per model: the compiled copy (`ember.compile` of a deep copy: ember compiles a module in place)
is checked against eager over every tensor output (max |err| / max |eager|; a head initialised
to zero gives an all-zero output: then the absolute error; eager_err is eager's own error on
the outputs against the model in float64, the scale to read err against) and timed paired, alternating,
thread CPU at one thread, REPS rounds (default 7): the median of per-round eager/ember ratios
with the min-max. The record also holds ember's counters for the model (graphs, breaks,
recompiles, fallbacks; ember.reset() before each model) and the messages of the graph_breaks /
fallbacks / recompiles logs (run with EMBER_LOGS=graph_breaks,fallbacks,recompiles to fill
them). The speed check is on (the product default), so its re-timing of a close graph shows as
one slow ember round (the low end of the spread). One JSON line per model. Run with
MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 and a fresh
EMBER_CACHE_DIR, as the bench harness does.
"""
import copy
import json
import logging
import os
import statistics
import sys
import time
import warnings

import torch
from torch.utils._pytree import tree_leaves

import ember

# ------------------------------------------------------------------------------------ HF table
_V, _S, _B = 8192, 128, 2
_TEXT = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
             vocab_size=_V, max_position_embeddings=512, use_cache=False)
_VISION = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
               image_size=224)
_SEQ2SEQ = dict(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                vocab_size=_V, max_position_embeddings=512, use_cache=False, pad_token_id=0,
                decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)
_AUDIO = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
              apply_spec_augment=False, mask_time_prob=0.0, layerdrop=0.0)


def _ids(b=_B, s=_S, **extra):
    return lambda: {"input_ids": torch.randint(4, _V, (b, s)),
                    "attention_mask": torch.ones(b, s, dtype=torch.long), **extra}


def _s2s(b=_B, s=_S):
    return lambda: {**_ids(b, s)(), "decoder_input_ids": torch.randint(4, _V, (b, s // 2))}


def _pixels(b=_B, size=224):
    return lambda: {"pixel_values": torch.randn(b, 3, size, size)}


def _audio(b=_B):
    return lambda: {"input_values": torch.randn(b, 16000)}


def _layout_inputs():
    box = torch.randint(0, 500, (_B, _S, 2))
    return {**_ids()(), "bbox": torch.cat([box, box + torch.randint(0, 500, (_B, _S, 2))], -1)}


#: name -> (transformers model class prefix, config, inputs)
HF = {
    "mobilebert": ("MobileBert", {**_TEXT, "embedding_size": 128, "true_hidden_size": 128,
                                  "intra_bottleneck_size": 128, "num_feedforward_networks": 2},
                   _ids()),
    "funnel": ("Funnel", dict(d_model=256, n_head=4, d_head=64, d_inner=1024, block_sizes=[1, 1],
                              vocab_size=_V), _ids()),
    "squeezebert": ("SqueezeBert", {**_TEXT, "embedding_size": 256}, _ids()),
    "convbert": ("ConvBert", {**_TEXT, "embedding_size": 256}, _ids()),
    "xlnet": ("XLNet", dict(d_model=256, n_layer=2, n_head=4, d_inner=1024, vocab_size=_V,
                            use_mems_train=False), _ids()),
    "layoutlm": ("LayoutLM", _TEXT, _layout_inputs),
    "canine": ("Canine", {**_TEXT, "num_hash_buckets": 4096, "vocab_size": 4096}, _ids()),
    "megatron_bert": ("MegatronBert", _TEXT, _ids()),
    "nystromformer": ("Nystromformer", {**_TEXT, "num_landmarks": 32, "segment_means_seq_len": _S},
                      _ids()),
    "yoso": ("Yoso", _TEXT, _ids()),
    "ernie": ("Ernie", _TEXT, _ids()),
    "gpt_bigcode": ("GPTBigCode", dict(n_embd=256, n_layer=2, n_head=4, vocab_size=_V,
                                       n_positions=512, use_cache=False, bos_token_id=0,
                                       eos_token_id=0), _ids()),
    "falcon": ("Falcon", {**_TEXT, "new_decoder_architecture": False, "multi_query": True}, _ids()),
    "gemma": ("Gemma", {**_TEXT, "num_key_value_heads": 2, "head_dim": 64}, _ids()),
    "bloom": ("Bloom", dict(hidden_size=256, n_layer=2, n_head=4, vocab_size=_V, use_cache=False),
              _ids()),
    "mpt": ("Mpt", dict(d_model=256, n_layers=2, n_heads=4, vocab_size=_V, max_seq_len=512,
                        use_cache=False), _ids()),
    "codegen": ("CodeGen", dict(n_embd=256, n_layer=2, n_head=4, rotary_dim=32, vocab_size=_V,
                                n_positions=512, n_ctx=512, use_cache=False), _ids()),
    "gptj": ("GPTJ", dict(n_embd=256, n_layer=2, n_head=4, rotary_dim=32, vocab_size=_V,
                          n_positions=512, use_cache=False), _ids()),
    "gpt_neox": ("GPTNeoX", _TEXT, _ids()),
    "stablelm": ("StableLm", {**_TEXT, "num_key_value_heads": 4}, _ids()),
    "marian": ("Marian", _SEQ2SEQ, _s2s()),
    "pegasus": ("Pegasus", _SEQ2SEQ, _s2s()),
    "mbart": ("MBart", _SEQ2SEQ, _s2s()),
    "blenderbot_small": ("BlenderbotSmall", _SEQ2SEQ, _s2s()),
    "led": ("LED", {**_SEQ2SEQ, "attention_window": 32, "max_encoder_position_embeddings": 512,
                    "max_decoder_position_embeddings": 512}, _s2s()),
    "hubert": ("Hubert", _AUDIO, _audio()),
    "sew": ("SEW", _AUDIO, _audio()),
    "data2vec_audio": ("Data2VecAudio", _AUDIO, _audio()),
    "beit": ("Beit", _VISION, _pixels()),
    "deit": ("DeiT", _VISION, _pixels()),
    "dinov2": ("Dinov2", {**_VISION, "patch_size": 14}, _pixels()),
    "yolos": ("Yolos", {**_VISION, "image_size": [224, 224], "num_detection_tokens": 10},
              _pixels()),
    "convnext": ("ConvNext", dict(depths=[1, 1, 2, 1], hidden_sizes=[48, 96, 192, 384]),
                 _pixels()),
    "regnet": ("RegNet", dict(depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 160, 384],
                              groups_width=16), _pixels()),
    "mobilevit": ("MobileViT", dict(image_size=256), _pixels(size=256)),
    "levit": ("Levit", {}, _pixels()),
    "segformer": ("Segformer", {}, _pixels()),
}


def _hf(name: str):
    import transformers
    prefix, cfg, inputs = HF[name]
    model = getattr(transformers, prefix + "Model")(getattr(transformers, prefix + "Config")(**cfg))
    return model, inputs()


# ------------------------------------------------------------------------------------ TV table
#: name -> (keyword arguments of the builder, input shape)
TV = {
    "googlenet": (dict(aux_logits=False, init_weights=True), (4, 3, 224, 224)),
    "inception_v3": (dict(aux_logits=False, init_weights=True), (2, 3, 299, 299)),
    "alexnet": ({}, (4, 3, 224, 224)),
    "regnet_x_400mf": ({}, (4, 3, 224, 224)),
    "efficientnet_b1": ({}, (4, 3, 240, 240)),
    "shufflenet_v2_x0_5": ({}, (8, 3, 224, 224)),
    "r3d_18": ({}, (1, 3, 8, 112, 112)),
    "mc3_18": ({}, (1, 3, 8, 112, 112)),
    "r2plus1d_18": ({}, (1, 3, 8, 112, 112)),
    "raft_small": ({}, None),
}


def _tv(name: str):
    import torchvision
    kw, shape = TV[name]
    video = getattr(torchvision.models.video, name, None) if shape and len(shape) == 5 else None
    if name.startswith("raft"):
        model = getattr(torchvision.models.optical_flow, name)(weights=None)
        return model, {"image1": torch.randn(1, 3, 128, 128), "image2": torch.randn(1, 3, 128, 128),
                       "num_flow_updates": 4}
    model = (video or getattr(torchvision.models, name))(weights=None, **kw)
    return model, {"x": torch.randn(*shape)}


def _timm(name: str):
    import timm
    model = timm.create_model(name, pretrained=False)
    return model, {"x": torch.randn(4, *model.pretrained_cfg.get("input_size", (3, 224, 224)))}


SOURCES = {"timm": _timm, "hf": _hf, "tv": _tv}


def _no_dropout(model: torch.nn.Module) -> None:
    """Every dropout at p=0, so eager and ember compute the same function in training (modules,
    and the float probabilities attention layers keep as attributes)."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for k, v in vars(m).items():
            if "drop" in k and isinstance(v, float):
                setattr(m, k, 0.0)


# ------------------------------------------------------------------------------------ measure
def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    scale = max(b.abs().max().item(), floor)
    return (a - b).abs().max().item() / (scale or 1.0)


def _tensors(out) -> list:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _eager_error(model, inputs, ref) -> float:
    """Eager's own float32 error on the outputs, against the model run in float64: the scale
    an ember error compares to (a random-init model whose activations shrink to denormals has
    an output that float32 cannot resolve at all)."""
    m64 = copy.deepcopy(model).double()
    try:
        with torch.no_grad():
            exact = _tensors(m64(**{k: v.double() if isinstance(v, torch.Tensor) and
                                    v.is_floating_point() else v for k, v in inputs.items()}))
    except RuntimeError:        # a model that builds float32 tensors of its own (RAFT's grids)
        return float("nan")
    return max(_rel(a.detach().double(), b) for a, b in zip(ref, exact) if b.numel())


class _Log(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage()[:300])


def measure(name: str, source: str, reps: int, train: bool) -> dict:
    torch.manual_seed(0)
    model, inputs = SOURCES[source](name)
    model.train(train)
    _no_dropout(model)

    def step(m):
        if not train:
            return m(**inputs)
        m.zero_grad(set_to_none=True)
        out = m(**inputs)
        sum(t.float().mean() for t in _tensors(out) if t.requires_grad).backward()
        return out
    ember.reset()
    log = _Log()
    loggers = [logging.getLogger(f"ember.{a}") for a in ("graph_breaks", "fallbacks", "recompiles")]
    for lg in loggers:
        lg.addHandler(log)
    try:
        with torch.set_grad_enabled(train):
            compiled = copy.deepcopy(model)
            ref = _tensors(step(model))
            t0 = time.perf_counter()
            ember.compile(compiled)
            out = _tensors(step(compiled))
            compile_s = time.perf_counter() - t0
            err = max(_rel(a.detach().float(), b.detach().float())
                      for a, b in zip(out, ref) if b.numel())
            if len(out) != len(ref):
                err = float("inf")
            if train:
                pairs = [(p.grad, q.grad) for p, q in zip(compiled.parameters(), model.parameters())
                         if q.grad is not None]
                floor = 1e-3 * max(g.abs().max().item() for _, g in pairs)
                err = max([err] + [_rel(a, b, floor) if a is not None else float("inf")
                                   for a, b in pairs])
            eager_err = _eager_error(model, inputs, ref)
            for _ in range(2):
                step(model), step(compiled)
            counts = dict(ember.stats()["counts"])
            times = {"eager": [], "ember": []}
            for r in range(reps):
                order = [("eager", model), ("ember", compiled)]
                for key, m in (order if r % 2 == 0 else order[::-1]):
                    t = time.thread_time()
                    step(m)
                    times[key].append(time.thread_time() - t)
    finally:
        for lg in loggers:
            lg.removeHandler(log)
    ratios = sorted(e / k for e, k in zip(times["eager"], times["ember"]))
    return dict(model=name, source=source, eager_ms=statistics.median(times["eager"]) * 1e3,
                ember_ms=statistics.median(times["ember"]) * 1e3, ratio=statistics.median(ratios),
                lo=ratios[0], hi=ratios[-1], err=err, eager_err=eager_err,
                mode="train" if train else "infer",
                compile_s=compile_s, graphs=counts.get("graphs", 0),
                breaks=counts.get("graph_breaks", 0), recompiles=counts.get("recompiles", 0),
                fallbacks=counts.get("fallbacks", 0), eager_calls=counts.get("eager_calls", 0),
                log=log.lines[:20],
                load=os.getloadavg()[0])


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    argv = sys.argv[1:]
    train = "--train" in argv
    source = argv[argv.index("--source") + 1] if "--source" in argv else "timm"
    args = [a for i, a in enumerate(argv)
            if a != "--train" and a != "--source" and (i == 0 or argv[i - 1] != "--source")]
    names = list({"hf": HF, "tv": TV}[source]) if args[0] == "all" else args[0].split(",")
    reps = int(args[1]) if len(args) > 1 else 7
    out = open(args[2], "a") if len(args) > 2 else None
    for name in names:
        try:
            rec = measure(name, source, reps, train)
        except Exception as exc:  # noqa: BLE001 - recorded, the next model goes on
            rec = dict(model=name, source=source, mode="train" if train else "infer",
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")
        print(json.dumps(rec), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
