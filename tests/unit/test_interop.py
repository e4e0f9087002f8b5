"""ember and torch.compile in one process (#29): ember patches no torch class, so Dynamo traces
modules as it would without ember, in either order; neither compiler captures the other's
frames (a torch.compile'd callable inside ember-compiled code is left to Dynamo)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import ember

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import sys, torch, torch.nn as nn, transformers, ember

    class MakesReLU(nn.Module):       # Dynamo traces nn.ReLU.__init__ (and Module.__setattr__)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return nn.ReLU()(self.fc(x))

    def ember_part():
        m = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        x = torch.ones(2, 8)
        ref = m(x)
        ember.compile(m)
        torch.testing.assert_close(m(x), ref)
        assert ember.stats()["counts"]["graphs"] == 1

    def torch_part():
        cfg = transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2,
                                            hidden_dim=64, max_position_embeddings=32)
        hf = transformers.DistilBertModel(cfg).eval()
        ids = torch.randint(0, 100, (2, 16))
        with torch.no_grad():
            ref = hf(ids).last_hidden_state
            out = torch.compile(hf, backend="aot_eager", fullgraph=True)(ids).last_hidden_state
        torch.testing.assert_close(out, ref)
        m, x = MakesReLU(), torch.randn(2, 8)
        torch.testing.assert_close(torch.compile(m, backend="aot_eager", fullgraph=True)(x), m(x))

    parts = (ember_part, torch_part) if sys.argv[1] == "ember-first" else (torch_part, ember_part)
    for part in parts:
        part()
    print("interop ok")
''')


@pytest.mark.parametrize("order", ["ember-first", "torch-first"])
def test_torch_compile_works_beside_ember(order):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, order], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "interop ok" in proc.stdout, proc.stderr[-3000:]


def test_neither_compiler_captures_the_others_frames():
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    try:
        counter = CompileCounter()
        mine = ember.compile(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), backend="eager")
        theirs = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()), backend=counter)
        x = torch.randn(3, 4)
        for _ in range(2):
            mine(x)
        assert counter.frame_count == 0 and ember.stats()["counts"]["graphs"] == 1
        for _ in range(2):
            theirs(x)
        assert counter.frame_count == 1 and ember.stats()["counts"]["graphs"] == 1

        def inner(t):
            return torch.sin(t) * 2
        compiled_inner = torch.compile(inner, backend=counter)

        def outer(t):
            return compiled_inner(t + 1) - 1
        expl = ember.explain(outer, x)
        # the call is a break: Dynamo compiles `inner` (one frame), ember the code around it
        assert expl.break_count == 1 and "compiled by torch.compile" in str(expl)
        torch.testing.assert_close(ember.compile(outer)(x), torch.sin(x + 1) * 2 - 1)
        assert counter.frame_count == 2
    finally:
        torch._dynamo.reset()


def test_torch_compiler_disable_is_a_named_break_and_runs_eagerly():
    """A torch.compiler.disable'd function called from compiled code: one break that names the
    mark (not "compiled by torch.compile"), the function runs eagerly on every call."""
    ran = []

    def helper(t):
        ran.append(1)               # a side effect: only an eager run appends
        return t.cos()

    disabled = torch.compiler.disable(helper)

    def fn(t):
        return disabled(t * 2) + 1

    x = torch.randn(8)
    expl = ember.explain(fn, x)
    assert expl.break_count == 1, str(expl)
    assert "torch.compiler.disable" in str(expl) and "compiled by torch.compile" not in str(expl)
    ember.reset()
    compiled = ember.compile(fn)
    ran.clear()
    for _ in range(3):
        torch.testing.assert_close(compiled(x), (x * 2).cos() + 1)
    assert len(ran) == 3
