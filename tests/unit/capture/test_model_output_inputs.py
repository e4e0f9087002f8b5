"""A transformers ModelOutput that reaches a frame from outside (an argument, or a resume
function's local after a break in the submodule that made it) is read in the graph: indexing,
to_tuple, keys/items/values, iteration; guarded on its keys; writes to it break; a returned one
is the caller's object."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import capture

from .helpers import same

mo = pytest.importorskip("transformers.modeling_outputs")


def test_argument_model_output_indexed_in_one_graph():
    def loss(out, y):
        keys = list(out.keys())
        names = [k for k, _ in out.items()]
        n = len(out) + sum(1 for _ in out) + sum(1 for _ in out.values())
        return F.mse_loss(out[0], y) + out["last_hidden_state"].sum() + \
            out.to_tuple()[0].mean() + n, keys, names, "hidden_states" in out

    c = ember.compile(loss, backend="eager", fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    for o in (mo.BaseModelOutput(last_hidden_state=x),
              mo.BaseModelOutput(last_hidden_state=x, hidden_states=(x * 2, x + 1))):
        same(loss(o, y), c(o, y))
    # a new set of keys is a recompile, not a stale graph
    assert capture.stats() == {"graphs": 2, "recompiles": 1}, capture.stats()


def test_resume_local_model_output_after_break_in_submodule():
    class Enc(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            print("break")                      # a graph break inside the callee
            return mo.BaseModelOutput(last_hidden_state=y + 1)

    class Top(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Enc()

        def forward(self, x):
            out = self.enc(x)
            s = out[0]
            return s.sin() + out.last_hidden_state

    m = Top()
    x = torch.randn(3)
    expected = m(x)
    got = ember.compile(m)(x)
    torch.testing.assert_close(got, expected)
    st = capture.stats()
    # the two print() breaks only: the resume function after `self.enc(x)` is one graph
    assert st.get("graph_breaks") == 2 and st.get("unsupported") == 2, st
    assert st.get("graphs") == 3, st


def test_returned_model_output_is_the_callers_object():
    def f(out, x):
        return out, out[0] + x

    c = ember.compile(f, backend="eager", fullgraph=True)
    o = mo.BaseModelOutput(last_hidden_state=torch.randn(2))
    r, y = c(o, torch.ones(2))
    assert r is o
    torch.testing.assert_close(y, o[0] + 1)


@pytest.mark.parametrize("how", ["item", "attr"])
def test_write_to_model_output_argument_breaks_and_matches_eager(how):
    def f(out):
        if how == "item":
            out["last_hidden_state"] = out[0] * 2
        else:
            out.last_hidden_state = out[0] * 2
        return out[0] + 1, out.to_tuple()

    x = torch.randn(3)
    a, b = mo.BaseModelOutput(last_hidden_state=x.clone()), \
        mo.BaseModelOutput(last_hidden_state=x.clone())
    expected = f(a)
    got = ember.compile(f, backend="eager")(b)
    same(expected, got)
    same(a.to_tuple(), b.to_tuple())
    assert b.last_hidden_state is b[0]
    with pytest.raises(ember.Unsupported, match="writing"):
        ember.compile(f, backend="eager", fullgraph=True)(b)


def test_model_output_out_of_sync_is_not_read_as_fields():
    # a mapping item set behind ModelOutput's setters: not the fields, so not traced as them
    def f(out):
        return out[0] + 1

    o = mo.BaseModelOutput(last_hidden_state=torch.zeros(2))
    dict.__setitem__(o, "last_hidden_state", torch.ones(2))
    got = ember.compile(f, backend="eager")(o)
    torch.testing.assert_close(got, f(o))
