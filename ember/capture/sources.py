"""Capture, sources: where a traced value came from (local, global, attribute, item, closure).

A source turns into a Python expression over the frame's locals (`expr()`), which the generated
guard/run function evaluates at call time to check guards and to fetch graph inputs. `structural`
marks sources reached through an nn.Module attribute whose value a module-state snapshot covers
(statecheck.py): those are re-read only when the snapshot says the module tree changed, not on
every call. What a snapshot cannot see stays non-structural: items of a list or dict held in a
module attribute, closure cells, function defaults.
"""
from __future__ import annotations

import keyword

#: an nn.Module's own dicts, whose version tags a module-state snapshot records (statecheck.py)
MODULE_TABLES = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks",
                 "_backward_hooks", "_backward_pre_hooks")


class Source:
    __slots__ = ("structural",)

    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        return self.expr()

    def __repr__(self):
        return self.expr()

    def __eq__(self, other):
        return isinstance(other, Source) and self.expr() == other.expr()

    def __hash__(self):
        return hash(self.expr())

    @property
    def unguarded(self) -> bool:
        """Rooted in library module state (see GlobalSource): usable for effects, never guarded."""
        base = getattr(self, "base", None)
        return base.unguarded if base is not None else False


class LocalSource(Source):
    __slots__ = ("local", "index")

    def __init__(self, local: str, index: int):
        self.local, self.index, self.structural = local, index, False

    def expr(self):
        return f"L{self.index}"

    def name(self):
        return f"L[{self.local!r}]"


class GlobalSource(Source):
    """A name in a function's globals dict; `gid` names that dict in the generated code.
    `library=True`: a global of torch/transformers/... code, treated as stable (no guards)."""
    __slots__ = ("gid", "key", "library")

    def __init__(self, gid: str, key: str, library: bool = False):
        self.gid, self.key, self.structural, self.library = gid, key, False, library

    @property
    def unguarded(self) -> bool:
        return self.library

    def expr(self):
        return f"{self.gid}[{self.key!r}]"

    def name(self):
        return f"G[{self.key!r}]"


class SizeSource(Source):
    """`base.size(dim)`: the value of a dynamic size symbol (a graph input)."""
    __slots__ = ("base", "dim")

    def __init__(self, base: Source, dim: int):
        self.base, self.dim, self.structural = base, dim, False

    def expr(self):
        return f"{self.base.expr()}.size({self.dim})"

    def name(self):
        return f"{self.base.name()}.size({self.dim})"


class ConstSource(Source):
    """A value bound into the generated function's namespace under `ref` (e.g. a wrapper's fn)."""
    __slots__ = ("ref",)

    def __init__(self, ref: str):
        self.ref, self.structural = ref, False

    def expr(self):
        return self.ref


class AttrSource(Source):
    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str, structural: bool = False):
        # only attributes read off an nn.Module are structural; objects hanging off a module
        # (a config) are re-checked on every call
        self.base, self.attr = base, attr
        self.structural = structural

    def expr(self):
        if self.attr.isidentifier() and not keyword.iskeyword(self.attr):
            if self.attr.startswith("__") and not self.attr.endswith("__"):
                return f"getattr({self.base.expr()}, {self.attr!r})"
            return f"{self.base.expr()}.{self.attr}"
        return f"getattr({self.base.expr()}, {self.attr!r})"

    def name(self):
        return f"{self.base.name()}.{self.attr}"


class InstanceDictSource(Source):
    """`base.__dict__[attr]` read past an overridden __getattribute__ (HF configs): the trace saw
    the instance-dict value, and reading it this way costs ~0.1 µs instead of ~1 µs."""
    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str):
        self.base, self.attr, self.structural = base, attr, False

    def expr(self):
        return f"__odict({self.base.expr()})[{self.attr!r}]"

    def name(self):
        return f"{self.base.name()}.{self.attr}"


def instance_dict(obj):
    return object.__getattribute__(obj, "__dict__")


class DictEntrySource(Source):
    """`base.<table>[key]` for nn.Module's _parameters/_buffers/_modules: faster than getattr."""
    __slots__ = ("base", "table", "key")

    def __init__(self, base: Source, table: str, key: str):
        self.base, self.table, self.key, self.structural = base, table, key, True

    def expr(self):
        return f"{self.base.expr()}.{self.table}[{self.key!r}]"

    def name(self):
        return f"{self.base.name()}.{self.key}"


class CallSource(Source):
    """`base()`: what a weak reference the frame reads points to (a weakref.ref is called)."""
    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base, self.structural = base, False

    def expr(self):
        return f"{self.base.expr()}()"

    def name(self):
        return f"{self.base.name()}()"


class ItemSource(Source):
    """`base[key]`. Structural only where the container cannot change under a snapshot: a tuple
    (`frozen`), or one of a module's own tables (`_modules`, ...), whose version a snapshot
    records. A key whose repr is not Python source over builtins (a torch.dtype, an enum) is
    spelled by `key_expr`, a name the tracer bound in the generated namespace."""
    __slots__ = ("base", "key", "key_expr")

    def __init__(self, base: Source, key, key_expr: str | None = None, frozen: bool = False):
        self.base, self.key = base, key
        self.structural = base.structural and (frozen or isinstance(base, AttrSource) and
                                               base.attr in MODULE_TABLES)
        self.key_expr = key_expr if key_expr is not None else plain_repr(key)
        if self.key_expr is None:
            raise ValueError(f"no expression for the key {key!r}")

    def expr(self):
        return f"{self.base.expr()}[{self.key_expr}]"

    def name(self):
        return f"{self.base.name()}[{self.key!r}]"


class ClosureSource(Source):
    __slots__ = ("base", "idx")

    def __init__(self, base: Source, idx: int):
        self.base, self.idx, self.structural = base, idx, False   # a cell can be rebound

    def expr(self):
        return f"{self.base.expr()}.__closure__[{self.idx}].cell_contents"

    def name(self):
        return f"{self.base.name()}.__closure__[{self.idx}]"

    def cell_expr(self):
        return f"{self.base.expr()}.__closure__[{self.idx}]"


class DefaultSource(Source):
    __slots__ = ("base", "idx", "kw")

    def __init__(self, base: Source, idx, kw: bool = False):
        # `fn.__defaults__ = ...` changes no dict a snapshot records
        self.base, self.idx, self.kw, self.structural = base, idx, kw, False

    def expr(self):
        if self.kw:
            return f"{self.base.expr()}.__kwdefaults__[{self.idx!r}]"
        return f"{self.base.expr()}.__defaults__[{self.idx}]"


def plain_repr(key) -> str | None:
    """Python source for `key` that evaluates to an equal, equally hashed value with builtins
    only, or None. A torch.Size is spelled as the tuple it equals (same hash)."""
    t = type(key)
    if key is None or t in (bool, int, str, bytes) or t is float and key == key and \
            key not in (float("inf"), float("-inf")):
        return repr(key)
    if isinstance(key, tuple) and t in (tuple, __import__("torch").Size):
        parts = [plain_repr(k) for k in key]
        if None in parts:
            return None
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    return None
