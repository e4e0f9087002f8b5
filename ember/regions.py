"""Shared by capture and aot: activation-checkpoint regions in a captured graph.

Capture brackets the ops of a `torch.utils.checkpoint.checkpoint(fn, ...)` call (fn inlined like
any call) with `checkpoint_enter()` / `checkpoint_exit()` nodes. Run eagerly they do nothing that
matters; when aot's tracer runs the captured graph they mark the span, and every aten node it
records inside gets node.meta["recompute"] = the region's id. The min-cut partitioner never saves
such a node unless it leaves its region (read by the forward outside it, or a graph output) or is a
random op: the backward recomputes the rest from the region's inputs, as eager's checkpoint does. A trace starts with `reset()`, so a region left open by an error cannot leak.
"""
from __future__ import annotations

_OPEN: list[int] = []       # ids of the open regions, innermost last
_COUNT = [0]


def checkpoint_enter() -> None:
    _COUNT[0] += 1
    _OPEN.append(_COUNT[0])


def checkpoint_exit() -> None:
    if _OPEN:
        _OPEN.pop()


def current() -> int | None:
    """The innermost open region's id (node.meta["recompute"]), None outside any."""
    return _OPEN[-1] if _OPEN else None


def reset() -> None:
    _OPEN.clear()
    _COUNT[0] = 0
