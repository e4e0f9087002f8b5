"""Backend "ember", freezing: which GEMM library runs a frozen linear on this machine.

torch exposes two packed-weight GEMMs for CPU inference: MKL's (`mkl._mkl_linear` on a
`mkl._mkl_reorder_linear_weight` pack) and oneDNN's (`mkldnn._linear_pointwise` on a
`mkldnn._reorder_linear_weight` pack; it also takes the plain weight, with no copy). Which one is
faster depends on the CPU: on an AMD Zen 4 core oneDNN's JIT kernels ran 1.2-1.4x MKL's (packed
or addmm) from 2 to 50000 rows at transformer and convnet widths, while MKL's packed GEMV was
faster at one row (docs/design/071); 024 and 041 had chosen MKL from measurements on an earlier
machine. A vendor or model name says nothing reliable about it, so the choice is measured.

`choice(options)`: on first use in a process (and once per machine: the answer is cached on disk,
keyed by the CPU's model name, torch's version and the thread count), time on PROBE_SHAPES

    addmm (nn.Linear's [N, K] weight)   MKL packed   oneDNN packed   oneDNN on the plain weight

alternating, ROUNDS rounds, each GEMM's minimum (the speed check's clock: thread CPU time with
one thread). The library is oneDNN when its packed GEMM beats MKL's by MARGIN (the geometric
mean of the shapes' time ratios; or, MKL missing, beats addmm), else MKL; oneDNN on the plain
weight is used for linears left unpacked (prepack.py) only when it beat addmm by MARGIN.
`options={"gemm": "mkl" | "onednn"}` forces a library (the plain route still follows the
probe under "onednn"); `torch.backends.mkldnn.enabled = False` means MKL. The choice is
logged under EMBER_LOGS=perf.

Consumes: options. Produces: a Choice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform

import torch

from .. import config
from ..logging import get_logger
from .speed import step_clock

perf_log = get_logger("perf")

#: (M, K, N): a few rows over a wide weight (batch-8 inference, decode of a few sequences) and a
#: batch of sequences; both between 5 and 15 ms per round on a Zen 4 core
PROBE_SHAPES = ((16, 768, 3072), (512, 768, 768))
ROUNDS = 7
MARGIN = 1.05


@dataclasses.dataclass(frozen=True)
class Choice:
    library: str | None     # "onednn", "mkl", or None (neither packed GEMM available)
    plain: bool             # oneDNN on the plain weight beats addmm (unpacked linears)
    why: str = ""


_CHOICES: dict = {}


def choice(options: dict) -> Choice:
    """The GEMM library for the frozen linears of a graph compiled with `options`."""
    forced = options.get("gemm", "auto")
    if forced not in ("auto", "mkl", "onednn"):
        raise ValueError(f"options gemm must be 'auto', 'mkl' or 'onednn', got {forced!r}")
    if forced == "mkl" or not torch.backends.mkldnn.enabled:    # or the user turned it off
        ok = torch.backends.mkl.is_available()
        return Choice("mkl" if ok else None, False, f"options gemm={forced!r}, oneDNN "
                      f"{'enabled' if torch.backends.mkldnn.enabled else 'disabled'}")
    probed = measured()
    if forced == "auto":
        return probed
    ok = torch.backends.mkldnn.is_available()
    return Choice("onednn" if ok else None, ok and probed.plain, "options gemm='onednn'")


def measured() -> Choice:
    """The probe's answer for this machine and thread count (memoized, then cached on disk)."""
    key = machine_key()
    if key in _CHOICES:
        return _CHOICES[key]
    path = config.cache_subdir("probe") / f"gemm-{key}.json"
    try:
        data = json.loads(path.read_text())
        got = Choice(data["library"], bool(data["plain"]), data["why"] + " (cached)")
    except (OSError, ValueError, KeyError):
        got = probe()
        config.write_json(path, dataclasses.asdict(got))
    perf_log.info("gemm library for frozen linears: %s, oneDNN on plain weights: %s (%s)",
                  got.library, "yes" if got.plain else "no", got.why)
    _CHOICES[key] = got
    return got


def machine_key() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), model)
    except OSError:
        pass
    text = f"{model}|{torch.__version__}|{torch.get_num_threads()}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def probe() -> Choice:
    mkl, dnn = torch.backends.mkl.is_available(), torch.backends.mkldnn.is_available()
    if not dnn:
        return Choice("mkl" if mkl else None, False, "no oneDNN")
    ratios = {"mkl/onednn": [], "addmm/onednn": [], "addmm/plain": []}
    for m, k, n in PROBE_SHAPES:
        best = _time_variants(m, k, n, mkl)
        if mkl:
            ratios["mkl/onednn"].append(best["mkl"] / best["onednn"])
        ratios["addmm/onednn"].append(best["addmm"] / best["onednn"])
        ratios["addmm/plain"].append(best["addmm"] / best["plain"])
    wins = {k: bool(v) and math.prod(v) ** (1 / len(v)) > MARGIN for k, v in ratios.items()}
    onednn = wins["mkl/onednn"] if mkl else wins["addmm/onednn"]
    why = "probe, time ratios on %s: %s" % (
        ", ".join("x".join(map(str, s)) for s in PROBE_SHAPES),
        "; ".join(f"{k} {', '.join(f'{r:.2f}' for r in v)}" for k, v in ratios.items() if v))
    return Choice("onednn" if onednn else "mkl" if mkl else None, wins["addmm/plain"], why)


def _time_variants(m: int, k: int, n: int, mkl: bool) -> dict[str, float]:
    """Each GEMM's minimum seconds per call over alternating rounds."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g) for s in ((m, k), (n, k), (n,)))
    # float32 as the frozen linears are, whatever autocast the compile runs under
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        dnn = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns = {"addmm": lambda: torch.addmm(b, x, w.t()),
               "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, b, "none", [], ""),
               "plain": lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")}
        if mkl:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            fns["mkl"] = lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, m)
        clock, best = step_clock(), dict.fromkeys(fns, float("inf"))
        for fn in fns.values():                          # warm up: oneDNN builds its kernels
            fn()
        for r in range(ROUNDS):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = clock()
                fns[name]()
                best[name] = min(best[name], clock() - t0)
    return best

