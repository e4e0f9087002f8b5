"""Eager vs ember at inference on an HF model family built from a small config (random weights,
no download), thread CPU time per call, alternating order: for families outside the broad suite.
For a before/after A/B run it alternately with PYTHONPATH on each tree:

    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/hf_config_ab.py bloom --reps 7
"""
import argparse
import copy
import os

import torch
import transformers

import ember
from infer_ab import report

_W = dict(hidden_size=512, num_attention_heads=8, vocab_size=8192)
#: family: (model class, config class, config, batch, sequence)
MODELS = {
    "bloom": ("BloomModel", "BloomConfig", dict(n_layer=4, n_head=8, hidden_size=512,
                                                vocab_size=8192), 2, 256),
    "biogpt": ("BioGptModel", "BioGptConfig", dict(_W, num_hidden_layers=4,
                                                   intermediate_size=2048), 2, 256),
    "xglm": ("XGLMModel", "XGLMConfig", dict(d_model=512, num_layers=4, attention_heads=8,
                                             ffn_dim=2048, vocab_size=8192), 2, 256),
    "mpnet": ("MPNetModel", "MPNetConfig", dict(_W, num_hidden_layers=4,
                                                intermediate_size=2048), 4, 128),
    "falcon": ("FalconModel", "FalconConfig", dict(_W, num_hidden_layers=4, num_kv_heads=8,
                                                   new_decoder_architecture=False), 2, 256),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tag", default=os.environ.get("TAG", ""))
    a = ap.parse_args()
    torch.set_num_threads(1)
    cls, cfg_cls, cfg, b, s = MODELS[a.model]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**cfg)
    for k in ("hidden_dropout", "attention_dropout", "dropout", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "activation_dropout"):
        if hasattr(config, k):
            setattr(config, k, 0.0)
    config.use_cache = False
    m = getattr(transformers, cls)(config).eval()
    ids = torch.randint(3, 8192, (b, s))
    eager, comp = copy.deepcopy(m), ember.compile(copy.deepcopy(m))

    def step(f):
        with torch.no_grad():
            return f(input_ids=ids).last_hidden_state
    want, got = step(eager), step(comp)
    report(step, eager, comp, a, ((got - want).abs().max() / want.abs().max()).item())


if __name__ == "__main__":
    main()
