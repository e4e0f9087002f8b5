"""PyTorch's own Dynamo tests as ember's capture conformance target.

    python -m tests.peer.dynamo_runner                 # reference + ember run, table, diff
    python -m tests.peer.dynamo_runner --reuse-reference   # ember run only (reference from file)
    python -m tests.peer.dynamo_runner --update        # ... and rewrite expected_dynamo.json
    python -m tests.peer.dynamo_runner -k test_add     # a pytest -k selection

Each file of ../shared/peer-tests/pytorch/dynamo runs in a pytest process of its own, once with
real torch.compile (the reference) and once with Dynamo's user entry points redirected to
ember.compile (tests/peer/dynamo_plugin.py; EMBER_STRICT=1, EMBER_SPEED_CHECK=0). Only tests
that pass under the reference count. Each of those gets one class under ember:

  pass       passed, ember compiled >= 1 graph, Dynamo compiled nothing
  count      failed only an assertion on graph/frame/op counts (ember's split differs)
  wrong      failed an assertion on values or behaviour: a wrong answer, the class that matters
  crash      an exception raised inside ember that is not ember.Unsupported (InternalError &c),
             or a test that did not finish (timeout, killed process)
  refusal    ember.Unsupported, or ember ran (part of) the code eagerly where the test needed
             a graph (a fallback that makes a count assertion fail, or 0 graphs in a pass)
  internals  asserts on Dynamo's internals (its counters, guard objects, generated graph text,
             OptimizedModule attributes, Dynamo's own exceptions) that no other compiler has
  other      anything else (an exception in the test's own code): listed to be looked at
  dynamo     Dynamo compiled a graph: the redirection missed an entry point
Tests that are skipped or fail under the reference are reported apart.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_DIR = Path(os.environ.get("EMBER_PEER_DIR", ROOT.parent / "shared" / "peer-tests" / "pytorch"
                               / "dynamo"))
FILES = ("test_functions.py", "test_modules.py", "test_misc_part1.py")
EXPECTED = Path(__file__).with_name("expected_dynamo.json")
CLASSES = ("pass", "count", "wrong", "crash", "refusal", "internals", "other", "dynamo")

# what a failing assertion's line (in the test, or in Dynamo's standard_test) is about
_COUNT = re.compile(r"frame_count|op_count|\.graphs\b|graph_count|num_graphs|call_count|"
                    r"compile_count|cnt\w*\b\)?\s*,\s*\d|recompil", re.I)
_INTERNALS = re.compile(r"assertExpected|normalize_gm|FileCheck|counters\[|guard|comptime|"
                        r"_debug_get_cache_entry_list|graph_break_reason|print_readable|"
                        r"_orig_mod|explain|\.code\b|torch\._dynamo\.(utils|config|exc|eval_frame)")
# failing tests whose assertion is about Dynamo itself, read from the test's code (reviewed by hand)
KNOWN_INTERNALS = {
    "test_modules.py::NNModuleTests::test_call_fn_with_non_const_inputs_safe":
        "torch._dynamo.export (Dynamo's export API)",
    "test_misc_part1.py::MiscTests::test_get_cache_entry":
        "_debug_get_cache_entry_list: Dynamo's per-code cache entries",
    "test_modules.py::OptimizedModuleTest::test_mark_static_nn_module_tensor":
        "a placeholder named l_mod_buf with meta _dynamo_static_input_type",
    "test_modules.py::OptimizedModuleTest::test_mark_static_previously_seen_tensor":
        "a placeholder named l_mod_buf with meta _dynamo_static_input_type",
    "test_modules.py::OptimizedModuleTest::test_mark_static_with_freezing":
        "Dynamo's freezing: buffers as graph attributes, no placeholder l_b_",
    "test_misc_part1.py::MiscTests::test_tensor_subclass_method_traced":
        "an FX call_method node (ember's graphs hold call_function nodes only)",
}
_INTERNAL_MSG = re.compile(r"_orig_mod|_torchdynamo|\bOptimizedModule\b|torch\._dynamo")


def classify(emb: dict | None) -> str:
    """The class (above) of one ember-mode row of a test that passed under the reference."""
    if emb is not None and emb["id"] in KNOWN_INTERNALS and not (
            emb["outcome"] == "passed" and emb["graphs"] and not emb["dynamo_graphs"]):
        return "internals"
    if emb is None or emb["outcome"] == "error" and not emb.get("failure"):
        return "crash"                       # never reported back: timeout or a killed process
    if emb["dynamo_graphs"]:
        return "dynamo"
    if emb["outcome"] == "passed":
        return "pass" if emb["graphs"] else "refusal"
    if emb["outcome"] == "skipped":
        return "other"
    f = emb.get("failure") or {}
    chain = " ".join(f.get("chain", []))
    if "ember.errors.Unsupported" in chain or "ember.errors.RecompileError" in chain:
        return "refusal"
    if f.get("exc") == "PeerTimeout":
        return "crash"
    line, msg = f.get("test_line", ""), f.get("msg", "").split("\n\nTo execute this test")[0]
    inner = f.get("innermost", "")
    if "/torch/_dynamo/" in inner and not inner.endswith("_dynamo/testing.py") or \
            _INTERNALS.search(line) or _INTERNAL_MSG.search(msg) or "torch._dynamo.exc" in chain:
        return "internals"
    if f.get("exc") == "AssertionError" or "AssertionError" in chain:
        if _COUNT.search(line):
            return "refusal" if emb.get("eager") else "count"
        return "wrong"
    if f.get("in_ember"):
        return "crash"
    return "other"


def _run_file(name: str, mode: str, select: str | None, timeout: float, ids=None) -> list:
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as tmp:
        out = tmp.name
    env = dict(os.environ, EMBER_PEER_MODE=mode, EMBER_PEER_OUT=out, EMBER_STRICT="1",
               EMBER_SPEED_CHECK="0", EMBER_PEER_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if os.environ.get("EMBER_PEER_EMBER"):     # measure another tree's ember (before/after)
        env["PYTHONPATH"] = os.pathsep.join([os.environ["EMBER_PEER_EMBER"], env["PYTHONPATH"]])
    targets = [f"{name}::{i.split('::', 1)[1]}" for i in ids] if ids else [name]
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.peer.dynamo_plugin", "-p",
           "no:cacheprovider", "-q", "-o", "addopts=", "--rootdir", str(PEER_DIR),
           "-W", "ignore", *targets] + (["-k", select] if select else [])
    subprocess.run(cmd, cwd=PEER_DIR, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=None)
    rows = []
    with open(out) as f:
        for line in f:
            rows.append(json.loads(line))
    os.unlink(out)
    return rows


def run(files, modes, select=None, jobs=2, timeout=120.0, ids=None) -> dict:
    """{mode: {test id: row}} for the given files and modes, files run `jobs` at a time."""
    ids_of = collections.defaultdict(list)
    for i in ids or ():
        ids_of[i.split("::", 1)[0]].append(i)
    work = [(f, m) for m in modes for f in files if not ids or ids_of[f]]
    result = {m: {} for m in modes}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for (f, m), rows in zip(work, pool.map(lambda fm: _run_file(
                fm[0], fm[1], select, timeout, ids_of.get(fm[0])), work)):
            for r in rows:
                result[m][r["id"]] = r
    return result


def summarize(reference: dict, ember: dict, expected_ids=None) -> dict:
    """{test id: {"ref": outcome, "class": class or None}} over the reference's tests."""
    out = {}
    for tid, ref in sorted(reference.items()):
        if expected_ids is not None and tid not in expected_ids:
            continue
        counted = ref["outcome"] == "passed" and ref.get("dynamo_graphs", 1) > 0
        row = {"ref": ref["outcome"] if ref["outcome"] != "passed" or counted else "no-compile"}
        if counted:
            row["class"] = classify(ember.get(tid))
        out[tid] = row
    return out


def table(summary: dict) -> str:
    per = collections.defaultdict(collections.Counter)
    for tid, row in summary.items():
        f = tid.split("::", 1)[0]
        for key in (f, "total"):
            per[key]["tests"] += 1
            per[key]["ref_pass"] += "class" in row
            per[key][row.get("class") or f"ref_{row['ref']}"] += 1
    head = ["file", "tests", "ref_pass", *CLASSES, "pass%"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for f in sorted(per, key=lambda k: (k == "total", k)):
        c = per[f]
        pct = f"{100 * c['pass'] / c['ref_pass']:.1f}" if c["ref_pass"] else "-"
        lines.append(" | ".join([f, str(c["tests"]), str(c["ref_pass"]),
                                 *(str(c[k]) for k in CLASSES), pct]))
    return "\n".join(lines)


def details(summary: dict, ember: dict, classes=("wrong", "crash", "other", "dynamo",
                                                 "internals", "refusal", "count")) -> str:
    lines = []
    for cls in classes:
        rows = [(t, r) for t, r in summary.items() if r.get("class") == cls]
        if not rows:
            continue
        lines.append(f"\n## {cls} ({len(rows)})")
        for tid, _ in rows:
            e = ember.get(tid) or {}
            f = e.get("failure") or {}
            why = f"{f.get('exc', '')}: {f.get('msg', '')}".strip(": ") or \
                ("; ".join(e.get("eager", [])) or "no graph")
            why = why.replace("\n", " ")[:200]
            lines.append(f"- {tid}: {why}" + (f"  [{f['test_line']}]" if f.get("test_line") else ""))
    return "\n".join(lines)


def diff(summary: dict, expected: dict) -> tuple[list, list]:
    """(regressions: expected pass, now not; improvements: now pass, expected not)."""
    regressions = [t for t, r in expected.items() if r.get("class") == "pass" and
                   t in summary and summary[t].get("class") != "pass"]
    improvements = [t for t, r in summary.items() if r.get("class") == "pass" and
                    expected.get(t, {}).get("class") != "pass"]
    return regressions, improvements


def load_expected() -> dict:
    return json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", nargs="*", default=list(FILES))
    p.add_argument("-k", dest="select", help="pytest -k expression")
    p.add_argument("--reuse-reference", action="store_true",
                   help="take the reference outcomes from expected_dynamo.json")
    p.add_argument("--update", action="store_true", help="rewrite expected_dynamo.json")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test")
    p.add_argument("--details", action="store_true", help="list every non-pass with its reason")
    p.add_argument("--json", help="write the raw rows of both runs here")
    p.add_argument("--from-json", help="classify the rows a --json run wrote, run nothing")
    a = p.parse_args(argv)
    expected = load_expected()
    modes = ["ember"] if a.reuse_reference else ["reference", "ember"]
    rows = json.loads(Path(a.from_json).read_text()) if a.from_json else \
        run(a.files, modes, a.select, a.jobs, a.timeout)
    if a.reuse_reference:
        rows["reference"] = {t: {"outcome": "passed" if "class" in r else r["ref"],
                                 "dynamo_graphs": 1 if "class" in r else 0}
                             for t, r in expected.items() if t in rows["ember"]}
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    summary = summarize(rows["reference"], rows["ember"])
    print(table(summary))
    print(details(summary, rows["ember"], CLASSES[1:] if a.details else ("wrong", "crash",
                                                                         "other", "dynamo")))
    regressions, improvements = diff(summary, expected)
    print(f"\n{len(improvements)} newly passing, {len(regressions)} regressions against "
          f"{EXPECTED.name}" + "".join(f"\n  REGRESSION {t}: {summary[t].get('class')}"
                                       for t in regressions))
    if a.update:
        merged = dict(expected) if (a.select or set(a.files) != set(FILES)) else {}
        merged.update(summary)
        EXPECTED.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        print(f"wrote {EXPECTED}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
