"""ember bench correctness: the gradient allowance for activations with kinks (ReLU, hardswish, ...).

Training correctness compares every parameter gradient with an fp64 eager step, per tensor,
within 10x eager-fp32's own error on that tensor (harness.worst_excess). That bound assumes the
gradients are continuous functions of the rounding. They are not at a kink: an element whose
ReLU input is 3e-6 in fp64 may come out -1e-6 in a valid fp32 run (another summation order in
a conv or a reduction), its mask bit flips, and every gradient upstream of it moves by a whole
element's contribution. Which elements flip is a matter of luck, so eager-fp32's error says
nothing about it: on resnet18 (batch 4, 224x224) eager happened to flip none and matched layer4's
last BatchNorm weight gradient to 1e-6, ember flipped one (|pre-ReLU| 3.3e-6 in fp64) and was
1.6e-3 off.

The allowance measures that sensitivity on the reference itself, deterministically:
  1. run the model in fp32 and fp64 eagerly and record, per call of each kinked activation
     module, delta = 10 x max |x_fp32 - x_fp64| over its input (the same 10x eager's error the
     tolerance gives a compiler);
  2. rerun the fp64 step twice with every such input shifted by +delta and by -delta: between
     them, every element within delta of a kink at 0 crosses it;
  3. a tensor's allowance is the sum of both runs' relative deviations from the reference.
A compiled gradient that is off by more than 10x eager's error plus this allowance is wrong
whichever elements it flipped. Kinks away from 0 (hardtanh at 6, hardswish at +-3) are covered
the same way (the shift moves all of them). Functional calls (F.relu(x), torch.relu, x.relu_()
in a forward: MobileViTV2's attention applies F.relu to its values) are seen by a
TorchFunctionMode, outside the kinked modules (whose own F call the module hook covers). Not
covered: max-pool ties, and kinks written as clamp/where/max.
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

#: activation modules whose derivative jumps; timm's own copies are matched by class name
KINKED = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.LeakyReLU,
          nn.Threshold, nn.Hardshrink, nn.Softshrink)
KINKED_NAMES = frozenset({"HardSwish", "HardSigmoid", "HardMish", "ReLU6", "ReLU", "HardTanh",
                          "LeakyReLU"})


def kinked_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules()
            if isinstance(m, KINKED) or type(m).__name__ in KINKED_NAMES]


#: the functional forms of those activations
KINKED_FUNCTIONS = frozenset({
    F.relu, F.relu_, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_, F.relu6,
    F.hardtanh, F.hardtanh_, F.hardswish, F.hardsigmoid, F.leaky_relu, F.leaky_relu_,
    F.threshold, F.threshold_, F.hardshrink, F.softshrink})


def _float_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _inplace(func, args, kwargs) -> bool:
    if getattr(func, "__name__", "").endswith("_"):
        return True
    try:
        return bool(inspect.signature(func).bind(*args, **kwargs).arguments.get("inplace"))
    except (TypeError, ValueError):     # a builtin without a signature: torch.relu
        return False


class _KinkedCalls(TorchFunctionMode):
    """Inside `with`: every kinked call of `model`, module or functional, numbered in call
    order, passes its input to visit(i, x), which may return a replacement input."""

    def __init__(self, model: nn.Module, visit: Callable[[int, torch.Tensor], object]):
        super().__init__()
        self.visit, self.calls, self.depth = visit, 0, 0
        self.hooks = [h for m in kinked_modules(model)
                      for h in (m.register_forward_pre_hook(self._enter),
                                m.register_forward_hook(self._leave))]

    def _next(self, x):
        self.calls += 1
        return self.visit(self.calls - 1, x)

    def _enter(self, _module, args):
        self.depth += 1
        new = self._next(args[0]) if args and _float_tensor(args[0]) else None
        return None if new is None else (new, *args[1:])

    def _leave(self, _module, _args, _out):
        self.depth -= 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.depth == 0 and func in KINKED_FUNCTIONS and args and _float_tensor(args[0]):
            new = self._next(args[0])
            if new is not None and _inplace(func, args, kwargs):
                args[0].copy_(new)
            elif new is not None:
                args = (new, *args[1:])
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        return super().__exit__(*exc)


def _record(model: nn.Module, sink: Callable[[int, torch.Tensor], None]) -> _KinkedCalls:
    """Each kinked call's input (numbered in call order) to sink."""
    return _KinkedCalls(model, lambda i, x: sink(i, x.detach()))


def _shift(model: nn.Module, deltas: dict[int, float], sign: float) -> _KinkedCalls:
    def visit(i, x):
        d = deltas.get(i, 0.0)
        return x + sign * d if d else None
    return _KinkedCalls(model, visit)


def allowance(fresh: Callable[[], nn.Module], step64: Callable[[nn.Module], list],
              step32: Callable[[nn.Module], list], ref: list,
              compare: Callable[[list, list], tuple]) -> tuple[list[float], dict] | None:
    """Per observed tensor, the fp64 reference's relative movement when every kinked input moves
    by 10x eager-fp32's error there (both ways, summed); None when the model has no kink.

    fresh() builds a new fp32 copy of the model; step64/step32 run one step of a copy (fp64 or
    fp32 inputs) and return its observed tensors; compare is harness.compare.
    """
    inputs64: dict[int, torch.Tensor] = {}
    m64 = fresh().double()
    with _record(m64, lambda i, x: inputs64.__setitem__(i, x.clone())):
        step64(m64)
    if not inputs64:
        return None
    deltas: dict[int, float] = {}

    def measure(i, x):
        r = inputs64.get(i)
        if r is not None and r.shape == x.shape:
            deltas[i] = 10 * float((x.double() - r).abs().max())
    m32 = fresh()
    with _record(m32, measure):
        step32(m32)
    del inputs64, m32
    total = [0.0] * len(ref)
    for sign in (1.0, -1.0):
        m = fresh().double()
        with _shift(m, deltas, sign):
            got = step64(m)
        _, _, per = compare(got, ref)
        total = [t + p for t, p in zip(total, per)]
    info = {"kinked_calls": len(deltas), "max_delta": max(deltas.values(), default=0.0)}
    return total, info
