"""Calling a weak reference in traced code: the referent, guarded to be the object the trace
saw. torch's RNN modules check `ref() is weight` for every weight on every call; that call was a
graph break around every nn.LSTM / GRU / RNN (timm's Sequencer: one per block)."""
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


def _pair(rnn):
    torch.manual_seed(0)
    m = Tagger(rnn)
    return m, copy.deepcopy(m)


def test_lstm_and_gru_inside_a_model_are_one_graph_with_equal_values_and_grads():
    for rnn in (nn.LSTM(8, 16, batch_first=True), nn.GRU(8, 16, num_layers=2, batch_first=True)):
        ember.reset()
        m, ref = _pair(rnn)
        ember.compile(m, backend="aot_eager")
        for _ in range(2):
            x = torch.randn(2, 5, 6)
            got, exp = m(x), ref(x)
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)
            got.square().sum().backward()
            exp.square().sum().backward()
        for (n, a), b in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=n)
        c = counts()
        assert (c.get("graphs"), c.get("graph_breaks", 0), c.get("recompiles", 0)) == (1, 0, 0), c


def test_replaced_rnn_weight_is_used_not_the_traced_one():
    """A weight replaced after compiling: eager sees `ref() is not weight` and rebuilds its flat
    weights; the compiled module must compute with the new weight too."""
    m, ref = _pair(nn.LSTM(8, 16, batch_first=True))
    ember.compile(m, backend="aot_eager")
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(m(x), ref(x))
    new = torch.randn(64, 16)
    m.rnn.weight_hh_l0 = nn.Parameter(new.clone())
    ref.rnn.weight_hh_l0 = nn.Parameter(new.clone())
    for _ in range(2):
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-6)


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
