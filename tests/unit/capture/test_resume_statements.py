"""A graph break at a store/delete statement (STORE_SUBSCR, STORE_ATTR, DELETE_SUBSCR,
DELETE_ATTR): the statement runs eagerly on its own and the rest of the frame resumes in a
second graph; checked against eager with graph/break counts."""
from __future__ import annotations

import os

import torch

import ember

from .helpers import same


def _run(f, *args):
    cf = ember.compile(f, backend="eager")
    for _ in range(2):
        same(f(*args), cf(*args))
    return ember.stats()["counts"]


def test_store_subscr_on_os_environ_resumes():
    def f(x):
        x = x + 1
        os.environ["EMBER_TEST_STORE"] = "0"
        return torch.sin(x)

    try:
        c = _run(f, torch.ones(3))
        assert os.environ["EMBER_TEST_STORE"] == "0"
    finally:
        os.environ.pop("EMBER_TEST_STORE", None)
    assert c.get("graphs") == 2 and c.get("graph_breaks") == 1, c


def test_store_attr_of_tensor_property_resumes():
    def f(x, y):
        z = x * 2
        z.real = y                       # a torch.Tensor descriptor: runs eagerly
        return z + 1

    c = _run(f, torch.randn(3), torch.randn(3))
    assert c.get("graphs") == 2 and c.get("graph_breaks") == 1, c


def test_delete_subscr_on_os_environ_resumes():
    def f(x):
        x = x.cos()
        del os.environ["EMBER_TEST_DEL"]
        return x.sin()

    cf = ember.compile(f, backend="eager")
    x = torch.randn(3)
    for _ in range(2):
        os.environ["EMBER_TEST_DEL"] = "1"
        same(cf(x), x.cos().sin())
        assert "EMBER_TEST_DEL" not in os.environ
    c = ember.stats()["counts"]
    assert c.get("graphs") == 2 and c.get("graph_breaks") == 1, c


def test_machine_queries_fold():
    def f(x):
        if torch.cuda.is_available() or not torch.autograd._is_checkpoint_valid():
            return x - 1
        return x + 1

    cf = ember.compile(f, backend="eager", fullgraph=True)
    same(cf(torch.ones(2)), f(torch.ones(2)))


_STATE = {"a": 1}


def test_state_changed_by_compiling_retraces_once():
    def backend(gm, example_inputs):
        _STATE.setdefault("compiled", 0)      # the first compile adds a key the trace read
        return gm

    def f(x):
        return x * len(_STATE)

    cf = ember.compile(f, backend=backend, fullgraph=True)
    same(cf(torch.ones(2)), torch.ones(2) * 2)
    same(cf(torch.ones(2)), torch.ones(2) * 2)
