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

in ROUNDS rounds, the order reversed every other round, each variant on its own copy of the
operands (every call finds its weight as cold as the others': together they overflow the L3, as
a model's weights do), on paired.py's clock (thread CPU time with one thread). A ratio is
the median over the rounds of the per-round time ratio, then the geometric mean over the shapes.
The library is oneDNN when its packed GEMM beats MKL's by MARGIN (or, MKL missing, beats addmm),
else MKL; oneDNN on the plain weight is used for unfrozen GEMMs (gemmroute.py) and linears left
unpacked (prepack.py) only when it beat addmm by MARGIN.

Load on the machine (other processes' memory traffic, preemption) moves single calls by tens of
percent, most at the memory-bound 16-row shape: the minimum time of each GEMM, as the probe took
before, flipped the plain verdict between runs (addmm/plain 0.82..1.26 at 16 rows; docs/design/
083). The per-round ratios' median does not (paired.py); and a try whose ratios spread too
wide (SPREAD: the geometric mean over the shapes of their interquartile ratio q3/q1, for any of
the three comparisons) decides nothing: the probe tries again, TRIES in all, then keeps the
conservative answer (MKL, no plain oneDNN) and logs it. That answer is cached on disk too,
marked unsure, for paired.UNSURE_TTL seconds: the GEMM choice is part of the backend cache's
key, and a new process that probed again (and, quieter, decided otherwise) would miss every
cached graph (and pay the probe's tries again); after it a process probes again.
`options={"gemm": "mkl" | "onednn"}` forces a library (the plain route still follows the
probe under "onednn"); `torch.backends.mkldnn.enabled = False` means MKL. The choice is
logged under EMBER_LOGS=perf; counters gemm_probes (tries timed) and gemm_probe_unsure.

Consumes: options. Produces: a Choice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import platform
import statistics

import torch

from .. import config, counters
from ..logging import get_logger
from . import paired

perf_log = get_logger("perf")

#: (M, K, N): a few rows over a wide weight (batch-8 inference, decode of a few sequences) and a
#: batch of sequences; 2 and 7 ms per call on a Zen 4 core
PROBE_SHAPES = ((16, 768, 3072), (512, 768, 768))
#: even: each order as often
ROUNDS = 12
MARGIN = 1.05
#: the widest spread of per-round ratios a try may decide on (q3/q1, geometric mean over the
#: shapes); TRIES tries at most
SPREAD = 1.25
TRIES = 3


@dataclasses.dataclass(frozen=True)
class Choice:
    library: str | None     # "onednn", "mkl", or None (neither packed GEMM available)
    plain: bool             # oneDNN on the plain weight beats addmm (unpacked linears)
    why: str = ""
    sure: bool = True       # False: the probe's spread stayed too wide, a default (cached
                            # for paired.UNSURE_TTL only)


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
    data = paired.load(path, ("library", "plain", "why"))
    if data is not None:
        got = Choice(data["library"], bool(data["plain"]), f"{data['why']} (cached)",
                     bool(data.get("sure", True)))
    else:
        got = probe()
        paired.store(path, dataclasses.asdict(got), got.sure)
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
    keys = {"mkl/onednn": ("mkl", "onednn")} if mkl else {}
    keys.update({"addmm/onednn": ("addmm", "onednn"), "addmm/plain": ("addmm", "plain")})
    tries = []
    for _ in range(TRIES):
        counters.bump("gemm_probes")
        med, spread = {k: [] for k in keys}, {k: [] for k in keys}
        for m, k, n in PROBE_SHAPES:
            times = _time_variants(m, k, n, mkl)
            for key, (a, b) in keys.items():
                got = paired.ratios(times[a], times[b])
                med[key].append(got.median)
                spread[key].append(got.spread)
        width = max(statistics.geometric_mean(v) for v in spread.values())
        tries.append(f"ratios on {', '.join('x'.join(map(str, s)) for s in PROBE_SHAPES)}: "
                     + "; ".join(f"{k} {', '.join(f'{r:.2f}' for r in v)} (spread "
                                 f"{statistics.geometric_mean(spread[k]):.2f})" for k, v in med.items()))
        if width <= SPREAD:
            break
    else:
        counters.bump("gemm_probe_unsure")
        perf_log.warning("gemm probe: ratios spread wider than %.2f in %d tries (a loaded "
                         "machine?): MKL and no oneDNN on plain weights, cached for %d s (%s)",
                         SPREAD, TRIES, paired.UNSURE_TTL, " | ".join(tries))
        return Choice("mkl" if mkl else None, False, "probe unsure: " + " | ".join(tries),
                      sure=False)
    wins = {k: statistics.geometric_mean(v) > MARGIN for k, v in med.items()}
    onednn = wins["mkl/onednn"] if mkl else wins["addmm/onednn"]
    why = f"probe (try {len(tries)}), median time " + tries[-1]
    return Choice("onednn" if onednn else "mkl" if mkl else None, wins["addmm/plain"], why)


def _time_variants(m: int, k: int, n: int, mkl: bool) -> dict[str, list[float]]:
    """Each GEMM's seconds per call in each of ROUNDS rounds (module docstring)."""
    g = torch.Generator().manual_seed(0)
    names = ("addmm", "onednn", "plain") + (("mkl",) if mkl else ())
    # each variant its own operands; float32 as the frozen linears are, whatever autocast the
    # compile runs under
    ops = {name: [torch.randn(*s, generator=g) for s in ((m, k), (n, k), (n,))] for name in names}
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        fns = {"addmm": lambda x, w, b: torch.addmm(b, x, w.t()),
               "plain": lambda x, w, b: torch.ops.mkldnn._linear_pointwise(
                   x, w, b, "none", [], "")}
        x, w, b = ops["onednn"]
        dnn = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns["onednn"] = lambda x, w, b: torch.ops.mkldnn._linear_pointwise(
            x, dnn, b, "none", [], "")
        if mkl:
            x, w, b = ops["mkl"]
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            fns["mkl"] = lambda x, w, b: torch.ops.mkl._mkl_linear(x, packed, w, b, m)
        clock, times = paired.step_clock(), {name: [] for name in names}
        for name in names:                          # warm up: oneDNN builds its kernels
            fns[name](*ops[name])
        for r in range(ROUNDS):
            for name in (names if r % 2 == 0 else names[::-1]):
                t0 = clock()
                fns[name](*ops[name])
                times[name].append(clock() - t0)
    return times
