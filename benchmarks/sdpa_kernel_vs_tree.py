"""sdpa_kernel_vs_tree.py --base TREE [--shapes ...] [--rounds 7]: ember's fused attention kernel
(codegen/sdpa_cpp.py) of this tree against that of another checkout TREE (e.g. main), both called
straight through ctypes (no custom-op dispatch), paired and alternating in one process (thread
CPU time, 1 thread), with eager's sdpa as the reference for values. Shapes and masks as in
sdpa_kernel_ab.py. "x" is the base kernel's time over this tree's (median of per-round ratios
[min, max]). Bool masks are given to the base kernel as their additive float form (the form it
takes)."""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired, prepare, ratio_stats  # noqa: E402


def load_source_module(tree: str):
    """The base tree's codegen/sdpa_cpp.py, its relative import made absolute (the prelude is
    this tree's: the kernels differ in their own text only)."""
    text = open(os.path.join(tree, "ember/codegen/sdpa_cpp.py")).read()
    text = text.replace("from .cpp_prelude import PRELUDE", "from ember.codegen.cpp_prelude import PRELUDE")
    import types
    mod = sys.modules["base_sdpa_cpp"] = types.ModuleType("base_sdpa_cpp")
    exec(compile(text, "base_sdpa_cpp", "exec"), mod.__dict__)
    return mod.__dict__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", default="2x8x256x256x64:boolcausal,2x8x256x256x64:mincausal,"
                    "2x8x256x256x64:causal,2x8x256x256x64:window,4x8x128x128x64:pad,"
                    "256x3x49x49x32:bias,8x8x77x77x64:causal,4x12x197x197x64,"
                    "2x8x256x256x64:is_causal")
    ap.add_argument("--json")
    a = ap.parse_args()
    prepare()
    import json
    import torch
    import torch.nn.functional as F
    from sdpa_kernel_ab import inputs
    from ember.backends import sdpa_kernel as sk
    from ember.codegen import sdpa_cpp
    from ember.runtime import build as rt_build
    torch.set_num_threads(1)
    base = load_source_module(a.base)
    fields = base["SdpaSpec"].__dataclass_fields__

    def kernel(src):
        lib = ctypes.CDLL(str(rt_build.build_async(src, flags=rt_build.FMA_FLAGS).result()))
        fn = lib.sdpa_fwd
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_float]
        return fn, lib

    def caller(fn, q, k, v, m, scale):
        sizes = sk._sizes(q, k, v, m)
        out = sk._out(q, v.shape[3])
        mp = None if m is None else m.data_ptr()
        return lambda: fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), mp, out.data_ptr(),
                          ctypes.addressof(sizes), scale) or out
    with torch.no_grad():
        for spec in a.shapes.split(","):
            (q, k, v, m, scale, causal), _ = inputs(spec)
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale, is_causal=causal)
            lk = k.shape[2]
            new_fn, _l1 = kernel(sdpa_cpp.source(sk._spec(q.shape[3], v.shape[3], lk, m, causal)))
            mb = m if m is None or m.dtype != torch.bool else \
                torch.zeros(m.shape).masked_fill(~m, float("-inf"))
            kind = mb is not None if fields["mask"].type in ("bool", bool) else \
                ("" if mb is None else "float")
            bspec = base["SdpaSpec"](q.shape[3], v.shape[3], kind, causal,
                                     lk if lk <= base["FIXED_LK"] else 0)
            base_fn, _l2 = kernel(base["source"](bspec))
            fns = {"base": caller(base_fn, q, k, v, mb, scale),
                   "new": caller(new_fn, q, k, v, m, scale)}
            errs = {n: ((f() - ref).abs().max() / ref.abs().max()).item() for n, f in fns.items()}
            t, _ = paired({n: (lambda f=f: f()) for n, f in fns.items()}, (), a.rounds)
            r = ratio_stats(t["base"], t["new"])
            print(f"{spec:>26}  base {t['base'][len(t['base']) // 2] * 1e3:7.3f} ms  x "
                  f"{r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]  err base {errs['base']:.1e} "
                  f"new {errs['new']:.1e}  load {os.getloadavg()[0]:.1f}", flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps({"shape": spec, "x": r["median"], "min": r["min"],
                                        "max": r["max"], "err_new": errs["new"],
                                        "err_base": errs["base"]}) + "\n")


if __name__ == "__main__":
    main()
