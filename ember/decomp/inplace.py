"""Stage 3, decomp: in-place variants. For every decomposed or primitive op `X.overload` whose
in-place twin `X_.overload` exists, `X_(self, ...) = self.copy_(X(self, ...))`. The aot
functionalizer turns that copy_ into an out-of-place graph plus an input mutation (or removes it
when self is a graph intermediate). Imported last, after every family module has registered."""
from __future__ import annotations

import torch

from ._util import inplace_of
from .prims import PRIMS
from .registry import DECOMPS, register

aten = torch.ops.aten


# copy_ is how every decomposition writes; it is the functionalizer's, never decomposed.
_MUTATION_PRIMITIVES = {aten.copy_.default}


def _same_signature(functional, inplace) -> bool:
    fa, ia = functional._schema.arguments, inplace._schema.arguments
    return len(fa) == len(ia) and all(str(a.type) == str(b.type) and a.name == b.name
                                      for a, b in zip(fa, ia))


def _register_all():
    for op in list(DECOMPS) + sorted(PRIMS, key=str):
        packet_name = op._schema.name.split("::")[1]
        inplace_packet = getattr(aten, packet_name + "_", None)
        if inplace_packet is None or op._overloadname not in inplace_packet.overloads():
            continue
        ov = getattr(inplace_packet, op._overloadname)
        if torch.Tag.inplace_view in ov.tags or op.is_view:
            continue  # squeeze_/t_/... change metadata, not data: not a copy_ of a result
        if not _same_signature(op, ov):
            continue  # e.g. pow.Scalar(Scalar self, Tensor exponent) vs pow_.Scalar(Tensor self, ...)
        if ov in DECOMPS or ov in PRIMS or ov in _MUTATION_PRIMITIVES:
            continue
        register(ov)(inplace_of(op))


_register_all()
