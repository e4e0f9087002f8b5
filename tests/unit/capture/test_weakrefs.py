"""Calling a weak reference in traced code: the referent, guarded to be the object the trace
saw. torch's RNN modules check `ref() is weight` for every weight on every call; that call was a
graph break in every nn.LSTM / GRU / RNN compiled on its own. Inside a larger model an RNN
module runs eagerly, as under Dynamo."""
from __future__ import annotations

import copy
import weakref

import torch
import torch.nn as nn

import ember


def counts():
    return ember.stats()["counts"]


class Tagger(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.rnn = rnn
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h, _ = self.rnn(torch.tanh(self.inp(x)))
        return self.out(h).log_softmax(-1)


def test_rnn_compiled_as_the_root_is_one_graph_with_equal_values_and_grads():
    """Compiled itself, an RNN module's forward is traced: its weak-reference checks are one
    graph with the recurrence (no break at `_update_flat_weights`)."""
    for rnn in (nn.LSTM(6, 8, batch_first=True), nn.GRU(6, 8, num_layers=2, batch_first=True)):
        ember.reset()
        torch.manual_seed(0)
        m = rnn
        ref = copy.deepcopy(m)
        ember.compile(m, backend="aot_eager")
        for _ in range(2):
            x = torch.randn(2, 5, 6)
            got, exp = m(x)[0], ref(x)[0]
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)
            got.square().sum().backward()
            exp.square().sum().backward()
        for (n, a), b in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=n)
        c = counts()
        assert (c.get("graphs"), c.get("graph_breaks", 0), c.get("recompiles", 0)) == (1, 0, 0), c


def test_rnn_inside_a_model_runs_eagerly_between_graphs():
    """As under Dynamo (allow_rnn=False): traced, the time loop would unroll into per-step
    kernels (timm's Sequencer, 50 LSTMs, did not compile in 7 minutes)."""
    torch.manual_seed(0)
    m = Tagger(nn.LSTM(8, 16, batch_first=True))
    ref = copy.deepcopy(m)
    ember.compile(m, backend="aot_eager")
    x = torch.randn(2, 5, 6)
    for _ in range(2):
        got, exp = m(x), ref(x)
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)
        got.sum().backward()
        exp.sum().backward()
    for (n, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=n)
    e = ember.explain(copy.deepcopy(ref), x)
    assert (e.graph_count, e.break_count) == (2, 1), e
    assert "LSTM module: recurrent modules run eagerly" in e.breaks[0].reason, e.breaks


def test_replaced_rnn_weight_is_used_not_the_traced_one():
    """A weight replaced after compiling: eager sees `ref() is not weight` and rebuilds its flat
    weights; the compiled module must compute with the new weight too."""
    torch.manual_seed(0)
    m = nn.LSTM(6, 16, batch_first=True)
    ref = copy.deepcopy(m)
    ember.compile(m, backend="aot_eager")
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(m(x)[0], ref(x)[0])
    new = torch.randn(64, 16)
    m.weight_hh_l0 = nn.Parameter(new.clone())
    ref.weight_hh_l0 = nn.Parameter(new.clone())
    for _ in range(2):
        torch.testing.assert_close(m(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)


def test_weak_reference_to_a_tensor_that_dies():
    def f(x, refs):
        w = refs[0]()
        if w is None:
            return x - 1
        return x * w

    cf = ember.compile(f, backend="aot_eager")
    x, w = torch.randn(4), torch.randn(4)
    refs = [weakref.ref(w)]
    torch.testing.assert_close(cf(x, refs), x * w)
    assert counts().get("graph_breaks", 0) == 0, counts()
    other = torch.randn(4)
    torch.testing.assert_close(cf(x, [weakref.ref(other)]), x * other)
    del w, other
    torch.testing.assert_close(cf(x, refs), x - 1)
