"""Random small tensor programs for differential testing against eager PyTorch.

A program is Python source (`def prog(x0, x1, ...)`) built from a chain of steps — pointwise,
broadcasting binary, reduction, view/stride games and matmul — over random shapes, dtypes and
input layouts (contiguous, transposed, sliced, expanded). Being source, a failing program prints
as a ready regression test.
"""
from __future__ import annotations

import dataclasses
import random

import torch

SIZES = (1, 2, 3, 5, 8, 17, 33)

# unary pointwise: template over {x}; all keep values bounded for finite inputs in [-3, 3]
UNARY = {
    "relu": "torch.relu({x})", "sigmoid": "torch.sigmoid({x})", "tanh": "torch.tanh({x})",
    "neg": "-{x}", "abs": "{x}.abs()", "sin": "torch.sin({x})", "cos": "torch.cos({x})",
    "gelu": "torch.nn.functional.gelu({x})", "gelu_tanh": "torch.nn.functional.gelu({x}, approximate='tanh')",
    "silu": "torch.nn.functional.silu({x})", "sqrt": "torch.sqrt({x}.abs() + 0.5)",
    "log": "torch.log({x}.abs() + 1)", "square": "{x} * {x}", "exp": "torch.exp(torch.tanh({x}))",
    "affine": "{x} * 0.5 + 2.0", "clamp": "{x}.clamp(-1.0, 1.5)", "rsub": "1.0 - {x}",
    "recip": "1.0 / ({x}.abs() + 1.0)", "leaky": "torch.nn.functional.leaky_relu({x}, 0.1)",
    "hardtanh": "torch.nn.functional.hardtanh({x})", "floor": "torch.floor({x} * 4.0) / 4.0",
    "where": "torch.where({x} > 0, {x}, {x} * 0.1)", "softplus": "torch.nn.functional.softplus({x})",
}
BINARY = {
    "add": "{x} + {y}", "sub": "{x} - {y}", "mul": "{x} * {y}", "max": "torch.maximum({x}, {y})",
    "min": "torch.minimum({x}, {y})", "div": "{x} / ({y}.abs() + 1.0)",
    "lerp": "torch.lerp({x}, {y}, 0.3)", "select": "torch.where({y} > 0, {x}, {y})",
}
# reductions over one dim d (keepdim chosen at random)
REDUCE = {
    "sum": "{x}.sum({d}, keepdim={k})", "mean": "{x}.mean({d}, keepdim={k})",
    "amax": "{x}.amax({d}, keepdim={k})", "amin": "{x}.amin({d}, keepdim={k})",
    "var": "{x}.var({d}, keepdim={k})", "std": "torch.std({x} + 0.0, {d}, keepdim={k}, correction=0)",
    "logsumexp": "torch.logsumexp({x}, {d}, keepdim={k})",
}
# shape-preserving normalizations over dim d
NORMALIZE = {
    "softmax": "torch.softmax({x}, {d})", "log_softmax": "torch.log_softmax({x}, {d})",
    "layer_norm": "torch.nn.functional.layer_norm({x}, ({x}.shape[-1],))",
}


@dataclasses.dataclass
class Program:
    seed: int
    source: str
    input_specs: list          # (shape, layout) per input
    dtype: torch.dtype
    requires_grad: bool

    def function(self):
        scope = {"torch": torch}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), scope)  # noqa: S102
        return scope["prog"]

    def inputs(self):
        gen = torch.Generator().manual_seed(self.seed)
        return [_make_input(shape, layout, self.dtype, gen, self.requires_grad)
                for shape, layout in self.input_specs]


def _make_input(shape, layout, dtype, gen, requires_grad):
    shape = list(shape)
    if layout == "transposed" and len(shape) >= 2:
        base = (torch.rand(shape[::-1], generator=gen, dtype=torch.float64) * 6 - 3).to(dtype)
        t = base.permute(*reversed(range(len(shape))))
    elif layout == "sliced":
        big = [s * 2 for s in shape]
        base = (torch.rand(big, generator=gen, dtype=torch.float64) * 6 - 3).to(dtype)
        t = base[tuple(slice(None, None, 2) for _ in shape)]
    elif layout == "expanded" and shape[0] > 1:
        base = (torch.rand([1] + shape[1:], generator=gen, dtype=torch.float64) * 6 - 3).to(dtype)
        t = base.expand(shape)
    else:
        t = (torch.rand(shape, generator=gen, dtype=torch.float64) * 6 - 3).to(dtype)
    if requires_grad:
        t = t.detach().clone() if layout == "expanded" else t.detach()
        t.requires_grad_(True)
    return t


def generate(seed: int, steps: int | None = None) -> Program:
    rng = random.Random(seed)
    ndim = rng.choice((1, 2, 2, 3, 3, 4))
    shape = [rng.choice(SIZES) for _ in range(ndim)]
    specs = [(tuple(shape), rng.choice(("contiguous", "contiguous", "transposed", "sliced", "expanded")))]
    lines, cur, n = [], "x0", 0
    outputs = []
    for _ in range(steps or rng.randint(2, 8)):
        n += 1
        var = f"v{n}"
        kind = rng.choices(("unary", "binary", "reduce", "normalize", "view", "matmul"),
                           weights=(5, 4, 2, 2, 2, 1))[0]
        if kind == "unary":
            expr = UNARY[rng.choice(sorted(UNARY))].format(x=cur)
        elif kind == "binary":
            # broadcastable partner: some dims set to 1, maybe fewer leading dims
            other = [1 if rng.random() < 0.3 else s for s in shape]
            if len(other) > 1 and rng.random() < 0.2:
                other = other[1:]
            specs.append((tuple(other), rng.choice(("contiguous", "transposed", "sliced"))))
            y = f"x{len(specs) - 1}"
            template = BINARY[rng.choice(sorted(BINARY))]
            expr = template.format(x=cur, y=y) if rng.random() < 0.7 else template.format(x=y, y=cur)
            shape = list(torch.broadcast_shapes(tuple(shape), tuple(other)))
        elif kind == "reduce" and len(shape) >= 2:
            d, k = rng.randrange(len(shape)), rng.random() < 0.5
            name = rng.choice(sorted(REDUCE))
            if name in ("var",) and shape[d] < 2:
                name = "sum"
            expr = REDUCE[name].format(x=cur, d=d, k=k)
            shape = shape[:d] + ([1] if k else []) + shape[d + 1:]
        elif kind == "normalize":
            d = rng.randrange(len(shape))
            name = rng.choice(sorted(NORMALIZE))
            if name == "layer_norm" and shape[-1] < 4:
                # over 1-3 elements the normalized values are ±1 or nearly: gradients are
                # rounding noise amplified by 1/std, not something to compare elementwise
                name = "softmax"
            expr = NORMALIZE[name].format(x=cur, d=d)
        elif kind == "view" and len(shape) >= 2:
            choice = rng.choice(("transpose", "flatten", "permute", "unsqueeze", "slice", "contig_t"))
            if choice == "transpose":
                expr, shape = f"{cur}.transpose(0, -1)", [shape[-1]] + shape[1:-1] + [shape[0]]
            elif choice == "flatten":
                expr, shape = f"{cur}.reshape({cur}.shape[0], -1)", [shape[0], _prod(shape[1:])]
            elif choice == "permute":
                perm = list(range(len(shape)))
                rng.shuffle(perm)
                expr, shape = f"{cur}.permute({', '.join(map(str, perm))})", [shape[p] for p in perm]
            elif choice == "unsqueeze":
                expr, shape = f"{cur}.unsqueeze(1).squeeze(1)", shape
            elif choice == "slice" and shape[-1] >= 2:
                expr, shape = f"{cur}[..., ::2]", shape[:-1] + [(shape[-1] + 1) // 2]
            else:
                expr, shape = f"{cur}.transpose(0, 1).contiguous().transpose(0, 1)", shape
        elif kind == "matmul":
            k = rng.choice((2, 7, 16))
            specs.append(((shape[-1], k), "contiguous"))
            expr, shape = f"{cur} @ x{len(specs) - 1}", shape[:-1] + [k]
        else:
            expr = UNARY[rng.choice(sorted(UNARY))].format(x=cur)
        lines.append(f"    {var} = {expr}")
        if rng.random() < 0.2:
            outputs.append(var)
        cur = var
    outputs.append(cur)
    params = ", ".join(f"x{i}" for i in range(len(specs)))
    source = f"def prog({params}):\n" + "\n".join(lines) + f"\n    return ({', '.join(outputs)},)\n"
    dtype = rng.choice((torch.float32, torch.float32, torch.float64))
    return Program(seed, source, specs, dtype, requires_grad=rng.random() < 0.4)


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out
