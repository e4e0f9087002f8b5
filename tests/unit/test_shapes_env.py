"""ember.shapes: size nodes built from sympy expressions and the env's hints (dynamic shapes)."""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from ember import shapes


def test_every_node_of_a_multi_term_size_expression_has_its_value():
    """s0*s1*s2 + s0 + 3 is a chain of binary ops; each partial product or sum is a node the
    partitioner may save for the backward (it read meta["val"]: KeyError) and the tracer places
    new size nodes after every node that has one (a partial without one put a user before it)."""
    env = shapes.ShapeEnv()
    s = [shapes.expr_of(env.new_symbol(h, source=("x", i))) for i, h in enumerate((2, 3, 5))]
    g = fx.Graph()
    syms = {}

    def symbol_node(sym):
        if sym not in syms:
            syms[sym] = g.placeholder(str(sym))
            syms[sym].meta["val"] = env.symint(sym)
        return syms[sym]
    out = shapes.to_fx(g, s[0] * s[1] * s[2] + s[0] + 3, symbol_node, {}, env)
    ops = [n for n in g.nodes if n.op == "call_function"]
    assert len(ops) >= 4 and {n.target for n in ops} == {operator.mul, operator.add}
    for n in ops:
        assert isinstance(n.meta["val"], torch.SymInt), n
    assert env.hint(shapes.expr_of(out.meta["val"])) == 2 * 3 * 5 + 2 + 3


def test_hint_of_an_expression_with_an_unevaluated_constant_max():
    """A decomposition's clamp can leave Max(0, 2) unevaluated inside a size expression; the
    value at the hints must still be decided (TypeError: cannot determine truth value)."""
    env = shapes.ShapeEnv()
    s0 = shapes.expr_of(env.new_symbol(3, source=("x", 0)))
    expr = sympy.StrictLessThan(sympy.Min(sympy.Max(0, 2, evaluate=False), s0 + 1), 2)
    assert env.evaluate(expr) == sympy.false
