"""Shared by the code generators: index printing, C types, indented text, Python literals.

Consumes: nothing. Produces: `index_printer`, `CTYPE`, `IndentedBuffer`, `py_repr`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import sympy
import torch

from ..loopir.index import FloorDiv, ModularIndexing

def index_printer(div: str, integer: Callable[[int], str] = str) -> Callable[[Any], str]:
    """A printer of sympy index expressions for one target: C++ divides with "/", Triton with
    "//" (indices are non-negative, so both floor). `integer` formats literals (C++ adds LL)."""
    def pr(e) -> str:
        if isinstance(e, int):
            return integer(e)
        if e.is_Integer:
            return integer(int(e))
        if e.is_Symbol:
            return e.name
        if isinstance(e, FloorDiv):
            return f"({pr(e.args[0])} {div} {pr(e.args[1])})"
        if isinstance(e, ModularIndexing):
            a, b, m = e.args
            inner = pr(a) if b == 1 else f"({pr(a)} {div} {pr(b)})"
            return f"({inner} % {pr(m)})"
        if e.is_Add:
            return "(" + " + ".join(pr(t) for t in e.args) + ")"
        if e.is_Mul:
            return "(" + " * ".join(pr(t) for t in e.args) + ")"
        if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
            return "(" + " * ".join([pr(e.args[0])] * int(e.args[1])) + ")"
        if isinstance(e, sympy.floor):     # a size from shape arithmetic: floor(a / b)
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return f"({pr(num)} {div} {pr(den)})"
        if isinstance(e, sympy.Mod) and e.args[0].is_nonnegative and e.args[1].is_positive:
            return f"({pr(e.args[0])} % {pr(e.args[1])})"     # a size's Python %: same sign
        if isinstance(e, (sympy.Max, sympy.Min)):
            f = "std::max<int64_t>" if div == "/" else ("max" if isinstance(e, sympy.Max) else "min")
            if div == "/" and isinstance(e, sympy.Min):
                f = "std::min<int64_t>"
            out = pr(e.args[0])
            for a in e.args[1:]:
                out = f"{f}({out}, {pr(a)})"
            return out
        raise NotImplementedError(f"index expression {e}")
    return pr



# --- dtypes --------------------------------------------------------------------------------

CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.float16: "ember_half",
    torch.bfloat16: "ember_bf16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}


# --- text ----------------------------------------------------------------------------------

class IndentedBuffer:
    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def writeline(self, line: str) -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    @contextlib.contextmanager
    def indent(self, n: int = 1):
        self.level += n
        try:
            yield
        finally:
            self.level -= n

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"


def py_repr(value: Any) -> str:
    """repr() that round-trips torch dtypes/devices/layouts/memory formats in generated Python."""
    if isinstance(value, torch.dtype):
        return f"torch.{str(value).split('.')[-1]}"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.layout, torch.memory_format)):
        return f"torch.{str(value).split('.')[-1]}"
    if isinstance(value, float):
        if value != value:
            return "float('nan')"
        if value in (float("inf"), float("-inf")):
            return f"float({str(value)!r})"
    if isinstance(value, sympy.Basic):
        from ..shapes import pyexpr
        return pyexpr(value, str)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py_repr(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    return repr(value)
