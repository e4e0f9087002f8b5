"""Backend "ember" (the default): capture → aot → decomps → loop IR, fusion, generated kernels."""
from __future__ import annotations

import torch

from .. import counters
from ..errors import Unsupported
from ..aot import aot_compile
from ..fallback import fall_back, stage
from ..decomp import get_decompositions
from ..lower import compile_aten_graph
from . import layout
from .freeze import copy_module, freeze
from .speed import speed_checked    # never slower than eager


def ember_backend(gm, example_inputs, **kwargs):
    options = kwargs.get("options") or {}
    _refuse_implicit_autocast(gm)
    # inference graphs: frozen weights (freeze.py) and channels-last convs (layout.py)
    frozen = freeze(gm, example_inputs, options, lambda g, ex: _compile(g, ex, options))
    if frozen is not None:
        return speed_checked(gm, frozen, example_inputs, {**options, "plan": "frozen"})
    work = copy_module(gm)
    if not layout.plan(work, example_inputs, options):
        work = gm
    plan = {**options, "plan": "channels_last"} if work is not gm else options
    return speed_checked(gm, _compile(work, example_inputs, options), example_inputs, plan)


def _compile(gm, example_inputs, options):
    """aot → decompositions → kernels for the torch-level graph `gm`."""

    def compiler(g, ex):            # forward now, backward lazily at the first backward
        with counters.timed("codegen"):
            return compile_aten_graph(g, ex, options=options)

    def bw_compiler(g, ex):
        # runs inside the first backward, past the backend's own fallback: a failure here makes
        # the backward graph run eagerly (its aten ops), the forward stays compiled
        try:
            return compiler(g, ex)
        except Exception as exc:  # noqa: BLE001 - the fallback policy
            fall_back("ember", exc, "this graph's backward")
            return g
    with counters.timed("aot"), stage("aot"):
        compiled = aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=bw_compiler,
                               decompositions=get_decompositions())
    return compiled


def _refuse_implicit_autocast(gm) -> None:
    """aot traces on meta tensors, which have no autocast dispatch key: an autocast region is
    compiled right only when its casts are explicit in the graph (ember's capture writes them,
    marking the graph with meta["ember_device"]). Another capture's graph (Dynamo's) relies on
    the dispatcher: refuse it loudly rather than compute the region in the wrong dtype."""
    if "ember_device" in gm.meta:
        return
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.amp.autocast_mode._enter_autocast \
                and (len(n.args) < 3 or n.args[2] is not False):
            raise Unsupported("an autocast region in a graph from another capture (its casts "
                              "are implicit; ember traces on meta tensors, which autocast "
                              "does not see)", hint="use ember.compile, or autocast outside")
