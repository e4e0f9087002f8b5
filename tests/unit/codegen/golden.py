"""Golden sources: the C++, Triton and wrapper text the kernel backend generates for a fixed set
of graphs, one per kernel kind, recorded as sha256 in golden_sources.json.

A refactor of lower/schedule/codegen that must not change what is generated proves it with
tests/unit/codegen/test_golden.py. A change that is meant to alter generated code regenerates the
record (and says so in its commit):

    python -m tests.unit.codegen.golden --regen          # rewrite golden_sources.json
    python -m tests.unit.codegen.golden --dump DIR       # write every source to DIR, to diff

The graphs are captured by ember's capture with a recording backend, then go through
aot_compile (decompositions, joint graph and partition for training cases) into the kernel
backend's `compile_aten_graph`, whose sources are read from the `output_code` log records. The
g++ builds are not run (the build pool is replaced by one that never starts a job): only the
generated text matters here.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.nn.functional as F

GOLDEN = Path(__file__).with_name("golden_sources.json")
TRITON = {"cpu_codegen": "triton"}
LOOPED = {"cpu_codegen": "triton", "triton.max_persistent": 8, "triton.rblock": 8}


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class _ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))


class _LayerNorm2d(torch.nn.Module):
    """LayerNorm over the channels of NCHW (ConvNeXt's LayerNorm2d): strided rows (design 077)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(40)
        self.scale = torch.nn.Parameter(torch.ones(40, 1, 1))   # the norm's input gradient

    def forward(self, x):
        return self.norm((x * self.scale).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _g(*shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype)


def _cases():
    """name -> (fn or module factory, args factory, dynamic, train, options)."""
    idx = torch.tensor([3, 0, 2, 2, 1])
    return {
        "pointwise": (lambda x, y: (x * 2 + y.sin(), torch.where(x > 0, x, y).exp()),
                      lambda: (_g(8, 33), _g(33, seed=1)), False, False, {}),
        "pointwise_int_bf16": (lambda x, i: ((x.to(torch.bfloat16) * 3).float(), i // 3 + i % 5),
                               lambda: (_g(7, 9), torch.arange(63).view(7, 9)), False, False, {}),
        "reductions": (lambda x: (x.sum(1), x.amax(0), x.argmax(1), torch.var_mean(x, 1),
                                  x.sum()),
                       lambda: (_g(64, 300),), False, False, {}),
        "big_reduction": (lambda x: (x.sum(), x.abs().max()), lambda: (_g(1 << 17),), False,
                          False, {}),
        "softmax_layernorm": (lambda x, w, b: (x.softmax(-1), x.log_softmax(0),
                                               F.layer_norm(x, (x.shape[-1],), w, b)),
                              lambda: (_g(16, 48), _g(48, seed=1), _g(48, seed=2)), False, False,
                              {}),
        "externs": (lambda a, b, c, x, w: (torch.addmm(c, a, b).relu(),
                                           torch.bmm(a.view(2, 4, 8), b.view(2, 8, 2)),
                                           F.conv2d(x, w, padding=1).sigmoid()),
                    lambda: (_g(8, 8), _g(8, 4, seed=1), _g(4, seed=2), _g(1, 3, 6, 6, seed=3),
                             _g(4, 3, 3, 3, seed=4)), False, False, {}),
        "views": (lambda x: (x.t().contiguous() + 1, x.as_strided((4, 4), (1, 8), 2) * 2,
                             x[1:, ::2].permute(1, 0).reshape(-1) - 1, x.unsqueeze(0).expand(3, 8,
                                                                                         8) * x),
                  lambda: (_g(8, 8),), False, False, {}),
        "cat_index_scatter": (lambda x, y, i: (torch.cat([x, y * 2], 1), x[i] + 1,
                                               torch.zeros(6, 5).scatter_add(0, i.view(5, 1).expand(
                                                   5, 5), x[:5]),
                                               torch.gather(x, 1, i.view(1, 5).expand(4, 5)),
                                               x.index_put((i,), torch.ones(5, 5), accumulate=True)),
                              lambda: (_g(6, 5), _g(6, 3, seed=1), idx.clone()), False, False, {}),
        "dynamic": (lambda x, w: (torch.relu(x @ w) * 2).softmax(-1).sum(0),
                    lambda: (_g(10, 16), _g(16, 12, seed=1)), True, False, {}),
        "train_mlp": (_Mlp, lambda: (_g(6, 16),), False, True, {}),
        "train_convbn": (_ConvBn, lambda: (_g(2, 3, 6, 6),), False, True, {}),
        "transposed_sum": (lambda a, x: (a * x.transpose(1, 2)).sum(-1),
                           lambda: (_g(2, 40, 35), _g(2, 35, 40, seed=1)), False, False, {}),
        "ln2d_train": (_LayerNorm2d, lambda: (_g(2, 40, 5, 7),), False, True, {}),
        "transposed_copy": (lambda x: x.permute(0, 2, 3, 1).contiguous() * 2,
                            lambda: (_g(2, 40, 6, 7),), False, False, {}),
        "pad_planes": (lambda x: (F.pad(x, (2, 2, 2, 2), mode="reflect"), F.pad(x, (1, 1, 1, 1)) + 1),
                       lambda: (_g(2, 32, 6, 6),), False, False, {}),
        "double_columns": (lambda x: (x.sum(0), torch.var_mean(x, 0)),
                           lambda: (_g(16, 300).double(),), False, False, {}),
        "many_streams": (lambda x: [c.relu() * 2 for c in x.chunk(8, 1)],
                         lambda: (_g(2, 64, 80),), False, False, {}),
        "relpos_softmax": (lambda a, rh, rw: (a.view(2, 3, 5, 7, 6) + rh[..., None]
                                              + rw[..., None, :]).view(2, 15, 42).softmax(-1),
                           lambda: (_g(2, 15, 42), _g(2, 3, 5, 7, seed=1), _g(2, 3, 5, 6, seed=2)),
                           False, False, {}),
        "no_fusion": (lambda x: (x.exp() + 1).sum(1), lambda: (_g(8, 16),), False, False,
                      {"fusion": False}),
        "triton_pointwise": (lambda x, y: (x * 2 + y.sin()).relu(),
                             lambda: (_g(8, 33), _g(33, seed=1)), False, False, TRITON),
        "triton_norms": (lambda x, w, b: (x.softmax(-1), F.layer_norm(x, (48,), w, b),
                                          torch.var_mean(x, 0)),
                         lambda: (_g(16, 48), _g(48, seed=1), _g(48, seed=2)), False, False,
                         TRITON),
        "triton_looped": (lambda x: (x.softmax(-1), x.sum(0), torch.var_mean(x, 1)),
                          lambda: (_g(12, 40),), False, False, LOOPED),
        "triton_index": (lambda x, i: (torch.cat([x, x * 2], 0), x[i] * 3, x.t() + 1),
                         lambda: (_g(6, 5), idx.clone()), False, False, TRITON),
        "triton_dynamic": (lambda x: (x * x.sum(-1, keepdim=True)).relu(),
                           lambda: (_g(10, 12),), True, False, TRITON),
        "triton_train_mlp": (_Mlp, lambda: (_g(6, 16),), False, True, TRITON),
    }


class _NoBuild:
    """Stands in for runtime.build's thread pool: the builds never run (sources only)."""

    def submit(self, fn, *args, **kwargs):
        return Future()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.sources: list[tuple[str, str]] = []

    def emit(self, record):
        msg = record.msg
        kind = "triton" if "Triton" in msg else "cpp"
        texts = [a for a in record.args if isinstance(a, str)]
        if len(texts) == 2:
            self.sources += [(kind, texts[0]), ("wrapper", texts[1])]


@contextlib.contextmanager
def _recording():
    import ember.runtime.build as build
    log = logging.getLogger("ember.output_code")
    handler, level, pool, handlers = _Records(), log.level, build._pool, log.handlers
    old_env = {k: os.environ.get(k) for k in ("EMBER_CACHE_DIR", "EMBER_LOGS")}
    with tempfile.TemporaryDirectory() as d:
        os.environ["EMBER_CACHE_DIR"] = d      # no graph-cache hit may skip code generation
        os.environ["EMBER_LOGS"] = "output_code"   # a get_logger call during compile keeps INFO
        log.handlers = [handler]        # recorded, not printed
        log.setLevel(logging.INFO)
        build._pool = _NoBuild()
        try:
            yield handler
        finally:
            build._pool = pool
            log.handlers = handlers
            log.setLevel(level)
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def generate(name: str) -> list[tuple[str, str]]:
    """[(kind, source)] of one case, in generation order (kind: cpp, triton, wrapper)."""
    import ember
    from ember.aot import aot_compile
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph

    make_fn, make_args, dynamic, train, options = _cases()[name]
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm

    torch.manual_seed(0)
    fn = make_fn() if isinstance(make_fn, type) else make_fn
    if train:
        fn.train()
    args = make_args()
    ember.reset()
    with torch.set_grad_enabled(train):
        ember.compile(fn, backend=record, dynamic=dynamic, fullgraph=True)(*args)
    assert len(graphs) == 1, f"{name}: {len(graphs)} graphs"
    gm, example = graphs[0]

    def compiler(g, ex):
        return compile_aten_graph(g, ex, options=options)

    with _recording() as rec, torch.set_grad_enabled(train):
        rt = aot_compile(gm, example, fw_compiler=compiler, bw_compiler=compiler,
                         decompositions=get_decompositions())
        if train:
            rt.backward_fn()
    ember.reset()
    return rec.sources


def digests(name: str) -> list[str]:
    return [f"{kind} {hashlib.sha256(src.encode()).hexdigest()}" for kind, src in generate(name)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--regen", action="store_true", help="rewrite golden_sources.json")
    p.add_argument("--dump", metavar="DIR", help="write every generated source to DIR")
    p.add_argument("cases", nargs="*", help="only these cases (default: all)")
    a = p.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    names = a.cases or list(_cases())
    record = {}
    for name in names:
        sources = generate(name)
        record[name] = [f"{k} {hashlib.sha256(s.encode()).hexdigest()}" for k, s in sources]
        if a.dump:
            d = Path(a.dump)
            d.mkdir(parents=True, exist_ok=True)
            for i, (kind, src) in enumerate(sources):
                ext = {"cpp": "cpp", "triton": "py", "wrapper": "py"}[kind]
                (d / f"{name}_{i:02d}_{kind}.{ext}").write_text(src)
        print(name, len(sources), "sources")
    if a.regen:
        old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() and a.cases else {}
        old.update(record)
        GOLDEN.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
