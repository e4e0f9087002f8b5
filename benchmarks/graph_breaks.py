"""Graphs and graph breaks per model: ember's capture next to Dynamo's (torch._dynamo.explain is
allowed here: benchmarks measure against the peer). HF models from small configs, in their
default code paths, plus the chatty test models (logging, warnings, `.item()`, print).

    python benchmarks/graph_breaks.py

Prints one row per model: ember graphs/breaks, Dynamo graphs/breaks, and whether ember's output
matches eager (max abs error)."""
from __future__ import annotations

import copy
import sys
import warnings

import torch
import transformers

import ember

sys.path.insert(0, ".")
from tests.models.test_hf_breaks import _bert, _gpt2, _ids  # noqa: E402


def _small(cls, cfg_cls, **kw):
    return lambda: cls(cfg_cls(**kw)).eval()


MODELS = {
    "gpt2 (GPT2LMHeadModel)": _small(transformers.GPT2LMHeadModel, transformers.GPT2Config,
                                     vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                                     n_positions=32),
    "bert (BertForMaskedLM)": _small(transformers.BertForMaskedLM, transformers.BertConfig,
                                     vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=32),
    "chatty bert (logger, warnings, .item())": lambda: _bert().eval(),   # called with labels
    "chatty gpt2 (print between model and loss)": lambda: _gpt2().eval(),
}


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def main():
    ids = _ids()
    print(f"{'model':45s} {'ember g/b':>10s} {'dynamo g/b':>11s} {'max err':>9s}")
    for name, make in MODELS.items():
        model = make()
        args = (ids, ids) if name.startswith("chatty bert") else (ids,)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = _first(model(*args))
            ember.reset()
            e = ember.explain(copy.deepcopy(model), *args)
            got = _first(ember.compile(copy.deepcopy(model))(*args))
            torch._dynamo.reset()
            d = torch._dynamo.explain(copy.deepcopy(model))(*args)
        err = (got - ref).abs().max().item()
        print(f"{name:45s} {e.graph_count:>4d}/{e.break_count:<5d} "
              f"{d.graph_count:>5d}/{d.graph_break_count:<5d} {err:9.1e}")


if __name__ == "__main__":
    main()
