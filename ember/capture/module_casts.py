"""Capture, `module.to(...)` / `.float()` / `.half()` / `.cpu()` ... called inside a traced forward.

Some models cast a submodule on every call (transformers' Switch/NLLB-MoE routers:
`self.classifier = self.classifier.to(self.dtype)`). Inlined, torch's `Module._apply` reads
`param.grad` and assigns `param.data`, which breaks the graph in every layer. When the cast
changes nothing (every floating parameter and buffer already has that dtype and device) it is
the identity: the module itself, and each of its tensors is read through the module (guarded:
a later `.half()` or a moved parameter fails the guards and recompiles, where the cast is then
refused). A cast that would change a tensor is refused as a graph break: it writes the module.
"""
from __future__ import annotations

import torch

from .scalar_args import REWRITES
from .values import ObjV

_M = torch.nn.Module
_FIXED = {_M.float: torch.float32, _M.double: torch.float64, _M.half: torch.float16,
          _M.bfloat16: torch.bfloat16}


def _target(f, args, kwargs):
    """(device, dtype) the cast asks for, None where it leaves that alone."""
    if f is _M.to:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is not None:
            return None
        return device, dtype
    if f in _FIXED and not args and not kwargs:
        return None, _FIXED[f]
    if f is _M.cpu and not args and not kwargs:
        return torch.device("cpu"), None
    if f is _M.type and len(args) + len(kwargs) == 1:
        return None, (args or list(kwargs.values()))[0]
    return None


def _unchanged(t: torch.Tensor, device, dtype) -> bool:
    if device is not None and t.device != torch.device(device):
        return False
    return dtype is None or not (t.is_floating_point() or t.is_complex()) or t.dtype == dtype


def module_cast(tr, f, args, kwargs):
    mv = args[0]
    if not (isinstance(mv, ObjV) and isinstance(mv.value, _M) and mv.source is not None):
        return None
    if not all(isinstance(a, ObjV) for a in (*args[1:], *kwargs.values())):
        raise tr.unsupported("a module cast with traced arguments")
    try:
        target = _target(f, [a.value for a in args[1:]], {k: a.value for k, a in kwargs.items()})
    except (TypeError, RuntimeError) as exc:
        raise tr.unsupported(f"{f.__qualname__} with arguments eager refuses: {exc}")
    if target is None:
        raise tr.unsupported(f"{f.__qualname__} with these arguments in the trace")
    from .attrs import load_attr
    for path, t in [*mv.value.named_parameters(), *mv.value.named_buffers()]:
        if not _unchanged(t, *target):
            raise tr.unsupported(f"{f.__qualname__} changes {path} ({t.dtype}, {t.device}) in "
                                 "the trace: it writes the module's parameters",
                                 hint="cast the model before compiling it")
        v = mv
        for part in path.split("."):       # read (and guard) each tensor through the module
            v = load_attr(tr, v, part)
    return mv


def _rewrite(f):
    return lambda tr, args, kwargs: module_cast(tr, f, args, kwargs)


for _f in (_M.to, _M.cpu, _M.type, *_FIXED):
    REWRITES[_f] = _rewrite(_f)
