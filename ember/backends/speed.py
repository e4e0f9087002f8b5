"""Backend "ember", never slower than eager: a graph whose generated kernels lose to eager
PyTorch on the real inputs runs eagerly.

On its second call (the first one builds the kernels), an eligible graph is timed both ways on
that call's own inputs: the compiled callable and the captured graph as eager PyTorch runs it
(`gm.forward`, the user's own ops, not our decompositions), in paired rounds (paired.py): one
untimed warm-up pair (the first calls of either path find cold caches, oneDNN's primitives
unbuilt: the first timing was biased against the kernels, docs/design/051), then ROUNDS rounds
at least, order reversed every other round, each path called often enough per round to run
ROUND_S (a single short call is at the clock's and the allocator's jitter). The answer is the
median of the per-round time ratios kernels/eager, its ~95% interval and the ratios' spread
q3/q1: a minimum per path, as taken before, compared one path's quiet moment with the other's
busy one and flipped verdicts with the machine's load (a LayerNorm kept on eager at 1.29 in one
process measured 0.64x eager, check on, in another; docs/design/090). While the median's
interval holds MARGIN, more rounds, up to MAX_ROUNDS within BUDGET_S of the clock's time
(MIN_ROUNDS at least; CPU time: on a loaded machine wall time would cut the rounds short).

Verdict: a timing whose median's interval is clear of MARGIN, or whose spread is within SPREAD
(a tie: either path costs the same), decides: eager when the median ratio exceeds MARGIN, else
the kernels. Any other is provisional: the graph is timed again RECHECK_CALLS calls later (load
comes and goes), TRIES timings in all; none decided, the graph is unsure and keeps its kernels
only where they are not slower by a standard error (the median over all its timings' rounds
at most 1 by one standard error: the upper end of its one-sigma interval), else eager. Unsure
leans to eager because the promise is "never slower than eager"; it asks no more than one
sigma because a wrong eager choice costs speed too, and pooled over TRIES timings the interval
is narrow: what goes to eager is within a few percent of 1 (a training step at 0.9, spread
1.5 at load 15, keeps its kernels). A decided choice is cached on disk (keyed by
the graph's code, its input sizes, strides and dtypes, the options and the machine's compiler),
an unsure one marked unsure for paired.UNSURE_TTL: another process, a warm start above all,
reuses it without timing and runs the same path; a provisional one is not cached. Both paths
compute the same values; only the speed differs.

Eligible: graphs with static sizes and no random op (running the graph again must change nothing
a user can see: inputs the graph mutates, such as BatchNorm's running statistics, are cloned for
the timed calls). A training graph (aot's autograd runtime) is timed as a whole step, forward
and backward, on detached copies of its inputs: `torch.autograd.grad` with
respect to those copies, so nothing reaches the user's `.grad`, tensor hooks or autograd graph.
The gradient seeds (ones) are made once, untimed: filling them is no part of either path, and a
constant added to both pulls the ratio towards 1. It must hold only torch's own ops (no user
autograd.Function or checkpoint body, whose Python could run twice) and no parameter held by
the graph itself; its step is timed on the first call made with grad enabled after the first
one. If eager wins, the captured graph runs under eager autograd.

Off: `options={"speed_check": False}` or EMBER_SPEED_CHECK=0. Decisions are logged under
EMBER_LOGS=perf ("graph 8a17414e (group_norm) kept on eager PyTorch: kernels/eager 1.09
(1.06-1.11), spread 1.04 over 8 rounds, kernels 1.083 ms, eager 0.995 ms (timed)": the median
ratio, its interval, the spread, the rounds, the median times): a graph is named by its
decision key's first digits, the same in another process for the same graph, inputs and ember
code (docs/design/051). Counters:
speed_kernels_graphs, speed_eager_graphs (decided), speed_undecided_timings (provisional),
speed_unsure_graphs (decided unsure, timed or read).

Consumes: the captured FX graph, aot's compiled callable. Produces: a callable with the same
calling convention.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import threading
import time
import types

import torch
from torch.utils._pytree import tree_leaves

from .. import config, counters
from ..logging import get_logger
from . import paired

perf_log = get_logger("perf")

MARGIN = 1.03            # eager must beat the kernels by more than 3% (median ratio) to be chosen
SPREAD = 1.25            # a spread (q3/q1 of the per-round ratios) within this is a tie
TRIES = 3                # a timing that decides nothing: timed again, this many in all, ...
RECHECK_CALLS = 8        # ... this many calls apart
ROUNDS = 8               # paired rounds a timing takes at least ...
MAX_ROUNDS = 24          # ... and, while its median's interval holds MARGIN, at most ...
BUDGET_S = 0.5           # ... within this much time (a slow graph: MIN_ROUNDS rounds)
MIN_ROUNDS = 4
ROUND_S = 3e-3           # a round runs each path this long at least (calls repeated) ...
MAX_REPS = 64            # ... in this many calls at most
#: names of ops that draw random numbers (or touch the generator); whole names, so that
#: F.normalize or a "brand" attribute are not taken for one
_RANDOM = re.compile(r"_?(rand\w*|\w*dropout\w*|bernoulli_?|normal_?|log_normal_?|multinomial|"
                     r"uniform_?|poisson|exponential_?|geometric_?|cauchy_?|rrelu\w*|"
                     r"gumbel_softmax|\w*seed\w*|\w*rng\w*)")


def is_random(n) -> bool:
    """Whether the torch-level node `n` draws random numbers. A dropout in eval mode
    (`F.dropout(x, p, training=False)`, `torch.dropout(x, p, False)`, as nn.Dropout calls it
    under `model.eval()`) or with p=0 is the identity."""
    name = str(n.target if isinstance(n.target, str) else getattr(n.target, "__name__", n.target))
    if not _RANDOM.fullmatch(name.rpartition(".")[2]):
        return False
    if "dropout" in name:
        training = n.kwargs.get("training", n.kwargs.get("train",
                                n.args[2] if len(n.args) > 2 else True))
        p = n.kwargs.get("p", n.args[1] if len(n.args) > 1 else 0.5)
        if training is False or p == 0:
            return False
    return True


#: what the speed check chose, per graph (tests and `ember bench` read it)
DECISIONS: list = []


def enabled(options: dict) -> bool:
    if os.environ.get("EMBER_SPEED_CHECK", "1") == "0":
        return False
    return bool(options.get("speed_check", True))


def eligible(gm, compiled) -> str | None:
    """None if the graph may be timed both ways, else why not."""
    from ..aot.runtime import TrainingRuntime
    if getattr(compiled, "traced", None) is None:    # aot's runtimes, freeze's FrozenRuntime
        return "not an aot runtime"
    if compiled.traced.symbols:
        return "dynamic sizes"
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            if is_random(n):
                return f"a random op ({getattr(n.target, '__name__', n.target)})"
    if isinstance(compiled, TrainingRuntime):
        return _training_ineligible(gm)
    return None


_TORCH_MODULES = ("torch", "_operator", "operator", "builtins", "math")
_C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType)


def _user_code(target) -> bool:
    """Whether calling `target` may run user Python (which timing would run again)."""
    namespace = getattr(target, "namespace", None)         # an OpOverload(Packet)
    if namespace is not None:
        return namespace not in ("aten", "prims")          # custom ops run user Python
    if isinstance(target, _C_CALLABLES) or getattr(target, "ember_pure", False):
        return False            # ember_pure: a node capture made that runs only torch's code
    return (getattr(target, "__module__", None) or "").split(".")[0] not in _TORCH_MODULES


def _training_ineligible(gm) -> str | None:
    for n in gm.graph.nodes:
        if n.op == "call_function" and _user_code(n.target):
            return f"user code in a training graph ({n.target})"
        if n.op == "get_attr":
            value = getattr(gm, n.target, None)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                return "a parameter held by the graph"
    return None


def speed_checked(gm, compiled, example_inputs, options: dict):
    """`compiled`, or a callable that picks the faster of it and eager `gm` on its 2nd call."""
    if not enabled(options):
        return compiled
    why = eligible(gm, compiled)
    if why is not None:
        perf_log.info("speed check skipped: %s", why)
        return compiled
    return _Chooser(gm, compiled, options)


class _Chooser:
    def __init__(self, gm, compiled, options):
        from ..aot.runtime import TrainingRuntime
        self.gm, self.compiled, self.options = gm, compiled, options
        self.training = isinstance(compiled, TrainingRuntime)
        self.calls = 0
        self.run = self._undecided
        self.decided = False
        self.lock = threading.Lock()
        self.next_timing = 2                 # the first call builds the kernels: not timed
        self.meanwhile = compiled            # serves the untimed calls until decided
        self.rounds: tuple[list, list] = ([], [])  # kernels, eager seconds: all timings' rounds
        self.tries = 0
        self.seeds: dict = {}                # gradient seeds of the timed training steps

    def __call__(self, *args):
        return self.run(*args)

    def _undecided(self, *args):
        with self.lock:
            if self.decided:                         # decided meanwhile, in another thread
                return self.run(*args)
            if self.training and not torch.is_grad_enabled():
                return self.compiled(*args)          # times only training steps
            self.calls += 1
            if self.calls != self.next_timing:
                return self.meanwhile(*args)
            return self._decide(args)

    def _eager(self, *args):
        # gm.forward: GraphModule.__call__ would run global module hooks on the graph itself.
        # With grad enabled and an input that requires grad, an inference runtime's graph is one
        # no gradient flows through, but its views of such inputs must stay views autograd
        # tracks (made under no_grad, DeBERTa's `q /= scale` on one raised, and a use of one
        # lost its gradient): only a graph no autograd can reach runs under no_grad
        # (grad already off: no no_grad() block, which costs ~1.5 us on each call of a graph
        # kept on eager)
        if self.training or not torch.is_grad_enabled() or any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self.gm.forward(*args)
        with torch.no_grad():
            return self.gm.forward(*args)

    def _time(self, args):
        mutated = self.compiled.traced.mutated

        def fresh():
            # every timed call mutates its own copies of the user's inputs, taken before any
            # timed call: a graph that reads what it mutates (a KV cache's position counter)
            # must see the same state on each call, or it indexes out of bounds
            return [a.clone() if i in mutated else a for i, a in enumerate(args)]
        if not self.training:
            t_kernels, t_eager, out = _time_both(self.compiled, self._eager, fresh, not mutated)
            return t_kernels, t_eager, None if mutated else out
        seeds = self.seeds
        if not self.compiled.backward_ready or not seeds:   # the lazy backward build and the
            _training_step(self.compiled, fresh(), seeds)   # seeds' making are not timed
        t_kernels, t_eager, _ = _time_both(lambda *a: _training_step(self.compiled, a, seeds),
                                           lambda *a: _training_step(self._eager, a, seeds), fresh,
                                           not mutated)
        return t_kernels, t_eager, None              # timed on detached copies: run for real

    def _decide(self, args):
        key = _key(self.gm, args, self.options, self.training)
        cached = _load(key)
        out, provisional = None, False
        if cached is not None:
            choice, sure, source = cached["choice"], cached["sure"], "disk cache"
            got = paired.Ratios(tuple(cached["ratios"]))
            t_kernels, t_eager, cost = cached["kernels_ms"], cached["eager_ms"], 0.0
        else:
            start = time.perf_counter()
            tk, te, out = self._time(args)
            cost = time.perf_counter() - start
            self.tries += 1
            self.rounds[0].extend(tk)
            self.rounds[1].extend(te)
            got, sure = paired.ratios(tk, te), True
            if not (_clear(got) or got.spread <= SPREAD):   # by all timings' rounds so far
                provisional, sure = self.tries < TRIES, False
                tk, te = self.rounds
                got = paired.ratios(tk, te)
            choice = _verdict(got, sure)
            t_kernels, t_eager = statistics.median(tk) * 1e3, statistics.median(te) * 1e3
            source = ("timed" if self.tries == 1 else f"timing {self.tries}") + (
                ", undecided: re-timed later" if provisional else
                f", unsure after {TRIES} timings" if not sure else "")
            if not provisional:
                _store(key, {"choice": choice, "kernels_ms": t_kernels, "eager_ms": t_eager,
                             "ratios": got.r}, sure)
        chosen = self._eager if choice == "eager" else self.compiled
        if provisional:
            self.meanwhile, self.next_timing = chosen, self.calls + RECHECK_CALLS
            counters.bump("speed_undecided_timings")
        else:
            self.run, self.decided = chosen, True
            counters.bump(f"speed_{choice}_graphs")
            if not sure:
                counters.bump("speed_unsure_graphs")
        name = graph_name(self.gm, key)
        DECISIONS.append({"graph": name, "choice": choice, "kernels_ms": t_kernels,
                          "eager_ms": t_eager, "ratio": got.median, "interval": got.interval(),
                          "spread": got.spread, "rounds": got.rounds, "sure": sure,
                          "source": source, "training": self.training, "cost_s": cost})
        what = f"graph {name} " + ("kept on eager PyTorch" if choice == "eager" else
                                   "runs its kernels")
        perf_log.info("%s: kernels/eager %.2f (%.2f-%.2f), spread %.2f over %d rounds, kernels "
                      "%.3f ms, eager %.3f ms (%s)", what, got.median, *got.interval(),
                      got.spread, got.rounds, t_kernels, t_eager, source)
        return out if out is not None else chosen(*args)


def _verdict(got: paired.Ratios, sure: bool) -> str:
    """Eager or the kernels (module docstring, Verdict): `got` sure, by its median; unsure (or
    provisional), the kernels only where the median is at most 1 by one standard error."""
    if sure:
        return "eager" if got.median > MARGIN else "kernels"
    return "kernels" if got.interval(1.0)[1] <= 1.0 else "eager"


def _clear(got: paired.Ratios) -> bool:
    """Whether the median's ~95% interval lies on one side of MARGIN."""
    lo, hi = got.interval()
    return hi < MARGIN or lo > MARGIN


def graph_name(gm, key: str) -> str:
    """How logs name a timed graph: its decision key's first hex digits (the same graph, inputs
    and code in another process: the same name) and its first few ops."""
    ops = [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
           if n.op in ("call_function", "call_method", "call_module")]
    more = f", +{len(ops) - 3}" if len(ops) > 3 else ""
    return f"{key[:8]} ({', '.join(ops[:3])}{more})"


def _training_step(fn, args, seeds: dict) -> None:
    """One forward and backward of `fn` on detached copies of `args`: gradients are returned by
    autograd.grad, never accumulated, and no user tensor joins the autograd graph. `seeds` holds
    the ones each output's gradient starts from, by size, stride and dtype, made on first use
    (neither autograd nor ember's backward writes into a gradient it is given)."""
    leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad
              else a for a in args]
    wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    with torch.enable_grad():
        outs = [o for o in tree_leaves(fn(*leaves))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if outs and wrt:
            torch.autograd.grad(outs, wrt, [_seed(seeds, o) for o in outs], allow_unused=True)


def _seed(seeds: dict, o: torch.Tensor) -> torch.Tensor:
    key = (o.shape, o.stride(), o.dtype, o.device)
    if key not in seeds:
        seeds[key] = torch.ones_like(o)
    return seeds[key]


def _time_both(kernels, eager, fresh, repeat: bool = True) -> tuple[list, list, object]:
    """(kernels' seconds per call in each round, eager's, an output of the kernels): paired
    rounds after a warm-up pair (module docstring). `fresh()` gives each call its arguments
    (copies of the mutated ones), made untimed; `repeat`: a path may be called several times
    a round on the same arguments (False: once, a graph that mutates its inputs)."""
    clock = paired.step_clock()
    start = clock()
    a, b = fresh(), fresh()
    t0 = clock()
    out = kernels(*a)
    t1 = clock()
    eager(*b)
    once = max(t1 - t0, clock() - t1)              # the slower path's call sets the repeats
    reps = max(1, min(MAX_REPS, int(ROUND_S / max(once, 1e-9)))) if repeat else 1
    tk, te = [], []
    paths = ((kernels, tk), (eager, te))
    while True:
        for fn, times in (paths if len(tk) % 2 == 0 else paths[::-1]):
            calls = [fresh() for _ in range(reps)]
            t0 = clock()
            for c in calls:
                fn(*c)
            times.append((clock() - t0) / reps)
        n = len(tk)
        if n >= MAX_ROUNDS or n >= MIN_ROUNDS and clock() - start > BUDGET_S:
            break
        if n >= ROUNDS and _clear(paired.ratios(tk, te)):
            break
    return tk, te, out


def _key(gm, args, options, training: bool) -> str:
    from ..runtime.build import compiler_version
    from ..runtime.graph_cache import sources_hash
    h = hashlib.sha256()
    h.update(f"{'training step' if training else 'inference'}\n{gm.code}".encode())
    for a in args:
        if isinstance(a, torch.Tensor):
            h.update(f"{tuple(a.shape)}{a.stride()}{a.dtype}{a.device}".encode())
        else:
            h.update(repr(a).encode())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    h.update(f"{torch.__version__} {compiler_version()} {torch.get_num_threads()}".encode())
    # what the compiled side runs depends on ember's own code: a decision made by other code
    # (before a fusion or a layout rule changed) is not reused
    h.update(sources_hash(("backends", "aot", "decomp", "loopir", "lower", "schedule", "codegen",
                           "runtime")).encode())
    return h.hexdigest()


def _path(key: str):
    return config.cache_subdir("speed", key[:2]) / f"{key}.json"


def _load(key: str) -> dict | None:
    data = paired.load(_path(key), ("choice", "sure", "ratios", "kernels_ms", "eager_ms"))
    return data if data is not None and data["choice"] in ("eager", "kernels") else None


def _store(key: str, data: dict, sure: bool) -> None:
    paired.store(_path(key), data, sure)
