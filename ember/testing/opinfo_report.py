"""OpInfo conformance report: pass rates of an ember backend against eager.

    python -m ember.testing.opinfo_report --backend aot_eager [--dtypes float32,float64]
        [--ops add,mul] [--max-samples 3] [--json opinfo_aot_eager.json] [--fast]

Prints forward/backward pass rates over (op, dtype) cases and over samples, a per-family table
and the most common failure reasons; writes every case to a JSON summary.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import torch

from .opinfo import case_key, family, run_case, select_ops, supported_dtypes

# The default-CI subset: ops whose decompositions the model suite depends on.
FAST_OPS = [
    "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "pow",
    "where", "clamp", "masked_fill", "addcmul", "addcdiv", "lerp", "sum", "mean", "var", "std",
    "amax", "logsumexp", "softmax", "log_softmax", "matmul", "linalg.vector_norm", "cat", "stack",
    "repeat", "flip", "roll", "tril", "triu", "nn.functional.relu", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.layer_norm", "nn.functional.batch_norm",
    "nn.functional.group_norm", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    "nn.functional.mse_loss", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.embedding", "nn.functional.linear", "nn.functional.hardtanh",
    "nn.functional.leaky_relu", "nn.functional.avg_pool2d",
]


def run(backend, ops, dtypes, kinds=("fwd", "bwd"), max_samples=3, progress=None):
    results = []
    for i, o in enumerate(ops):
        for d in supported_dtypes(o, dtypes):
            for k in kinds:
                r = run_case(o, d, k, backend, max_samples=max_samples)
                r.family = family(o)
                results.append(r)
                if progress:
                    progress(i, len(ops), r)
    return results


def summarize(results):
    out = {}
    for kind in ("fwd", "bwd"):
        rs = [r for r in results if r.kind == kind and r.status != "skip"]
        passed = sum(r.status == "pass" for r in rs)
        samples = sum(r.samples for r in rs)
        spassed = sum(r.passed for r in rs)
        out[kind] = {"cases": len(rs), "passed": passed,
                     "rate": passed / len(rs) if rs else None,
                     "samples": samples, "samples_passed": spassed,
                     "sample_rate": spassed / samples if samples else None,
                     "skipped": sum(r.kind == kind and r.status == "skip" for r in results)}
    fams = collections.defaultdict(lambda: {"fwd": [0, 0], "bwd": [0, 0]})
    for r in results:
        if r.status != "skip":
            fams[r.family][r.kind][1] += 1
            fams[r.family][r.kind][0] += r.status == "pass"
    out["families"] = {f: {k: {"passed": v[0], "cases": v[1]} for k, v in d.items()}
                       for f, d in sorted(fams.items())}
    reasons = collections.Counter(_reason_class(r.reason) for r in results if r.status == "fail")
    out["top_failure_reasons"] = reasons.most_common(20)
    return out


def update_xfail_table(path, backend, results):
    """Failed cases enter the table with their reason; cases that ran and passed leave it."""
    table = json.load(open(path)) if os.path.exists(path) else {}
    entries = table.setdefault(backend, {})
    for r in results:
        if r.status == "fail":
            entries[r.key] = r.reason
        elif r.status == "pass":
            entries.pop(r.key, None)
    table[backend] = dict(sorted(entries.items()))
    with open(path, "w") as f:
        f.write(json.dumps(table, indent=1, sort_keys=True) + "\n")


def _reason_class(reason: str) -> str:
    import re
    r = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", reason)
    r = re.sub(r"'[^']*'", "'…'", r)
    return r[:120]


def _pct(x):
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def print_report(summary, backend, file=sys.stdout):
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p(f"OpInfo conformance, backend={backend}")
    for kind in ("fwd", "bwd"):
        s = summary[kind]
        p(f"  {kind}: {s['passed']}/{s['cases']} (op, dtype) cases {_pct(s['rate'])}   "
          f"samples {s['samples_passed']}/{s['samples']} {_pct(s['sample_rate'])}   "
          f"(skipped {s['skipped']})")
    p(f"  {'family':16s} {'fwd':>14s} {'bwd':>14s}")
    for f, d in summary["families"].items():
        cells = []
        for k in ("fwd", "bwd"):
            c = d[k]
            cells.append(f"{c['passed']}/{c['cases']} {_pct(c['passed'] / c['cases']) if c['cases'] else '   - '}")
        p(f"  {f:16s} {cells[0]:>14s} {cells[1]:>14s}")
    p("  top failure reasons:")
    for reason, n in summary["top_failure_reasons"]:
        p(f"    {n:4d}  {reason}")


def _resummarize(path, a):
    from .opinfo import CaseResult
    data = json.load(open(path))
    results = []
    for c in data["cases"]:
        name, dtype, kind = c["key"].split("|")
        status, reason = c["status"], c["reason"]
        if status == "fail" and "data-dependent" in reason:       # classification of newer runs
            status, reason = "skip", "skip: data-dependent op (graph break under capture)"
        r = CaseResult(name, "", dtype, kind, status, c["samples"], c["passed"], reason)
        r.family = c["family"]
        results.append(r)
    summary = summarize(results)
    if a.update_xfail:
        update_xfail_table(a.update_xfail, data["backend"], results)
    if a.json:
        data.update(summary)
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)
    print_report(summary, data["backend"])
    return 0


def _rerun_failures(path, a):
    data = json.load(open(path))
    failed = [c for c in data["cases"] if c["status"] == "fail"]
    by_op = {}
    for c in failed:
        name, dtype, kind = c["key"].split("|")
        by_op.setdefault(name, set()).add((dtype, kind))
    fresh = {}
    for o in select_ops(list(by_op)):
        full = o.name + ("." + o.variant_test_name if o.variant_test_name else "")
        for dtype, kind in sorted(by_op.get(full, ())):
            r = run_case(o, getattr(torch, dtype), kind, data["backend"], max_samples=data["max_samples"])
            fresh[r.key] = r
            if r.status == "fail" and not a.quiet:
                print(f"FAIL {r.key}: {r.reason}", file=sys.stderr, flush=True)
    for c in data["cases"]:
        r = fresh.get(c["key"])
        if r is not None:
            c.update(status=r.status, samples=r.samples, passed=r.passed, reason=r.reason)
    with open(a.json or path, "w") as f:
        json.dump(data, f, indent=1)
    return _resummarize(a.json or path, a)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="aot_eager", choices=["aot_eager", "ember", "decomp"])
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--ops", default=None, help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--fast", action="store_true", help="only the default-CI subset")
    ap.add_argument("--kinds", default="fwd,bwd")
    ap.add_argument("--max-samples", type=int, default=3)
    ap.add_argument("--json", default=None, help="summary path (default opinfo_<backend>.json)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--from-json", default=None, metavar="PATH",
                    help="re-summarize a previous run's JSON instead of running")
    ap.add_argument("--rerun-failures", default=None, metavar="PATH",
                    help="rerun the failed cases of a previous run's JSON and merge the results")
    ap.add_argument("--update-xfail", default=None, metavar="PATH",
                    help="merge this run's results into an expected-failure table "
                         "(tests/conformance/opinfo_xfail.json), as EMBER_COLLECT_XFAIL=1 does")
    a = ap.parse_args(argv)
    os.environ.setdefault("EMBER_STRICT", "1")
    if a.from_json:
        return _resummarize(a.from_json, a)
    if a.rerun_failures:
        return _rerun_failures(a.rerun_failures, a)
    names = FAST_OPS if a.fast else (a.ops.split(",") if a.ops else None)
    ops = select_ops(names)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    start = time.time()

    def progress(i, n, r):
        if not a.quiet and r.status == "fail":
            print(f"[{i + 1}/{n}] FAIL {r.key}: {r.reason}", file=sys.stderr, flush=True)

    results = run(a.backend, ops, dtypes, tuple(a.kinds.split(",")), a.max_samples, progress)
    summary = summarize(results)
    summary["backend"] = a.backend
    summary["dtypes"] = a.dtypes
    summary["max_samples"] = a.max_samples
    summary["seconds"] = round(time.time() - start, 1)
    summary["cases"] = [{"key": r.key, "family": r.family, "status": r.status,
                         "samples": r.samples, "passed": r.passed, "reason": r.reason}
                        for r in results]
    path = a.json or f"opinfo_{a.backend}.json"
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    if a.update_xfail:
        update_xfail_table(a.update_xfail, a.backend, results)
    print_report(summary, a.backend)
    print(f"  {summary['seconds']} s; summary written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
