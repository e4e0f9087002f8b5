"""Vectorization survey (#23): which `#pragma omp simd` loops of ember's C++ kernels g++ does not
vectorize, and why, for a few real models.

    python benchmarks/vec_survey.py [--models swin_v2_t,vit_b_16,...] [--train] [--batch 2]
                                    [--list-missed] [--keep DIR]

Each model is compiled with ember (EMBER_DEBUG_DIR into a temporary folder; speed check off, so
every graph keeps its kernels), and every kernels.cpp is rebuilt with the project flags
(ember.runtime.build.FLAGS) plus -fopt-info-vec-all. A simd loop is the `for` on the line after a
`#pragma omp ... simd`; it counts as vectorized when g++ reports "loop vectorized" inside it (g++
places the report on a statement of the body; one without a location is counted from the
function's "vectorized N loops" note) or replaced it by memset/memcpy ("split to 0 loops"),
otherwise as missed, with g++'s first "not vectorized:" reason there. Counts are per model
(inference, and forward+backward with --train). Models: torchvision by name, `bert` = HF
BertModel from its default config (sequence 128).
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIMD = re.compile(r"#pragma omp .*\bsimd\b")
REPORT = re.compile(r"^[^:]*:(\d+):\d+: (optimized|missed): (.*)$")
NOTE = re.compile(r"^[^:]*:(\d+):\d+: note: vectorized (\d+) loops in function")


def build_model(name: str, batch: int):
    import torch
    if name == "bert":
        from transformers import BertConfig, BertModel
        m = BertModel(BertConfig())
        return m, (torch.randint(0, 30000, (batch, 128)),)
    import torchvision
    m = getattr(torchvision.models, name)()
    return m, (torch.randn(batch, 3, 224, 224),)


def compile_sources(name: str, batch: int, train: bool, folder: Path) -> list[Path]:
    """Compile `name` with ember, dumping into `folder`; the kernels.cpp files written."""
    import torch
    import ember
    torch.manual_seed(0)
    m, args = build_model(name, batch)
    m.train(train)
    e = ember.compile(copy.deepcopy(m), options={"speed_check": False})
    if train:
        out = e(*args)
        out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
        out.float().sum().backward()
    else:
        with torch.no_grad():
            e(*args)
    return sorted(folder.rglob("*kernels.cpp"))


def survey(src: Path, flags: list[str]) -> list[tuple[int, str, str]]:
    """[(line of the simd pragma, kernel name, 'vectorized' or the missed reason)]."""
    text = src.read_text().split("\n")
    loops, ends, kernel_at, kernel = {}, {}, {}, "?"
    for i, line in enumerate(text):
        k = re.search(r'extern "C" void (\w+)\(', line)
        if k:
            kernel = k.group(1)
        kernel_at[i + 1] = kernel
        if SIMD.search(line):
            loops[i + 1] = kernel          # 1-based line of the pragma
            depth, j = 0, i + 1
            while j < len(text):           # the loop body ends at its matching brace
                depth += text[j].count("{") - text[j].count("}")
                if depth <= 0 and "}" in text[j]:
                    break
                j += 1
            ends[i + 1] = j + 1
    proc = subprocess.run(["g++", *flags, "-fopt-info-vec-all", "-fopt-info-loop-optimized",
                           str(src), "-o",
                           str(src.with_suffix(".so"))], capture_output=True, text=True)
    done, why = set(), {}
    per_fn = collections.Counter()         # kernel -> loops g++ says it vectorized
    located = collections.Counter()        # kernel -> of those, reported at a line
    seen = set()
    for line in proc.stderr.split("\n"):
        r = REPORT.match(line) or NOTE.match(line)
        if not r:
            continue
        at = int(r.group(1))
        if r.re is NOTE:
            per_fn[kernel_at.get(at)] += int(r.group(2))
            continue
        where = line.split(": ", 1)[0]     # file:line:col (an epilogue repeats it)
        if "loop vectorized" in r.group(3) and where not in seen:
            seen.add(where)
            located[kernel_at.get(at)] += 1
        # g++ reports a simd loop at a statement of its body
        ln = next((p for p in loops if p < at <= ends[p]), None)
        if ln is None:
            continue
        kind, msg = r.group(2), r.group(3)
        if kind == "optimized" and ("loop vectorized" in msg or "split to 0 loops" in msg):
            done.add(ln)
        elif "not vectorized:" in msg and ln not in why:
            why[ln] = re.sub(r"\s+", " ", msg.split("not vectorized:", 1)[1]).strip()[:90]
    # a loop g++ vectorized without a location is only counted in its function's note
    for ln, k in loops.items():
        if ln not in done and ln not in why and per_fn[k] > located[k]:
            located[k] += 1
            done.add(ln)
    return [(ln, k, "vectorized" if ln in done else why.get(ln, "no report"))
            for ln, k in sorted(loops.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="swin_v2_t,vit_b_16,convnext_tiny,efficientnet_b0,bert")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--train", action="store_true", help="also forward+backward")
    ap.add_argument("--list-missed", action="store_true", help="print each missed loop")
    ap.add_argument("--keep", help="write the sources here instead of a temporary folder")
    ap.add_argument("--sources", help="survey the sources a --keep run wrote (no compile)")
    ap.add_argument("--flags", default="", help="extra g++ flags, e.g. ' -fno-tree-pre'")
    a = ap.parse_args()
    # a fresh kernel cache: a warm (disk cache) compile does not generate, so would dump nothing
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="vec-survey-cache-")
    from ember.runtime.build import FLAGS
    flags = [f for f in FLAGS if f != "-w"] + a.flags.split()
    modes = ["infer", "train"] if a.train else ["infer"]
    total = collections.Counter()
    reasons = collections.Counter()
    print(f"{'model':18} {'mode':6} {'simd loops':>10} {'vectorized':>10} {'missed':>7} "
          f"{'unreported':>10}")
    for name in a.models.split(","):
        for mode in modes:
            root = a.sources or a.keep or tempfile.mkdtemp(prefix="vec-survey-")
            folder = Path(root) / f"{name}_{mode}"
            if a.sources:
                srcs = sorted(folder.rglob("*kernels.cpp"))
            else:
                os.environ["EMBER_DEBUG_DIR"] = str(folder)
                import ember
                ember.reset()
                srcs = compile_sources(name, a.batch, mode == "train", folder)
            rows = [(s, *r) for s in srcs for r in survey(s, flags)]
            # unreported: g++ said nothing about the loop (a kernel identical to another one is
            # folded into it, a loop may be removed)
            miss = [r for r in rows if r[3] not in ("vectorized", "no report")]
            quiet = sum(r[3] == "no report" for r in rows)
            print(f"{name:18} {mode:6} {len(rows):>10} {len(rows) - len(miss) - quiet:>10} "
                  f"{len(miss):>7} {quiet:>10}")
            total.update(loops=len(rows), missed=len(miss), quiet=quiet)
            for s, ln, k, why in miss:
                reasons[why] += 1
                if a.list_missed:
                    print(f"    {s.relative_to(folder)}:{ln} {k}: {why}")
    print(f"{'total':25} {total['loops']:>10} "
          f"{total['loops'] - total['missed'] - total['quiet']:>10} {total['missed']:>7} "
          f"{total['quiet']:>10}")
    for why, n in reasons.most_common():
        print(f"  {n:5}  {why}")


if __name__ == "__main__":
    main()
