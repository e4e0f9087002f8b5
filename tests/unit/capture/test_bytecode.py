"""Bytecode layer: normalization (PRECALL/KW_NAMES folded, jumps by index, exception table) and
an identity round trip (decode with the bytecode package, assemble back) over many functions."""
from __future__ import annotations

import inspect
import json
import os
import types

import pytest
import torch

from ember.capture.bytecode import PY, assemble, code_equal, decode


def _functions(mod, limit):
    out = []
    for name, obj in sorted(vars(mod).items()):
        if isinstance(obj, types.FunctionType) and obj.__code__.co_filename.endswith(".py"):
            out.append(obj)
        elif isinstance(obj, type) and obj.__module__ == mod.__name__:
            for v in vars(obj).values():
                if isinstance(v, types.FunctionType):
                    out.append(v)
        if len(out) >= limit:
            break
    return out


def _corpus():
    import collections
    import dataclasses
    import functools
    import textwrap
    import torch.nn.functional as F
    import torch.nn.modules.conv as conv
    import torch.nn.modules.module as module
    fns = []
    for mod, n in ((json.decoder, 30), (os.path if hasattr(os, "path") else os, 40),
                   (collections, 60), (dataclasses, 60), (functools, 30), (textwrap, 30),
                   (inspect, 120), (F, 150), (module, 80), (conv, 30)):
        fns.extend(_functions(mod, n))
    return fns


def _all_codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _all_codes(c)


def test_round_trip_identity_over_stdlib_and_torch():
    fns = _corpus()
    assert len(fns) >= 300, len(fns)
    bad = []
    for fn in fns:
        code = fn.__code__
        if not code_equal(code, assemble(code)):
            bad.append(fn.__qualname__)
    assert not bad, bad[:10]


def test_decode_every_corpus_function():
    n = 0
    for fn in _corpus():
        for code in _all_codes(fn.__code__):
            instrs, table = decode(code)
            n += len(instrs)
            for ins in instrs:
                assert ins.opname not in ("PRECALL", "KW_NAMES", "CACHE", "EXTENDED_ARG")
                if ins.target is not None:
                    assert 0 <= ins.target <= len(instrs)
            for e in table:
                assert 0 <= e.start <= e.end < len(instrs) and 0 <= e.target < len(instrs)
    assert n > 10000


def test_normalization():
    def f(x, y):
        try:
            z = x.add(y, alpha=2)
        except ValueError:
            z = None
        for i in range(3):
            if i:
                continue
        return z
    instrs, table = decode(f.__code__)
    names = [i.opname for i in instrs]
    calls = [i for i in instrs if i.opname == "CALL"]
    assert any(c.kw_names == ("alpha",) for c in calls)
    assert "LOAD_METHOD" in names
    assert "POP_JUMP_IF_FALSE" in names or "POP_JUMP_IF_TRUE" in names
    assert "JUMP" in names
    assert table and all(instrs[e.target].opname == "PUSH_EXC_INFO" for e in table[:1])
    fi = next(i for i in instrs if i.opname == "FOR_ITER")
    assert instrs[fi.target - 1].opname in ("JUMP", "END_FOR", "POP_TOP", "JUMP_BACKWARD")


@pytest.mark.skipif(PY < (3, 12), reason="3.12 forms")
def test_312_method_load_attr():
    def f(x):
        return x.view(-1)
    names = [i.opname for i in decode(f.__code__)[0]]
    assert "LOAD_METHOD" in names


def test_big_torch_function_decodes():
    code = torch.nn.Module._call_impl.__code__
    instrs, table = decode(code)
    assert len(instrs) > 100 and table
