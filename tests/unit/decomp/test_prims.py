"""PRIMS is a well-formed contract: OpOverloads, each with a kind, none decomposed."""
import torch

from ember.decomp import DECOMPS, PRIM_KINDS, PRIMS


def test_prims_are_overloads_with_kinds():
    assert PRIMS == frozenset(PRIM_KINDS)
    for op in PRIMS:
        assert isinstance(op, torch._ops.OpOverload), op
    assert set(PRIM_KINDS.values()) <= {"pointwise", "reduction", "creation", "random", "view",
                                        "indexing", "extern"}


def test_no_prim_is_decomposed():
    assert not (PRIMS & set(DECOMPS)), sorted(map(str, PRIMS & set(DECOMPS)))
