"""Capture, guards: `Guard(kind, source, expected)` records and the global-state tuple.

The tracer appends guards as it reads the caller's state; entry.py turns a cache entry's guard
list into one generated straight-line Python function (cheap checks first). Guards whose source
goes through an nn.Module attribute are *structural*: they are re-checked only when a snapshot of
the module tree they read (statecheck.py: its dicts' version tags, its tensors' storage and
requires_grad) says it changed, or when the frame's root module object changed; the rest run on
every call. Nothing in torch is patched.
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any

import torch

from .dictkeys import same_keys
from .sources import Source
from .subclasses import flatten_meta
from .values import is_literal

# kind → rank: cheap checks first
RANKS = {"GLOBAL_STATE": 0, "ID": 1, "TYPE": 2, "NONE": 2, "EQ": 3, "LEN": 3, "KEYS": 4,
         "ALIAS": 5, "HASATTR": 5, "ABSENT": 5, "TENSOR": 6, "SHAPE": 6, "FLATTEN": 6,
         "NO_ALIAS": 7, "NO_HOOKS": 7, "NO_GLOBAL_HOOKS": 7}


@dataclasses.dataclass
class Guard:
    kind: str
    source: Source | None
    expected: Any

    def expr(self, bind) -> str:
        """A Python boolean expression; `bind(obj) -> name` puts a constant in the namespace."""
        e = self.source.expr() if self.source is not None else ""
        k = self.kind
        if k == "TYPE":
            return f"type({e}) is {bind(self.expected)}"
        if k == "ID":
            return f"{e} is {bind(self.expected)}"
        if k == "NONE":
            return f"{e} is None"
        if k == "EQ":
            val = self.expected
            return f"type({e}) is {bind(type(val))} and {e} == {bind(val)}"
        if k == "LEN":
            return f"len({e}) == {self.expected}"
        if k == "HASATTR":          # an instance attribute of a tensor (x.tag = ...)
            name, present = self.expected
            return f"hasattr({e}, {name!r}) is {present}"
        if k == "ABSENT":           # a class attribute not shadowed on the instance (forward)
            return f"{self.source.attr!r} not in {self.source.base.expr()}.__dict__"
        if k == "KEYS":
            if all(is_literal(x) for x in self.expected):
                return f"list({e}) == {bind(list(self.expected))}"
            return f"{bind(same_keys)}({e}, {bind(list(self.expected))})"  # objects: identity
        if k == "ALIAS":
            return f"{e} is {self.expected.expr()}"
        if k == "TENSOR":
            cls, dtype, device, shape, stride, rg, neg = self.expected
            if device.type == "cpu":
                dev = f"{e}.is_cpu"
            elif device.type == "cuda":
                dev = f"{e}.is_cuda and {e}.get_device() == {device.index or 0}"
            else:
                dev = f"{e}.device == {bind(device)}"
            if None in shape:
                geom = _dynamic_geometry(e, shape, stride)
            else:
                geom = f"{e}.shape == {bind(torch.Size(shape))} and {e}.stride() == {stride!r}"
            return (f"type({e}) is {bind(cls)} and {e}.dtype is {bind(dtype)} and {geom} and "
                    f"{e}.requires_grad is {rg} and {dev} and {e}.is_neg() is {neg}")
        if k == "SHAPE":
            return self.expected[0]
        if k == "FLATTEN":          # a tensor subclass's inner attributes and context
            return f"{bind(flatten_meta)}({e}) == {bind(self.expected)}"
        if k == "GLOBAL_STATE":
            return f"{bind(global_state)}() == {bind(self.expected)}"
        if k == "NO_ALIAS":
            ptrs = ", ".join(_storage_ptr(o.expr(), bind) for o in self.expected)
            return f"{_storage_ptr(e, bind)} not in ({ptrs},)"
        if k == "NO_HOOKS":
            return (f"not ({e}._forward_hooks or {e}._forward_pre_hooks or {e}._backward_hooks "
                    f"or {e}._backward_pre_hooks)")
        if k == "NO_GLOBAL_HOOKS":  # torch.nn.modules.module's global hook dicts, all empty
            g = self.source.gid
            return "not (" + " or ".join(f"{g}[{name!r}]" for name in self.expected) + ")"
        raise ValueError(f"unknown guard kind {k}")

    @property
    def structural(self) -> bool:
        return self.source is not None and self.source.structural

    def describe(self) -> str:
        name = self.source.name() if self.source is not None else (
            "sizes" if self.kind == "SHAPE" else "global state")
        exp = self.expected
        if self.kind == "TENSOR":
            cls, dtype, device, shape, stride, rg, neg = exp
            if None in shape:
                shape = ["?" if n is None else n for n in shape]
                stride = f"dense in dim order {list(stride)}"
            else:
                shape, stride = list(shape), list(stride)
            exp = f"{cls.__name__}(dtype={dtype}, device={device}, shape={shape}, " \
                  f"stride={stride}, requires_grad={rg}{', negative view' if neg else ''})"
        elif self.kind == "SHAPE":
            exp = self.expected[1]
        elif self.kind in ("TYPE",):
            exp = getattr(exp, "__qualname__", exp)
        elif self.kind == "ID":
            exp = f"id {id(exp):#x} ({type(exp).__name__})"
        elif self.kind == "NO_ALIAS":
            exp = "shares no memory with " + ", ".join(o.name() for o in exp)
        elif self.kind == "GLOBAL_STATE":
            exp = dict(zip(("grad_enabled", "inference_mode", "default_dtype", "autocast",
                            "dispatch_modes", "torch_func_transform"), exp))
        elif self.kind == "NO_GLOBAL_HOOKS":
            name, exp = "torch.nn.modules.module", "has none of " + ", ".join(exp)
        return f"{self.kind}: {name} {exp}"


def _storage_ptr(e: str, bind) -> str:
    """`e`'s storage address. The first NO_ALIAS guard of a check function that reads it binds
    it to a local (`:=`) and later ones reuse it (the guards are one `and` chain, evaluated in
    the order their expressions are made): a static KV cache's 18 mutated tensors, each checked
    against 20 inputs, cost 38 storage lookups a call instead of 378."""
    names = getattr(bind, "storage_ptrs", None)
    if names is None:
        names = bind.storage_ptrs = {}
    name = names.get(e)
    if name is not None:
        return name
    name = names[e] = f"__sp{len(names)}"
    return f"({name} := {e}.untyped_storage().data_ptr())"


def _dynamic_geometry(e: str, shape, order) -> str:
    """A tensor with dynamic dims (None in `shape`): rank, the static sizes, each dynamic size
    >= 2, and strides row-major over the dims in `order` (what the symbolic meta was built as).
    The shape is read once (a walrus local of the generated guard function)."""
    sh = f"__sh_{re.sub(r'[^A-Za-z0-9]', '_', e)}_{zlib.crc32(e.encode()):x}"
    checks = [f"len({sh} := {e}.shape) == {len(shape)}"]
    for d, n in enumerate(shape):
        checks.append(f"{sh}[{d}] >= 2" if n is None else f"{sh}[{d}] == {n}")
    strides = [""] * len(shape)
    acc = "1"
    for d in reversed(order):
        strides[d] = acc
        acc = f"{acc} * {sh}[{d}]" if acc != "1" else f"{sh}[{d}]"
    checks.append(f"{e}.stride() == ({', '.join(strides)},)")
    return " and ".join(checks)


_any_autocast = torch._C._is_any_autocast_enabled


_dispatch_modes = torch._C._len_torch_dispatch_stack


def global_state():
    """(grad mode, inference mode, default dtype, autocast details or None, number of active
    TorchDispatchModes, under a torch.func transform): one cheap tuple. A user dispatch mode
    must see every op, so a call made under one misses every entry (and runs eagerly:
    entry.Runner.miss); so does a call under a torch.func transform."""
    ac = None
    if _any_autocast():
        ac = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                   for d in ("cpu", "cuda"))
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.get_default_dtype(), ac, _dispatch_modes(), _functorch_stack() is not None)


_functorch_stack = torch._C._functorch.peek_interpreter_stack
