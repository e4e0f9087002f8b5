"""ember.compile on distributed wrappers: DistributedDataParallel and FSDP2 (`fully_shard`).

Consumes a module that `ember.compile` was given plus its CompileSettings; produces the same
module, compiled in place, or None when the module is no distributed wrapper.

DDP: `ember.compile(DDP(model))` compiles the wrapped `ddp.module` in place and returns the DDP
object. DDP's own forward, its reducer hooks, `no_sync()`, `find_unused_parameters` and
`static_graph` stay eager around the compiled module, so the reducer sees the autograd graph the
compiled code builds. The captured graph is cut at DDP's bucket boundaries
(ember/backends/ddp.py) so the all-reduce of early buckets overlaps the backward of later ones;
`options={"ddp_split": False}` compiles one graph. `DDP(ember.compile(model))` needs nothing
here: DDP calls the compiled module.

FSDP2: FSDP's pre/post-forward hooks all-gather and reshard parameters, so they must run eagerly
around each FSDP unit's compute. Each FSDPModule's own forward is compiled (installed as the
instance's `forward`, which `nn.Module._call_impl` calls between the hooks). A unit whose forward
calls nested FSDP units (typically the root) cannot be captured in one graph around their hooks:
it runs eagerly, with one warning, and the nested units stay compiled.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from . import capture
from .config import CompileSettings
from .logging import warn_once


def compile_distributed(module: torch.nn.Module, settings: CompileSettings, compiled_call):
    """Compile a DDP or FSDP2 module in place and return it; None for any other module.

    `compiled_call` is api.CompiledCall (passed in: product modules do not import the api)."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel
    if isinstance(module, DistributedDataParallel):
        return compile_ddp(module, settings, compiled_call)
    fsdp_module = _fsdp_module_class()
    if fsdp_module is not None and any(isinstance(m, fsdp_module) for m in module.modules()):
        return compile_fsdp(module, settings, fsdp_module)
    return None


def compile_ddp(ddp, settings: CompileSettings, compiled_call):
    from .backends.ddp import DDPSplitBackend, bucket_bytes_cap
    inner = ddp.module
    if getattr(inner, "_compiled_call_impl", None) is not None:
        raise ValueError(f"the module inside this DDP ({type(inner).__name__}) is already "
                         "compiled by ember; call ember.reset() or compile a fresh module")
    if settings.options.get("ddp_split", True):
        settings = dataclasses.replace(
            settings, backend=DDPSplitBackend(settings.backend, bucket_bytes_cap(ddp)))
    inner._compiled_call_impl = compiled_call(inner, settings)
    ddp._ember_settings = settings
    return ddp


def split_backend(ddp):
    """The DDPSplitBackend `ember.compile(ddp)` installed (None when the split is off)."""
    from .backends.ddp import DDPSplitBackend
    s = getattr(ddp, "_ember_settings", None)
    return s.backend if s is not None and isinstance(s.backend, DDPSplitBackend) else None


def _fsdp_module_class():
    # Only a program that imported FSDP can hold FSDP modules: never import it ourselves.
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    return getattr(sys.modules["torch.distributed.fsdp"], "FSDPModule", None)


def compile_fsdp(root: torch.nn.Module, settings: CompileSettings, fsdp_module):
    units = [m for m in root.modules() if isinstance(m, fsdp_module)]
    if not isinstance(root, fsdp_module):
        # A plain module holding FSDP units: compile the units, run the rest eagerly.
        warn_once(f"fsdp-outer:{id(root)}", f"{type(root).__name__} is not an FSDP module but "
                  "holds FSDP units; it runs eagerly and each unit's forward is compiled")
    for m in units:
        if getattr(m, "_ember_fsdp_compiled", False):
            raise ValueError(f"{type(m).__name__} is already compiled by ember")
        nested = [n for n, sub in m.named_modules() if sub is not m and isinstance(sub, fsdp_module)]
        m._ember_fsdp_compiled = True
        if nested:
            warn_once(f"fsdp-nested:{id(m)}",
                      f"FSDP unit {type(m).__name__} calls nested FSDP units "
                      f"({', '.join(nested[:3])}{', ...' if len(nested) > 3 else ''}) whose "
                      "hooks gather parameters; its own forward runs eagerly, the nested "
                      "units are compiled")
            continue
        # nn.Module._call_impl runs FSDP's hooks and calls `self.forward` between them.
        m.forward = capture.compile_function(type(m).forward.__get__(m), settings)
    return root


__all__ = ["compile_distributed", "compile_ddp", "compile_fsdp", "split_backend"]
