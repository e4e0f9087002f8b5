"""ember bench output: the aligned table, the summary with geomeans, and the PNG plot.

Consumes the harness's records (one dict per model x mode x compiler, the same dicts written as
JSON lines); produces text and a file. Plain text on purpose: aligned columns read the same on a
TTY, in CI logs and pasted into an issue.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

STATUS_SHORT = {"pass": "pass", "fail": "FAIL", "wrong": "WRONG", "fallback": "eager-fb",
                "degraded": "degraded",
                "crash": "CRASH", "timeout": "TIMEOUT"}


def _ms(s) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f}" if s >= 0.01 else f"{s * 1000:.3f}"


def _sec(s) -> str:
    return "-" if s is None else f"{s:.1f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _err(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def one_line(recs: list[dict]) -> str:
    """The progress line for one (model, mode): each compiler's status and speedup."""
    if not recs:
        return "(no records)"
    head = f"{recs[0]['model']} {recs[0]['mode']}:"
    parts = []
    for r in recs:
        s = STATUS_SHORT.get(r.get("status"), r.get("status"))
        if r["compiler"] != "eager" and r.get("speedup") is not None:
            s += f" {r['speedup']:.2f}x"
        if r.get("status") not in ("pass",) and r.get("error"):
            s += f" ({r['error'][:80]})"
        parts.append(f"{r['compiler']} {s}")
    wall = recs[0].get("subprocess_wall_s")
    tail = f" [{wall:.0f} s]" if wall is not None else ""
    return f"{head} {', '.join(parts)}{tail}"


COLUMNS = [
    ("model", lambda r: r["model"]),
    ("mode", lambda r: r["mode"]),
    ("compiler", lambda r: r["compiler"]),
    ("status", lambda r: STATUS_SHORT.get(r.get("status"), str(r.get("status")))),
    ("rel_err", lambda r: _err(r.get("rel_err"))),
    ("first_s", lambda r: _sec(r.get("first_call_s"))),
    ("compile_s", lambda r: _sec(r.get("compile_s"))),
    ("step_ms", lambda r: _ms(r.get("step_s"))),
    ("speedup", lambda r: _x(r.get("speedup"))),
    ("med/med", lambda r: _x(r.get("speedup_of_medians"))),
    ("noise", lambda r: _noise(r.get("times"))),
    ("mem", lambda r: _x(r.get("mem_ratio"))),
    ("graphs", lambda r: "-" if r["compiler"] == "eager" or r.get("graphs") is None
     else f"{r['graphs']}/{r.get('graph_breaks', 0)}"),
    ("path / error", lambda r: (r.get("path") or "") if r.get("status") == "pass"
     else f"{r.get('path') or ''} {r.get('error') or ''}".strip()),
]
_RIGHT = {"rel_err", "first_s", "compile_s", "step_ms", "speedup", "med/med", "noise", "mem",
          "graphs"}


def _noise(times) -> str:
    """Spread of the timed steps, (p75 - p25) / median: a speedup smaller than this is noise."""
    if not times or len(times) < 4:
        return "-"
    t = sorted(times)
    n = len(t)
    med = t[n // 2] if n % 2 else (t[n // 2 - 1] + t[n // 2]) / 2
    return f"{(t[(3 * n) // 4] - t[n // 4]) / med:.0%}" if med > 0 else "-"


def table(records: list[dict], width: int = 70) -> str:
    """Aligned columns; the last column (path or error) is cut to `width` characters."""
    rows = [[fn(r) for _, fn in COLUMNS] for r in records]
    rows = [row[:-1] + [row[-1][:width]] for row in rows]
    heads = [h for h, _ in COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(heads)]

    def fmt(cells):
        out = []
        for i, (h, c) in enumerate(zip(heads, cells)):
            out.append(c.rjust(widths[i]) if h in _RIGHT else c.ljust(widths[i]))
        return "  ".join(out).rstrip()
    lines = [fmt(heads), "  ".join("-" * w for w in widths)]
    lines += [fmt(row) for row in rows]
    lines.append("columns: rel_err = max over tensors of max error / max |ref| vs the fp64 eager "
                 "reference (train: outputs, loss and grads of step 1; pass = each tensor within "
                 "10x eager-fp32's error on it); first_s = first call incl. compile; speedup = "
                 "median of paired eager/compiler ratios (med/med: ratio of medians; noise: IQR/median of the "
                 "timed steps); mem = eager peak / compiler peak; "
                 "graphs = n/breaks")
    return "\n".join(lines)


def geomean(values) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def summary(records: list[dict]) -> str:
    """Pass rate per compiler and mode, geomean speedups vs eager, and ember vs torch.compile."""
    by = defaultdict(list)
    for r in records:
        by[(r["compiler"], r["mode"])].append(r)
    lines = ["summary (timings on a shared 2-core CPU are noisy; medians of paired runs):"]
    for (comp, mode), recs in sorted(by.items()):
        n = len(recs)
        counts = defaultdict(int)
        for r in recs:
            counts[r.get("status")] += 1
        passed = counts.get("pass", 0)
        g = geomean(r.get("speedup") for r in recs if r.get("status") == "pass")
        gm = geomean(r.get("mem_ratio") for r in recs if r.get("status") == "pass")
        comp_t = [r.get("compile_s") for r in recs if r.get("status") == "pass"
                  and r.get("compile_s") is not None]
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "pass")
        lines.append(f"  {comp:6} {mode:5}: pass {passed}/{n} ({100.0 * passed / n:.0f}%)"
                     f"{' [' + detail + ']' if detail else ''}"
                     + (f", geomean speedup vs eager {g:.2f}x" if g and comp != "eager" else "")
                     + (f", geomean mem ratio {gm:.2f}x" if gm and comp != "eager" else "")
                     + (f", compile s total {sum(comp_t):.1f}" if comp_t and comp != "eager" else ""))
    for mode in sorted({r["mode"] for r in records}):
        pairs = _ember_vs_torch(records, mode)
        if pairs:
            g = geomean(pairs)
            lines.append(f"  ember vs torch.compile {mode}: geomean {g:.2f}x over {len(pairs)} "
                         f"models that pass both (>1 = ember faster)")
    lines += _family_lines(records)
    lines += _work_list(records)
    paths = defaultdict(int)
    for r in records:
        if r["compiler"] == "ember" and r.get("path"):
            paths[r["path"]] += 1
    if paths:
        lines.append("  ember paths used: " + ", ".join(f"{p} x{n}" for p, n in sorted(paths.items())))
    env = next((r for r in records if r.get("threads") is not None), None)
    if env:
        lines.append(f"  threads {env.get('threads')}, allocator {env.get('allocator')}")
    return "\n".join(lines)


def _family_lines(records: list[dict]) -> list[str]:
    """Per family and mode: ember's and torch.compile's geomean vs eager, ember vs torch.compile."""
    families = sorted({r.get("family") for r in records if r.get("family")})
    if len(families) < 2:
        return []
    lines = ["  per family (geomean over passing rows; n = rows):"]
    for mode in sorted({r["mode"] for r in records}):
        for fam in families:
            recs = [r for r in records if r["mode"] == mode and r.get("family") == fam]
            parts = []
            for comp, label in (("ember", "ember"), ("torch", "torch.compile")):
                ok = [r for r in recs if r["compiler"] == comp and r.get("status") == "pass"]
                g = geomean(r.get("speedup") for r in ok)
                if g:
                    parts.append(f"{label} {g:.2f}x eager (n={len(ok)})")
            vs = _ember_vs_torch(recs, mode)
            if vs:
                parts.append(f"ember/torch.compile {geomean(vs):.2f}x (n={len(vs)})")
            if parts:
                lines.append(f"    {mode:5} {fam:16} " + ", ".join(parts))
    return lines


def _work_list(records: list[dict]) -> list[str]:
    """Every ember row slower than eager, and every ember row that did not pass, with its error."""
    slow = sorted((r for r in records if r["compiler"] == "ember" and r.get("status") == "pass"
                   and r.get("speedup") is not None and r["speedup"] < 1.0),
                  key=lambda r: r["speedup"])
    bad = [r for r in records if r["compiler"] == "ember" and r.get("status") != "pass"]
    lines = []
    if slow:
        lines.append(f"  ember slower than eager ({len(slow)}): " + ", ".join(
            f"{r['model']} {r['mode']} {r['speedup']:.2f}x" for r in slow))
    if bad:
        lines.append(f"  ember not passing ({len(bad)}):")
        lines += [f"    {r['model']} {r['mode']}: {STATUS_SHORT.get(r.get('status'), r.get('status'))}"
                  f" {(r.get('error') or '')[:140]}" for r in bad]
    return lines


def _ember_vs_torch(records: list[dict], mode: str) -> list[float]:
    idx = {(r["model"], r["compiler"]): r for r in records if r["mode"] == mode}
    out = []
    for (model, comp), r in idx.items():
        if comp != "ember" or r.get("status") != "pass":
            continue
        t = idx.get((model, "torch"))
        if not (t and t.get("status") == "pass" and r.get("step_s") and t.get("step_s")):
            continue
        te, tt = r.get("times") or [], t.get("times") or []
        if te and len(te) == len(tt):    # same rounds: the median of the paired ratios
            out.append(statistics.median(b / a for a, b in zip(te, tt)))
        else:
            out.append(t["step_s"] / r["step_s"])
    return out


def plot(records: list[dict], path: str) -> str:
    """Per-model speedup bars (ember, torch.compile) and compile-time bars, one row per mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install -e '.[bench]')"
    modes = sorted({r["mode"] for r in records})
    comps = [c for c in ("ember", "torch") if any(r["compiler"] == c for r in records)]
    colors = {"ember": "#d9534f", "torch": "#337ab7"}
    labels = {"ember": "ember", "torch": "torch.compile"}
    fig, axes = plt.subplots(len(modes), 2, figsize=(16, 4.5 * len(modes)), squeeze=False)
    for row, mode in enumerate(modes):
        models = sorted({r["model"] for r in records if r["mode"] == mode})
        idx = {(r["model"], r["compiler"]): r for r in records if r["mode"] == mode}
        width = 0.8 / max(len(comps), 1)
        for k, (key, title, unit) in enumerate((("speedup", "speedup vs eager", "x"),
                                                ("compile_s", "compile time", "s"))):
            ax = axes[row][k]
            for j, comp in enumerate(comps):
                vals = []
                for m in models:
                    r = idx.get((m, comp), {})
                    vals.append(r.get(key) if r.get("status") == "pass" and r.get(key) else 0.0)
                xs = [i + (j - (len(comps) - 1) / 2) * width for i in range(len(models))]
                ax.bar(xs, vals, width=width, color=colors[comp], label=labels[comp])
                for x, m in zip(xs, models):     # say why a bar is missing
                    st = idx.get((m, comp), {}).get("status")
                    if st and st != "pass":
                        ax.text(x, 0, STATUS_SHORT.get(st, st), rotation=90, ha="center",
                                va="bottom", fontsize=6, color=colors[comp])
            if key == "speedup":
                ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(models)))
            ax.set_xticklabels(models, rotation=70, ha="right", fontsize=7)
            ax.set_ylabel(unit)
            ax.set_title(f"{mode}: {title} (0 = not passed)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"


def from_json(paths: list[str], plot_path: str | None = None) -> int:
    """`ember bench --from-json FILE...`: the table and summary of saved records (later wins)."""
    latest: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    latest[(r["model"], r["mode"], r["compiler"])] = r
    records = list(latest.values())
    print(table(records))
    print()
    print(summary(records))
    if plot_path:
        print(plot(records, plot_path))
    return 0
