"""Shared by capture and aot: activation-checkpoint regions in a captured graph.

Capture brackets the ops of a `torch.utils.checkpoint.checkpoint(fn, ...)` call (fn inlined like
any call) with `checkpoint_enter()` / `checkpoint_exit()` nodes. Run eagerly they do nothing that
matters; when aot's tracer runs the captured graph they mark the span, and every aten node it
records inside gets node.meta["recompute"] = the region's id. The min-cut partitioner never saves
such a node unless it leaves its region (read by the forward outside it, or a graph output) or is a
random op: the backward recomputes the rest from the region's inputs, as eager's checkpoint does.
With a selective-checkpoint policy (`checkpoint_enter(policy_key(p))`) the tracer asks
`must_save` per op and tags the outputs it says to save node.meta["sac_save"]; the partitioner
saves those instead of recomputing them. A trace starts with `reset()`, so a region left open by an
error cannot leak.
"""
from __future__ import annotations

_OPEN: list[tuple] = []     # (id, selective-checkpoint policy or None) of open regions
_COUNT = [0]
# selective checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts): the
# policy (a function or a list of ops) under a small int key, so a marker node's argument prints
_POLICIES: dict[int, object] = {}
_POLICY_KEYS: dict[int, int] = {}


def checkpoint_enter(policy: int | None = None) -> None:
    _COUNT[0] += 1
    _OPEN.append((_COUNT[0], _POLICIES.get(policy)))


def checkpoint_exit() -> None:
    if _OPEN:
        _OPEN.pop()


def current() -> int | None:
    """The innermost open region's id (node.meta["recompute"]), None outside any."""
    return _OPEN[-1][0] if _OPEN else None


def policy_key(policy) -> int:
    """The key `checkpoint_enter` takes for `policy` (held for the process: policies are few)."""
    key = _POLICY_KEYS.get(id(policy))
    if key is None or _POLICIES[key] is not policy:
        key = _POLICY_KEYS[id(policy)] = len(_POLICIES) + 1
        _POLICIES[key] = policy
    return key


def has_policy() -> bool:
    return bool(_OPEN) and _OPEN[-1][1] is not None


def must_save(func, args, kwargs) -> bool:
    """In a region with a selective-checkpoint policy: does it save `func`'s output (MUST_SAVE or
    PREFER_SAVE, or `func` in the policy's op list) instead of recomputing it? Asked once per op
    the forward runs, with is_recompute False, as eager's checkpoint asks in its forward."""
    policy = _OPEN[-1][1] if _OPEN else None
    if policy is None:
        return False
    if isinstance(policy, (list, tuple)):
        return func in policy
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext
    out = policy(SelectiveCheckpointContext(is_recompute=False), func, *args, **kwargs)
    if isinstance(out, bool):           # torch accepts a bool: True = save
        return out
    return out in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def reset() -> None:
    _OPEN.clear()
    _COUNT[0] = 0
