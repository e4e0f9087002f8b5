"""Precision survey: is ember's float32 as accurate as eager's? Both against float64 eager.

    PYTHONPATH=. python benchmarks/precision_survey.py [--models REGEX] [--patterns REGEX]
        [--modes infer,train] [--scale 1.0] [--timeout 600] [--out results.jsonl]
    PYTHONPATH=. python benchmarks/precision_survey.py --table results.jsonl

Rows: the models of `ember bench`'s registry (broad suite and the small suites, built by
`suites.instantiate`: seeded weights, BatchNorm calibrated), a few models in no suite (EXTRA:
timm nf_resnet26, whose weight-standardized convs amplify a mean's rounding), and the op-sweep
patterns of benchmarks/op_sweep.py (prefix "op:"). `--models` / `--patterns` select by regex
(nothing is run unless one is given; "." selects all).

Per row and mode, one subprocess (a crash or a hang is a row): the same weights and inputs run
in eager float64, eager float32 and ember float32 (EMBER_SPEED_CHECK=0, so ember's own kernels,
never its aten fallback; EMBER_STRICT=1). `infer` compares the outputs under no_grad; `train`
compares the outputs and every parameter (and input) gradient of one forward+backward (models:
the bench's `reduce_loss`; patterns: fixed random output gradients, as op_sweep does).
Per tensor two errors against fp64: relative L2 (||a - r|| / ||r||) and max-abs over the
tensor's largest |r|. A row's `ratio` is the worst over its tensors of
err(ember32) / max(err(eager32), FLOOR) in relative L2 (FLOOR: a correctly rounded float32
tensor is ~3e-8 off, so an exact eager does not make a rounding of ember's a 100x "loss");
rows with ratio > FLAG are flagged. `gm` is the geometric mean of the per-tensor ratios: in
training a ReLU net's worst tensor can be kink noise (an activation within rounding of 0 flips
side in one compiler and not the other: 1e-3 gradient errors in eager and ember alike, on
different tensors); a class of lost precision moves the geomean too.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOOR = 1e-7
FLAG = 4.0


# ------------------------------------------------------------------------------- the rows
def _extra_specs() -> dict:
    import torch
    from ember.bench.spec import ModelSpec

    def timm_model(name, batch=2, size=224, tag="", **kw):
        def build():
            import timm
            return timm.create_model(name, pretrained=False, **kw)
        return ModelSpec(f"x_timm_{name}{tag}", "precision", build,
                         lambda: (torch.randn(batch, 3, size, size),), family="timm")
    # nf_resnet26 with SiLU: the same convs without ReLU's kinks, whose flips (an activation
    # within rounding of 0 lands on the other side) make ReLU nets' gradient errors noise
    specs = [timm_model("nf_resnet26"), timm_model("nf_resnet26", tag="_silu", act_layer="silu"),
             timm_model("nfnet_l0"), timm_model("resnetv2_50x1_bit"), timm_model("convnext_nano"),
             timm_model("gcresnet50t")]
    return {s.name: s for s in specs}


def model_names(regex: str) -> list[str]:
    from ember.bench import suites
    from ember.bench.spec import REGISTRY
    hidden = set(getattr(suites, "NOT_IN_ALL", ())) - {"broad"}
    names = [n for n, s in REGISTRY.items() if s.suite not in hidden] + list(_extra_specs())
    rx = re.compile(regex)
    return [n for n in names if rx.search(n)]


def pattern_names(regex: str) -> list[str]:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import op_sweep
    rx = re.compile(regex)
    return ["op:" + n for n in op_sweep.PATTERNS if rx.search(n)]


# --------------------------------------------------------------------------- one row (child)
def _build(row: str, mode: str, scale: float):
    """(module, args, kwargs, loss) where loss(outputs) -> scalar for backward."""
    import torch
    from ember.bench import harness
    if row.startswith("op:"):
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        import op_sweep
        build, trainable = op_sweep.PATTERNS[row[3:]]
        if mode == "train" and not trainable:
            raise LookupError("pattern has no training mode")
        torch.manual_seed(0)
        case = build(scale)
        mod = op_sweep.Pattern(case)
        args = tuple(case.inputs)
        const = set(case.const)
        grad_args = [i for i, x in enumerate(args) if x.is_floating_point() and i not in const]
        gen = torch.Generator().manual_seed(7)
        cache: dict = {}

        def loss(outs):
            total = 0
            for i, o in enumerate(outs):
                if not (o.is_floating_point() and o.requires_grad):
                    continue
                if i not in cache:
                    cache[i] = torch.randn(o.shape, generator=gen)
                total = total + (o * cache[i].to(o.dtype)).sum()
            return total
        return mod, args, {}, loss, grad_args
    from ember.bench.spec import REGISTRY
    from ember.bench.suites import instantiate
    spec = REGISTRY.get(row) or _extra_specs()[row]
    mod, args, kwargs = instantiate(spec)
    return mod, tuple(args), kwargs, lambda outs: harness.reduce_loss(outs), []


def _run(mod, args, kwargs, mode, loss, grad_args, names):
    import torch
    from ember.bench.harness import flatten
    if mode == "infer":
        with torch.no_grad():
            return [t.detach() for t in flatten(mod(*args, **kwargs))]
    args = tuple(a.detach().requires_grad_() if i in grad_args else a for i, a in enumerate(args))
    for p in mod.parameters():
        p.grad = None
    outs = [t for t in flatten(mod(*args, **kwargs))]
    loss(outs).backward()
    got = [t.detach() for t in outs]
    params = dict(mod.named_parameters())
    got += [params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])
            for n in names]
    got += [args[i].grad for i in grad_args]
    return got


def _errors(got, ref):
    """Per tensor (relative L2, max-abs over max |ref|) against the fp64 reference."""
    out = []
    for g, r in zip(got, ref):
        if not r.is_floating_point() or r.numel() == 0:
            out.append((0.0, 0.0))
            continue
        g64, r64 = g.double(), r.double()
        d = (g64 - r64).nan_to_num(nan=math.inf)
        rn = float(r64.norm())
        out.append((float(d.norm()) / max(rn, 1e-30), float(d.abs().max()) /
                    max(float(r64.abs().max()), 1e-30)))
    return out


def measure(row: str, mode: str, scale: float) -> dict:
    import torch
    import ember
    from ember.bench.harness import to_double
    torch.set_num_threads(1)
    mod, args, kwargs, loss, grad_args = _build(row, mode, scale)
    mod.train(mode == "train")
    names = [n for n, p in sorted(mod.named_parameters()) if p.requires_grad] \
        if mode == "train" else []
    m64 = copy.deepcopy(mod).double()
    ref = _run(m64, to_double(args), to_double(kwargs), mode, loss, grad_args, names)
    eag = _run(copy.deepcopy(mod), args, kwargs, mode, loss, grad_args, names)
    ember.reset()
    before = dict(ember.stats()["counts"])
    emb = _run(ember.compile(copy.deepcopy(mod)), args, kwargs, mode, loss, grad_args, names)
    counts = {k: ember.stats()["counts"].get(k, 0) - before.get(k, 0)
              for k in ("graphs", "breaks", "fallbacks", "eager_calls")}
    n_out = len(emb) - len(names) - (len(grad_args) if mode == "train" else 0)
    labels = [f"out{i}" for i in range(n_out)] + [f"grad:{n}" for n in names] + \
        [f"grad:arg{i}" for i in grad_args]
    e_eag, e_emb = _errors(eag, ref), _errors(emb, ref)
    tensors = []
    for lab, (a_l2, a_mx), (b_l2, b_mx), r in zip(labels, e_eag, e_emb, ref):
        tensors.append({"t": lab, "eager_l2": a_l2, "ember_l2": b_l2, "eager_max": a_mx,
                        "ember_max": b_mx, "ratio": b_l2 / max(a_l2, FLOOR),
                        "ratio_max": b_mx / max(a_mx, FLOOR)})
    outs = [t for t in tensors if t["t"].startswith("out")]
    grads = [t for t in tensors if t["t"].startswith("grad")]
    worst = max(tensors, key=lambda t: t["ratio"])
    rec = {"row": row, "mode": mode, "status": "ok", "counts": counts,
           "out_eager": max((t["eager_l2"] for t in outs), default=0.0),
           "out_ember": max((t["ember_l2"] for t in outs), default=0.0),
           "out_ratio": max((t["ratio"] for t in outs), default=0.0),
           "grad_eager": max((t["eager_l2"] for t in grads), default=0.0),
           "grad_ember": max((t["ember_l2"] for t in grads), default=0.0),
           "grad_ratio": max((t["ratio"] for t in grads), default=0.0),
           "ratio": worst["ratio"], "ratio_max": max(t["ratio_max"] for t in tensors),
           "gm": math.exp(sum(math.log(max(t["ratio"], 1e-3)) for t in tensors) / len(tensors)),
           "worst": worst, "flag": worst["ratio"] > FLAG}
    rec["worst5"] = sorted(tensors, key=lambda t: -t["ratio"])[:5]
    return rec


# ------------------------------------------------------------------------------- parent
def _child(row, mode, args) -> dict:
    env = dict(os.environ, EMBER_SPEED_CHECK="0", EMBER_STRICT="1", OMP_NUM_THREADS="1",
               EMBER_CACHE_DIR=args.cache, PYTHONPATH=ROOT)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", row, mode, "--scale", str(args.scale)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"row": row, "mode": mode, "status": "timeout"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr or "").strip().splitlines()[-3:]
    return {"row": row, "mode": mode, "status": f"crash rc={p.returncode}", "error": " | ".join(tail)}


def fmt(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r['row']:<34} {r['mode']:<5} {r.get('status')} {r.get('error', '')[:150]}"
    w = r["worst"]
    return (f"{r['row']:<34} {r['mode']:<5} out {r['out_eager']:.1e}/{r['out_ember']:.1e} "
            f"({r['out_ratio']:.1f}x)  grad {r['grad_eager']:.1e}/{r['grad_ember']:.1e} "
            f"({r['grad_ratio']:.1f}x)  gm {r.get('gm', 0):.2f}x  worst {r['ratio']:.1f}x {w['t'][:40]}"
            f"{'  <-- FLAG' if r['flag'] else ''}")


def table(paths) -> str:
    rows = [json.loads(l) for p in paths for l in open(p) if l.strip()]
    head = (f"# {'row':<32} {'mode':<5} out eager32/ember32 rel-L2 vs fp64 (ember/eager), "
            f"grad worst eager/ember (worst ratio), worst tensor; FLAG: ratio > {FLAG}")
    flagged = [r for r in rows if r.get("flag")]
    return "\n".join([head] + [fmt(r) for r in rows] +
                     [f"# {len(rows)} rows, {sum(r.get('status') == 'ok' for r in rows)} ok, "
                      f"{len(flagged)} flagged: " + ", ".join(f"{r['row']}/{r['mode']}" for r in flagged)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=None)
    p.add_argument("--patterns", default=None)
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=None)
    p.add_argument("--table", nargs="*")
    p.add_argument("--one", nargs=2, metavar=("ROW", "MODE"))
    args = p.parse_args(argv)
    if args.one:
        try:
            rec = measure(args.one[0], args.one[1], args.scale)
        except LookupError as exc:
            rec = {"row": args.one[0], "mode": args.one[1], "status": f"skip: {exc}"}
        print(json.dumps(rec))
        return 0
    if args.table:
        print(table(args.table))
        return 0
    rows = (model_names(args.models) if args.models else []) + \
        (pattern_names(args.patterns) if args.patterns else [])
    args.cache = tempfile.mkdtemp(prefix="ember-precision-")
    out = open(args.out, "a") if args.out else None
    for row in rows:
        for mode in args.modes.split(","):
            rec = _child(row, mode, args)
            if rec.get("status", "").startswith("skip"):
                continue
            print(fmt(rec), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
