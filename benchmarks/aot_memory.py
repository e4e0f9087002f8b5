"""Saved-tensor bytes of one training step: eager PyTorch vs ember's aot stage (aot_eager).

Both sides are measured the same way, with torch.autograd.graph.saved_tensors_hooks around the
forward: every tensor autograd saves for the backward is seen once; bytes are counted once per
storage. For ember the saved tensors are what its compiled forward hands to save_for_backward.
"activations" leaves out the parameters and the input batch (both sides keep those anyway).

    .venv/bin/python benchmarks/aot_memory.py [--models resnet18,gpt2] [--json out.jsonl]

memory compression ratio = eager bytes / ember bytes (target >= 1.0).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import ember


def _storage_key(t: torch.Tensor):
    return (t.device.type, t.untyped_storage().data_ptr())


def saved_bytes(run, inputs: dict, exclude: set) -> dict:
    storages: dict = {}

    def pack(t):
        if t.device.type != "meta":
            storages.setdefault(_storage_key(t), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(**inputs)
    loss = out.loss if hasattr(out, "loss") else out.square().mean()
    loss.backward()
    total = sum(storages.values())
    acts = sum(b for k, b in storages.items() if k not in exclude)
    return {"total_bytes": total, "activation_bytes": acts, "tensors": len(storages)}


def resnet18():
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000)
    return model, {"x": torch.randn(8, 3, 224, 224)}


def gpt2():
    import transformers
    cfg = transformers.GPT2Config()            # GPT-2 small: 12 layers, 768 wide, 124M params
    cfg.bos_token_id = cfg.eos_token_id = 0
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


MODELS = {"resnet18": resnet18, "gpt2": gpt2}


def measure(name: str, partitioner: str = "min_cut") -> dict:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train()
    exclude = {_storage_key(p) for p in model.parameters()}
    exclude |= {_storage_key(b) for b in model.buffers()}
    exclude |= {_storage_key(v) for v in inputs.values()}
    eager = saved_bytes(model, inputs, exclude)
    model.zero_grad(set_to_none=True)
    backend = ember.get_backend("aot_eager")
    compiled = torch.compile(model, backend=lambda gm, ex: backend(gm, ex, options={"partitioner": partitioner}),
                             dynamic=False)
    start = time.perf_counter()
    out = compiled(**inputs)                   # compile outside the measured step
    (out.loss if hasattr(out, "loss") else out.square().mean()).backward()
    compile_s = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    ours = saved_bytes(compiled, inputs, exclude)
    torch._dynamo.reset()
    return {"model": name, "partitioner": partitioner, "eager": eager, "ember": ours,
            "ratio_activations": eager["activation_bytes"] / max(ours["activation_bytes"], 1),
            "ratio_total": eager["total_bytes"] / max(ours["total_bytes"], 1),
            "first_step_s": round(compile_s, 1)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,gpt2")
    ap.add_argument("--partitioners", default="min_cut,default")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [measure(m, p) for m in args.models.split(",") for p in args.partitioners.split(",")]
    mb = 1 / 2 ** 20
    print(f"{'model':10} {'partitioner':11} {'eager act MB':>12} {'ember act MB':>12} {'ratio':>6} "
          f"{'eager all MB':>12} {'ember all MB':>12} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:10} {r['partitioner']:11} {r['eager']['activation_bytes'] * mb:12.1f} "
              f"{r['ember']['activation_bytes'] * mb:12.1f} {r['ratio_activations']:6.2f} "
              f"{r['eager']['total_bytes'] * mb:12.1f} {r['ember']['total_bytes'] * mb:12.1f} "
              f"{r['ratio_total']:6.2f}")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
