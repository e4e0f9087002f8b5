"""C++ column sums inside a row kernel (schedule/columns.py, docs/design/038-column-partials.md).

A stage's `columns` add their value at every point of the stage's loop into a per-thread
partial array of their output (dense, row-major over the output dims): the kernel's outer loop
runs as `omp for` inside one parallel region that holds the partials, and after it each output
element is the sum of the threads' partials in thread order (deterministic for a thread
count). A float32 sum over at least LONG_SUM terms is cascaded as the column kernel's is
(cpp_reduce.py): the float partial is added into a double one every ~CASCADE_ROWS terms.

Used by cpp.py's row-kernel path. Consumes: a Kernel whose stages have columns.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import hint, numel, simplify_index
from .cpp_handler import CppVal, _int, ctype
from .cpp_loops import loop_var
from .cpp_reduce import CASCADE_ROWS, _cascaded, _for


def _flat(vars_, sizes):
    flat, stride = sympy.Integer(0), sympy.Integer(1)
    for v, s in zip(reversed(vars_), reversed(sizes)):
        flat, stride = flat + v * stride, stride * s
    return flat


class ColumnPartials:
    def __init__(self, kernel, h, parallel: bool, par_if: str):
        self.h, self.parallel, self.par_if = h, parallel, par_if
        self.cols = [n for st in kernel.stages for n in st.columns]
        self.axes = {n.name: st.axes[n.name] for st in kernel.stages for n in st.columns}
        self.part = {n.name: h.fresh("part") for n in self.cols}
        self.wide = {n.name for n in self.cols if _cascaded(n, numel(n.rranges))}
        # outer iterations between two adds of the float partials into the double ones: each
        # output element gets ~CASCADE_ROWS terms in between
        self.every = min([max(1, CASCADE_ROWS * hint(numel(kernel.outer)) // hint(numel(n.rranges)))
                          for n in self.cols if n.name in self.wide] or [0])
        self.nt = h.fresh("nt")
        self.cnt = h.fresh("cnt")

    def _partials(self):
        """(column node, its partials' name, elements per thread, C type), per column."""
        return [(n, self.part[n.name], _int(numel(n.ranges)), ctype(n.body.src_dtype))
                for n in self.cols]

    def open(self):
        """The partials and the parallel region the outer loops run in (as `omp for`)."""
        code = self.h.code
        code.writeline(f"const int64_t {self.nt} = {'omp_get_max_threads()' if self.parallel else '1'};")
        for n, p, size, t in self._partials():
            code.writeline(f"ember::Zeroed<{t}> {p}_all({self.nt} * {size});")
            if n.name in self.wide:
                code.writeline(f"ember::Zeroed<double> {p}_wall({self.nt} * {size});")
        if self.parallel:
            code.writeline("#pragma omp parallel" + self.par_if)
        code.writeline("{")
        code.level += 1
        for n, p, size, t in self._partials():
            code.writeline(f"{t}* {p} = {p}_all.p + omp_get_thread_num() * {size};")
            if n.name in self.wide:
                code.writeline(f"double* {p}_w = {p}_wall.p + omp_get_thread_num() * {size};")
        if self.wide:
            code.writeline(f"int64_t {self.cnt} = 0;")

    def flush(self, every: bool):
        """Add the float partials into the double ones (every `self.every` outer iterations,
        at the end of the outer loop's body; or once after it)."""
        if not self.wide:
            return
        code = self.h.code
        if every:
            code.writeline(f"if (++{self.cnt} == {self.every})")
        code.writeline("{")
        code.level += 1
        if every:
            code.writeline(f"{self.cnt} = 0;")
        for n in self.cols:
            if n.name in self.wide:
                p = self.part[n.name]
                code.writeline("#pragma omp simd")
                code.writeline(f"for (int64_t j = 0; j < {_int(numel(n.ranges))}; ++j) "
                               f"{{ {p}_w[j] += {p}[j]; {p}[j] = 0.0f; }}")
        code.level -= 1
        code.writeline("}")

    def close(self):
        """End the parallel region; each output element is its threads' partials' sum."""
        h = self.h
        code = h.code
        self.flush(every=False)
        code.level -= 1
        code.writeline("}")
        for n in self.cols:
            saved = h.push()
            ov = [loop_var(i) for i in range(len(n.ranges))]
            ranges, h.ranges = h.ranges, dict(zip(ov, n.ranges))
            wide = n.name in self.wide
            src = f"{self.part[n.name]}_{'wall' if wide else 'all'}.p"
            at = ctype(torch.float64 if wide else n.body.src_dtype)
            for v, size in zip(ov, n.ranges):
                code.writeline(_for(v, size))
                code.writeline("{")
                code.level += 1
            flat = h.idx(_flat(ov, n.ranges))
            size = _int(numel(n.ranges))
            code.writeline(f"{at} s = 0;")
            code.writeline(f"for (int64_t t = 0; t < {self.nt}; ++t) s += {src}[t * {size} + {flat}];")
            dt = n.body.src_dtype
            h.store(n.name, n.store_index(ov), CppVal(f"static_cast<{ctype(dt)}>(s)", dt))
            for _ in ov:
                code.level -= 1
                code.writeline("}")
            h.ranges = ranges
            h.pop(saved)

    def adds(self, stage, xv, rv):
        """In a stage's loop body at point (xv, rv): each of its columns' value into its
        partial."""
        h = self.h
        for n, ov, red in self._points(stage, xv, rv):
            v = h._as(n.reduction_value(ov, red), n.body.src_dtype)
            h.code.writeline(f"{self.part[n.name]}[{h.idx(_flat(ov, n.ranges))}] += {v};")

    def bodies(self, stage, xv, rv):
        """Run a stage's column bodies under the current handler (an analysis)."""
        for n, ov, red in self._points(stage, xv, rv):
            n.reduction_value(ov, red)

    def exprs(self, stage, xv, rv, collect, ranges) -> list:
        """The index expressions of a stage's column adds (for plan_loops' dim merging)."""
        pts = self._points(stage, xv, rv)
        c = collect(lambda: [n.reduction_value(ov, red) for n, ov, red in pts], ranges)
        return c.exprs + [simplify_index(sympy.expand(_flat(ov, n.ranges)), ranges)
                          for n, ov, _ in pts]

    def _points(self, stage, xv, rv):
        """(node, output index, reduction index) of each column at loop point (xv, rv): its
        axes are written in the canonical loop vars v0, v1, ... (outer, then inner)."""
        vars_ = list(xv) + list(rv)
        at = {loop_var(i): v for i, v in enumerate(vars_)}
        out = []
        for n in stage.columns:
            axes, r = [a.xreplace(at) for a in self.axes[n.name]], len(n.ranges)
            out.append((n, axes[:r], axes[r:]))
        return out
