"""Walkthrough: compile a 3-layer MLP with ember and print every stage's IR.

    .venv/bin/python docs/walkthrough.py            # all stages, in the order they ran
    .venv/bin/python docs/walkthrough.py --brief    # first lines of each file only

It sets EMBER_DEBUG_DIR to a temporary folder, runs one training step (forward, backward) through
`ember.compile`, checks the result against eager PyTorch, and prints the files each stage wrote:
all in one folder (graph_1/), numbered in the order the stages ran: the captured FX graph
(capture), aot's forward and backward aten graphs (after the decompositions), the forward's loop IR
(`# after lower:`: one `def` per computed buffer, its body as `ops` calls), the schedule
(`# after schedule:`: kernels, externs and where each buffer dies), the generated C++ and Python
wrapper (codegen), the cache entry's guards (capture), then the backward's loop IR, schedule, C++
and wrapper, compiled at the first backward call. tests/test_walkthrough.py runs it, so this document cannot go stale.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# the ember of the tree this file is in (not whichever one is installed)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(brief: bool = False) -> int:
    debug = Path(tempfile.mkdtemp(prefix="ember-walkthrough-"))
    os.environ["EMBER_DEBUG_DIR"] = str(debug)
    # a fresh kernel cache, so codegen runs (a warm cache would skip straight to the built kernels)
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-walkthrough-cache-")
    import torch

    import ember

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(*[m for m in model])  # same parameters, eager
    x = torch.randn(5, 8)

    expected = reference(x)
    expected.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    ember.compile(model)                  # the one line
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    for p, g in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g)

    files = sorted((p for p in debug.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    print(f"# ember walkthrough: {len(files)} stage files under {debug}; output and grads equal eager\n")
    for path in files:
        text = path.read_text()
        lines = text.splitlines()
        shown = lines[:12] if brief else lines
        print(f"==== {path.relative_to(debug)} ({len(lines)} lines)")
        print("\n".join(shown))
        if brief and len(lines) > len(shown):
            print("    ...")
        print()
    return 0 if files else 1


if __name__ == "__main__":
    sys.exit(main(brief="--brief" in sys.argv))
