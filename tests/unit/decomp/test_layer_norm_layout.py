"""Layer norm's decomposition returns contiguous outputs, as ATen's kernels do, whatever the
input's layout (docs/design/070): after a conv1d front end whose `[B, C, L]` output is permuted to
`[B, L, C]` (Whisper's encoder), the following `linear` then traces as eager runs it (addmm on
the flattened rows; its input gradient `grad @ W`, not `(W^T @ grad^T)^T`)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import aot_compile
from ember.decomp import get_decompositions

aten = torch.ops.aten


class ConvFront(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.pos = nn.Parameter(torch.randn(20, 16))
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 24)

    def forward(self, x):
        h = F.gelu(self.conv(x)).permute(0, 2, 1) + self.pos
        return self.fc(self.ln(h)).relu()


def _mm_calls(model, x):
    """(graph, op, arg strides) of every mm/addmm in the traced forward and backward graphs."""
    calls = []

    def record(tag):
        def compiler(gm, example_inputs):
            for n in gm.graph.nodes:
                if n.op == "call_function" and n.target in (aten.mm.default, aten.addmm.default):
                    calls.append((tag, n.target, tuple(tuple(a.meta["val"].stride())
                                                       for a in n.args if hasattr(a, "meta"))))
            return gm.forward
        return compiler

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, fw_compiler=record("fw"), bw_compiler=record("bw"),
                           decompositions=get_decompositions())
    torch.compile(model, backend=backend, dynamic=False)(x).sum().backward()
    return calls


def test_linear_after_permuted_layer_norm_traces_as_eager():
    torch.manual_seed(0)
    calls = _mm_calls(ConvFront(), torch.randn(1, 8, 20))     # batch 1, as in Whisper
    fw = [c for c in calls if c[0] == "fw"]
    assert [op for _, op, _ in fw] == [aten.addmm.default], calls
    bw = [c for c in calls if c[0] == "bw"]
    assert len(bw) == 2, calls
    # the input gradient [40, 16] computed as grad @ W (a column-major normalized input made
    # it (W^T @ grad^T)^T, mm_mat1_backward's column-major case)
    assert ("bw", aten.mm.default, ((24, 1), (16, 1))) in bw, calls


@pytest.mark.parametrize("batch", [1, 2])
def test_permuted_layer_norm_values_and_grads(batch):
    torch.manual_seed(0)
    model = ConvFront()
    ref = ConvFront()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(batch, 8, 20)
    cm = ember.compile(model, options={"speed_check": False})
    out, want = cm(x), ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
