"""Capture, tensors computed from Python numbers only, whose values the trace knows.

`torch.div(h.size(1), 128, rounding_mode="trunc")` with static sizes makes a 0-d tensor from
plain ints (HF longformer's `_chunk`, and torch.div / torch.floor_divide on sizes elsewhere).
Eagerly, a later `x.view(b, n, 128)` reads its value (`__index__`). In the graph it stays a
tensor op (its tensor semantics are kept where it is used as a tensor), and the tracer also
keeps its real value, computed at trace time from the same numbers:

  * `remember(tr, node, real)` after such an op, and after any op whose tensor arguments are
    all known (`n * 2`, `n.add_(1)`: the op runs on the real values too, so in-place updates
    and views stay in step; an op that draws random numbers is not remembered);
  * `as_numbers(tr, args, kwargs)`: where an op fails on meta because it reads a known
    tensor's value (a size, a Scalar), the call is made again with the Python number in
    that tensor's place, as eager reads it (`view(b, 4, 128)`);
  * `value_of(tr, v)`: `.item()`, `int(n)`, `float(n)`, `bool(n)` fold to the number.

With dynamic shapes, `torch.div(s, d, rounding_mode=...)` / `torch.floor_divide(s, d)` of a
size symbol by a positive int is known as the SymInt `s // d` (`known_sizes`), so the view
stays symbolic; any other value computed from symbolic sizes is not known (its meta example
value has no data), so an int use of it fails on meta and breaks the graph there.
A write to a known tensor by an op whose other tensor arguments are not known forgets every
known value, and any write forgets the sizes (the tracer does not follow those through data).
"""
from __future__ import annotations

import operator

import torch

from .values import SYM_TYPES, DictV, ListV, ObjV, TensorV, TupleV, is_literal, peek

MAX_NUMEL = 64        # scalars and tiny tensors only: the values are computed at trace time


def _flat(vals):
    for v in vals:
        if isinstance(v, (ListV, TupleV)):
            yield from _flat(v.items)
        elif isinstance(v, DictV):
            yield from _flat(v.items.values())
        else:
            yield v


def _symbolic(v) -> bool:
    x = peek(v) if isinstance(v, ObjV) else None
    if isinstance(x, SYM_TYPES):
        return True
    return isinstance(x, (tuple, list)) and any(isinstance(i, SYM_TYPES) for i in x)


def factory_result(tr, target, args, kwargs, out):
    """`out`, made by a call without tensor arguments under the meta device: torch makes a
    real CPU tensor from numbers (`torch.div(8, 4)`). Returns the meta example value and the
    real value to remember: None unless only plain numbers went in (a symbolic size gives a
    meaningless value)."""
    if not isinstance(out, torch.Tensor):
        return out, None
    vals = list(_flat(list(args) + list(kwargs.values())))
    numbers_only = all(isinstance(v, ObjV) and is_literal(peek(v)) for v in vals)
    if out.device.type == "meta":
        # torch.tensor(n) follows the meta device the factory ran under: make the real value
        # from the same numbers (DeBERTa's att_span = torch.tensor(min(q_len, k_len, max)),
        # later a slice bound)
        if numbers_only and target in _FROM_NUMBERS and out.numel() <= MAX_NUMEL:
            return out, target(*[_real(tr, a) for a in args],
                               **{k: _real(tr, x) for k, x in kwargs.items()})
        return out, None
    # (torch.from_numpy(a) is not: its result is the caller's memory)
    if numbers_only and out.numel() <= MAX_NUMEL:
        return out.to("meta"), out
    if any(map(_symbolic, vals)):
        return out, LIFT
    return out.to("meta"), None


_FROM_NUMBERS = (torch.tensor, torch.as_tensor, torch.scalar_tensor)
LIFT = object()     # factory_result: symbolic numbers went in; make the call with lift_symbols


def lift_symbols(tr, target, args, kwargs):
    """`target(*args)` where torch wraps symbolic numbers into tensors itself (`torch.div(s, 4)`):
    a later stage tracing the graph would see each symbol as its example value, a constant (a
    silently wrong value for other sizes). Each symbol is made a 0-d tensor in the graph first,
    `torch.ones((), dtype=int64) * s`, of the dtype torch gives the wrapped number, so the
    result's dtype is eager's."""
    q = _symbolic_quotient(target, args, kwargs)

    def lift(v):
        x = peek(v) if isinstance(v, ObjV) else None
        if not isinstance(x, (torch.SymInt, torch.SymFloat)):
            return v
        dtype = torch.int64 if isinstance(x, torch.SymInt) else torch.get_default_dtype()
        one = tr.call_graph(torch.ones, [TupleV([])], {"dtype": ObjV(dtype)})
        return tr.call_graph(operator.mul, [one, v], {})

    new_args, new_kw = [lift(a) for a in args], {k: lift(x) for k, x in kwargs.items()}
    if not any(isinstance(v, TensorV) for v in _flat(new_args + list(new_kw.values()))):
        raise tr.unsupported(f"{getattr(target, '__name__', target)} makes a tensor from "
                             "symbolic sizes")
    v = tr.call_graph(target, new_args, new_kw)
    if q is not None and isinstance(v, TensorV):
        tr.known_sizes[v.node] = q
    return v


def _symbolic_quotient(target, args, kwargs):
    """`torch.div(n, d, rounding_mode="floor"|"trunc")` / `torch.floor_divide(n, d)` of a
    symbolic size n by a positive int d: the SymInt n // d (trunc only where n >= 0, which
    becomes a guard), else None."""
    mode = peek(kwargs["rounding_mode"]) if isinstance(kwargs.get("rounding_mode"), ObjV) \
        else None
    if len(args) != 2 or set(kwargs) - {"rounding_mode"} or not all(
            isinstance(a, ObjV) for a in args) or not (
            target is torch.floor_divide and not kwargs or target is torch.div and
            mode in ("floor", "trunc")):
        return None
    n, d = peek(args[0]), peek(args[1])
    if not isinstance(n, torch.SymInt) or type(d) is not int or d <= 0:
        return None
    if mode == "trunc" and not n >= 0:
        return None
    return n // d


def remember(tr, node, real) -> None:
    if isinstance(real, torch.Tensor) and real.device.type == "cpu" and real.numel() <= MAX_NUMEL:
        tr.known[node] = real


def after_op(tr, target, args, kwargs, result, writes: bool) -> None:
    """Run `target` on the real values when every tensor argument is known (see the module
    docstring); forget known values that an op with other tensor arguments may write."""
    vals = list(_flat(list(args) + list(kwargs.values())))
    tensors = [v for v in vals if isinstance(v, TensorV)]
    known = [v for v in tensors if v.node in tr.known]
    name = getattr(target, "__name__", "")
    writes = writes or "out" in kwargs or name.startswith("__i") or \
        name.endswith("_") and not name.startswith("_")
    if writes:
        tr.known_sizes.clear()      # values made from sizes are not followed through writes
    if not known:
        return
    if len(known) < len(tensors) or any(map(_symbolic, vals)):
        if writes:
            tr.known.clear()
        return
    real_args = [_real(tr, a) for a in args]
    real_kw = {k: _real(tr, x) for k, x in kwargs.items()}
    with torch.random.fork_rng(devices=[]):
        state = torch.get_rng_state()
        try:
            out = target(*real_args, **real_kw)
        except Exception:  # noqa: BLE001  (the meta run passed; the real one is a bonus)
            tr.known.clear()
            return
        drew = not torch.equal(state, torch.get_rng_state())
    if drew:
        tr.known.clear()
    elif isinstance(result, TensorV) and result.node not in tr.known:
        remember(tr, result.node, out)


def _real(tr, v):
    if isinstance(v, TensorV):
        return tr.known[v.node]
    if isinstance(v, (ListV, TupleV)):
        items = [_real(tr, i) for i in v.items]
        return items if isinstance(v, ListV) else tuple(items)
    if isinstance(v, DictV):
        return {k: _real(tr, x) for k, x in v.items.items()}
    return tr.to_meta(v)


def as_numbers(tr, args, kwargs):
    """(args, kwargs) with each known tensor replaced by its Python number, or None when no
    argument is a known one-element tensor."""
    hit = False

    def sub(v):
        nonlocal hit
        if isinstance(v, TensorV) and v.node in tr.known and tr.known[v.node].numel() == 1:
            hit = True
            return ObjV(tr.known[v.node].item())
        if isinstance(v, TensorV) and v.node in tr.known_sizes:
            hit = True
            return ObjV(tr.known_sizes[v.node])
        if isinstance(v, (ListV, TupleV)):
            items = [sub(i) for i in v.items]
            return ListV(items, cls=v.cls) if isinstance(v, ListV) else TupleV(items, cls=v.cls)
        return v

    out = [sub(a) for a in args], {k: sub(x) for k, x in kwargs.items()}
    return out if hit else None


def value_of(tr, v, how: str):
    """`v.item()` / `v.tolist()` / int / float / bool of a known tensor, else None."""
    real = tr.known.get(v.node) if isinstance(v, TensorV) else None
    if real is None or how not in _READS:
        return None
    if how != "tolist" and real.numel() != 1 or how == "__index__" and real.is_floating_point():
        return None
    return _READS[how](real)


_READS = {"item": torch.Tensor.item, "tolist": torch.Tensor.tolist, "__int__": int,
          "__index__": torch.Tensor.__index__, "__float__": float, "__bool__": bool}
