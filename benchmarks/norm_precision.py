"""Normalization statistics precision: ember float32 and eager float32 against float64 eager.

    PYTHONPATH=. python benchmarks/norm_precision.py [--cases REGEX] [--grad]

Rows: training BatchNorm (NCHW, NC), GroupNorm, LayerNorm and var_mean (along the last dim and
down columns), at short and long reduced rows, on data centred at 0 and offset (x + 1000, and a
small mean under a larger spread, like a conv filter's weights). Per row and output tensor the
relative L2 error ||a - r|| / ||r|| of eager32 and of ember32 against the fp64 result, and their
ratio ember/eager (eager's error floored at FLOOR: an exactly rounded float tensor is ~3e-8
off). --grad adds the input gradient of sum(out * g) for a fixed random g (the normalizations).
Runs ember's own kernels (EMBER_SPEED_CHECK=0). docs/design/061.
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("EMBER_SPEED_CHECK", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402

FLOOR = 3e-8


def _bn(x, w, b):
    rm, rv = torch.zeros(x.shape[1], dtype=x.dtype), torch.ones(x.shape[1], dtype=x.dtype)
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    return out, rm, rv


def _gn(groups):
    return lambda x, w, b: (F.group_norm(x, groups, w, b, 1e-5),)


def _ln(x, w, b):
    return (F.layer_norm(x, x.shape[-1:], w, b, 1e-5),)


def _vm(dim):
    return lambda x, w, b: torch.var_mean(x, dim)


#: name: (fn, input shape, per-channel param size or None, grad-able)
KINDS = {
    "bn2d_tiny": (_bn, (2, 64, 7, 7), 1, True),           # 98 per channel
    "bn2d_small": (_bn, (8, 64, 14, 14), 1, True),        # 1568
    "bn2d_mid": (_bn, (8, 64, 56, 56), 1, True),          # 25k
    "bn2d_large": (_bn, (16, 16, 128, 128), 1, True),     # 262k
    "bn1d_nc": (_bn, (4096, 256), 1, True),               # columns
    "gn_unet": (_gn(32), (4, 128, 64, 64), 1, True),      # 16k per group
    "gn_small": (_gn(32), (4, 64, 8, 8), 1, True),        # 128 per group
    "gn_large": (_gn(8), (2, 64, 128, 128), 1, True),     # 131k per group
    "ln_768": (_ln, (256, 768), -1, True),
    "ln_long": (_ln, (8, 65536), -1, True),
    "vm_last_768": (_vm(-1), (256, 768), None, False),
    "vm_last_long": (_vm(-1), (4, 1 << 20), None, False),
    "vm_cols": (_vm(0), (65536, 64), None, False),
    "vm_all": (_vm(None), (1 << 21,), None, False),
}
#: data: (scale, offset)
DATA = {"c0": (1.0, 0.0), "off1000": (1.0, 1000.0), "filt": (0.1, 1e-3), "tiny": (0.01, 1000.0)}


def _rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def run_case(kind, data, grad):
    fn, shape, pshape, can_grad = KINDS[kind]
    scale, off = DATA[data]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * scale + off
    w = b = None
    if pshape is not None:
        c = shape[1] if pshape == 1 else shape[-1]
        w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g) * 0.1
    grad = grad and can_grad
    cfn = ember.compile(fn, dynamic=False)

    def call(f, dt):
        xi = x.to(dt).requires_grad_(grad)
        args = (xi, None if w is None else w.to(dt), None if b is None else b.to(dt))
        with torch.enable_grad() if grad else torch.no_grad():
            outs = [t for t in f(*args)]
            if grad:
                gout = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(1))
                outs.append(torch.autograd.grad((outs[0] * gout.to(dt)).sum(), xi)[0])
        return [t.detach() for t in outs]
    ref, eag, emb = call(fn, torch.float64), call(fn, torch.float32), call(cfn, torch.float32)
    return [(_rel(e, r), _rel(m, r)) for r, e, m in zip(ref, eag, emb)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=".")
    ap.add_argument("--grad", action="store_true")
    a = ap.parse_args()
    rx = re.compile(a.cases)
    worst = 0.0
    for kind in KINDS:
        for data in DATA:
            name = f"{kind}/{data}"
            if not rx.search(name):
                continue
            errs = run_case(kind, data, a.grad)
            cols = []
            for e, m in errs:
                r = m / max(e, FLOOR)
                worst = max(worst, r)
                cols.append(f"{e:.1e}/{m:.1e} ({r:.2f}x)")
            print(f"{name:24s} " + "  ".join(cols), flush=True)
    print(f"# worst ember/eager ratio {worst:.2f}x")


if __name__ == "__main__":
    main()
