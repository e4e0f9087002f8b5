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
the same way (the shift moves all of them). Not covered: max-pool ties and kinks inside
functional calls (torch.relu in a forward), which no module hook sees.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

#: activation modules whose derivative jumps; timm's own copies are matched by class name
KINKED = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.LeakyReLU,
          nn.Threshold, nn.Hardshrink, nn.Softshrink)
KINKED_NAMES = frozenset({"HardSwish", "HardSigmoid", "HardMish", "ReLU6", "ReLU", "HardTanh",
                          "LeakyReLU"})


def kinked_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules()
            if isinstance(m, KINKED) or type(m).__name__ in KINKED_NAMES]


def _record(model: nn.Module, sink: Callable[[int, torch.Tensor], None]) -> list:
    """Forward pre-hooks that pass each kinked call's input (numbered in call order) to sink."""
    calls = iter(range(1 << 62))

    def hook(_module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            sink(next(calls), args[0].detach())
    return [m.register_forward_pre_hook(hook) for m in kinked_modules(model)]


def _shift(model: nn.Module, deltas: dict[int, float], sign: float) -> list:
    calls = iter(range(1 << 62))

    def hook(_module, args):
        if not args or not isinstance(args[0], torch.Tensor) or not args[0].is_floating_point():
            return None
        d = deltas.get(next(calls), 0.0)
        return (args[0] + sign * d, *args[1:]) if d else None
    return [m.register_forward_pre_hook(hook) for m in kinked_modules(model)]


def allowance(fresh: Callable[[], nn.Module], step64: Callable[[nn.Module], list],
              step32: Callable[[nn.Module], list], ref: list,
              compare: Callable[[list, list], tuple]) -> tuple[list[float], dict] | None:
    """Per observed tensor, the fp64 reference's relative movement when every kinked input moves
    by 10x eager-fp32's error there (both ways, summed); None when the model has no kink.

    fresh() builds a new fp32 copy of the model; step64/step32 run one step of a copy (fp64 or
    fp32 inputs) and return its observed tensors; compare is harness.compare.
    """
    probe = fresh()
    if not kinked_modules(probe):
        return None
    inputs64: dict[int, torch.Tensor] = {}
    m64 = probe.double()
    hooks = _record(m64, lambda i, x: inputs64.__setitem__(i, x.clone()))
    step64(m64)
    for h in hooks:
        h.remove()
    deltas: dict[int, float] = {}

    def measure(i, x):
        r = inputs64.get(i)
        if r is not None and r.shape == x.shape:
            deltas[i] = 10 * float((x.double() - r).abs().max())
    m32 = fresh()
    hooks = _record(m32, measure)
    step32(m32)
    del inputs64, m32, hooks
    total = [0.0] * len(ref)
    for sign in (1.0, -1.0):
        m = fresh().double()
        _shift(m, deltas, sign)
        _, _, per = compare(step64(m), ref)
        total = [t + p for t, p in zip(total, per)]
    info = {"kinked_calls": len(deltas), "max_delta": max(deltas.values(), default=0.0)}
    return total, info
