"""Stage 3, decomp: aten → primitive aten ops (placeholder)."""

DECOMPS: dict = {}
PRIMS: frozenset = frozenset()


def get_decompositions() -> dict:
    return dict(DECOMPS)
