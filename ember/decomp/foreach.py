"""Stage 3, decomp: optimizer `_foreach_*` ops → a loop of the per-tensor op (then decomposed
or a prim). Generated from the schemas: list arguments (Tensor[], Scalar[]) are indexed per
element, everything else is passed through; the in-place forms copy_ each result back into self.
"""
from __future__ import annotations

import torch

from .registry import DECOMPS, register

aten = torch.ops.aten

# base op when the foreach op's scalar form has no same-named aten overload
_SCALAR_BASE = {"maximum": aten.clamp_min, "minimum": aten.clamp_max}


def _norm(x, ord=2, dtype=None):
    return aten.linalg_vector_norm.default(x, ord, None, False, dtype=dtype)


def _make(base, ov, inplace):
    schema = ov._schema
    is_list = [isinstance(a.type, torch._C.ListType) for a in schema.arguments]
    name = schema.name.split("::")[1].rstrip("_")[len("_foreach_"):]
    tensor_scalars = ov._overloadname == "Tensor" and name in ("addcmul", "addcdiv")
    scalar_base = _SCALAR_BASE.get(name) if ov._overloadname in ("Scalar", "ScalarList") else None

    positional = [a.name for a in schema.arguments if not a.kwarg_only]

    def fn(*args, **kwargs):
        if len(args) < len(positional):  # bind positional parameters passed by name
            args = list(args) + [kwargs.pop(name) for name in positional[len(args):] if name in kwargs]
        n = next(len(a) for a, lst in zip(args, is_list) if lst)
        outs = []
        for i in range(n):
            call = [a[i] if lst else a for a, lst in zip(args, is_list[:len(args)])]
            if name in ("addcmul", "addcdiv"):
                s, t1, t2 = call[:3]
                value = call[3] if len(call) > 3 else kwargs.get("value", 1)
                if tensor_scalars:
                    value = aten.select.int(args[3], 0, i)
                mid = (aten.mul.Tensor if name == "addcmul" else aten.div.Tensor)(t1, t2)
                out = aten.add.Tensor(s, aten.mul.Tensor(mid, value))
            elif name == "norm":
                out = _norm(*call, **kwargs)
            elif name == "max":
                out = aten.amax.default(call[0], [])
            else:
                out = (scalar_base or base)(*call, **kwargs)
            outs.append(out)
        if inplace:
            for s, o in zip(args[0], outs):
                aten.copy_.default(s, o)
            return None
        return outs
    fn.__name__ = f"foreach_{name}_{ov._overloadname}"
    return fn


def _register_all():
    names = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("aten::_foreach_")})
    for attr in names:
        packet = getattr(aten, attr)
        base_name = attr[len("_foreach_"):]
        inplace = base_name.endswith("_")
        base_name = base_name.rstrip("_")
        base = getattr(aten, base_name, None)
        if base is None and base_name not in ("norm", "max"):
            continue
        for ovname in packet.overloads():
            if "out" in ovname:
                continue
            ov = getattr(packet, ovname)
            if ov in DECOMPS:
                continue
            register(ov)(_make(base, ov, inplace))


_register_all()
