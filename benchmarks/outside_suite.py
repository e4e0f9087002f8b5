"""outside_suite.py MODELS [REPS] [OUT.jsonl] [--train]: eager vs ember on timm models that are in
none of ember's suites (a check that speed and correctness generalize beyond `ember bench`).
Inference (no_grad, eval) by default; --train times a training step (train mode, forward, the
output's mean, backward; dropout/drop-path as the model builds them at p=0 by default) and checks
the parameter gradients too: the largest error over parameters, each against its own max |eager
grad| or 1e-3 of the largest gradient of the model, whichever is larger (a bias followed by a
norm has a gradient that is zero up to rounding, ~1e-11: its own scale would be meaningless).

MODELS is a comma list of timm names (random weights, pretrained=False, the model's own input
size, batch 4). Per model: the compiled copy (`ember.compile` of a deep copy: ember compiles a
module in place) is checked against eager (max |err| / max |eager|; a head initialised to zero
gives an all-zero output: then the absolute error) and timed paired, alternating,
thread CPU at one thread, REPS rounds (default 7): the median of per-round eager/ember ratios
with the min-max. The speed check is on (the product default), so its re-timing of a close
graph shows as one slow ember round (the low end of the spread). One JSON line per model.
Run with MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 and a fresh
EMBER_CACHE_DIR, as the bench harness does.
"""
import copy
import json
import os
import statistics
import sys
import time
import warnings

import timm
import torch

import ember


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    scale = max(b.abs().max().item(), floor)
    return (a - b).abs().max().item() / (scale or 1.0)


def measure(name: str, reps: int, train: bool) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).train(train)
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    x = torch.randn(4, *size)

    def step(m):
        if not train:
            return m(x)
        m.zero_grad(set_to_none=True)
        out = m(x)
        out.mean().backward()
        return out
    with torch.set_grad_enabled(train):
        compiled = copy.deepcopy(model)
        ref = step(model)
        t0 = time.perf_counter()
        ember.compile(compiled)
        out = step(compiled)
        compile_s = time.perf_counter() - t0
        err = _rel(out.detach(), ref.detach())
        if train:
            pairs = [(p.grad, q.grad) for p, q in zip(compiled.parameters(), model.parameters())
                     if q.grad is not None]
            floor = 1e-3 * max(g.abs().max().item() for _, g in pairs)
            err = max([err] + [_rel(a, b, floor) for a, b in pairs])
        for _ in range(2):
            step(model), step(compiled)
        times = {"eager": [], "ember": []}
        for r in range(reps):
            pairs = [("eager", model), ("ember", compiled)]
            for key, m in (pairs if r % 2 == 0 else pairs[::-1]):
                t = time.thread_time()
                step(m)
                times[key].append(time.thread_time() - t)
    ratios = sorted(e / k for e, k in zip(times["eager"], times["ember"]))
    return dict(model=name, input=list(size), eager_ms=statistics.median(times["eager"]) * 1e3,
                ember_ms=statistics.median(times["ember"]) * 1e3, ratio=statistics.median(ratios),
                lo=ratios[0], hi=ratios[-1], err=err, mode="train" if train else "infer",
                compile_s=compile_s, fallbacks=ember.stats()["counts"].get("fallbacks", 0),
                load=os.getloadavg()[0])


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    train = "--train" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--train"]
    names = args[0].split(",")
    reps = int(args[1]) if len(args) > 1 else 7
    out = open(args[2], "a") if len(args) > 2 else None
    for name in names:
        try:
            rec = measure(name, reps, train)
        except Exception as exc:  # noqa: BLE001 - recorded, the next model goes on
            rec = dict(model=name, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        print(json.dumps(rec), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
