"""ember bench harness: one subprocess per (model, mode), paired timings inside it.

Parent (`run_suite`): for each selected model and mode, starts
`python -m ember.bench.harness worker ...` with the timing-hygiene environment, a timeout and
its own process group, and reads back one JSON record per compiler. A model that raises, kills
its process or hangs becomes `fail`/`crash`/`timeout` records; the suite goes on.

Worker (`measure`): builds the model once (seeded), then per compiler a fresh deep copy:
  1. first call (compile included) on the same inputs; `compilers.first_working` picks the path
     for "ember" and records fallbacks;
  2. correctness: infer compares outputs with an fp64 eager run; train compares the loss and every
     parameter gradient of the first step with an fp64 eager step (the loss: reduce_loss). A
     compiler passes when each tensor's error is within 10x eager-fp32's error on it (plus a
     small floor, plus in training the kink allowance of kinks.py: how far the fp64 gradients
     move when the inputs of ReLU-like activations move by 10x eager's error there); with 4-D
     inputs eager's error is the larger of its NCHW and channels-last runs';
  3. warm-up, then `reps` rounds that time every compiler once, order reversed every round
     (ABBA...), and report the median of the per-round ratios eager/compiler; with one intra-op
     thread a round is timed in the worker thread's CPU time (steady on a loaded machine; wall
     times are kept beside it), otherwise in wall time;
  4. peak memory of one step from the profiler's allocation events (eager peak / compiler peak).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..backends.paired import step_clock
from . import hygiene, kinks

RESULT_FIELDS = ("model", "suite", "mode", "compiler", "status", "error", "path", "graphs",
                 "graph_breaks", "max_err", "rel_err", "eager_rel_err", "first_call_s", "compile_s",
                 "step_s", "eager_step_s", "speedup", "peak_bytes", "mem_ratio", "threads",
                 "allocator", "env", "reps", "times")


# ------------------------------------------------------------------------------ tensor helpers
def flatten(out: Any) -> list:
    """Every tensor in a (nested) output: tensors, tuples/lists, dicts, HF ModelOutput."""
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in flatten(v)]
    if hasattr(out, "to_tuple"):
        return flatten(out.to_tuple())
    return []


def to_double(x: Any) -> Any:
    import torch
    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: to_double(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_double(v) for v in x)
    return x


def reduce_loss(out: Any):
    """A scalar loss from any output: per floating tensor, the mean of it times fixed weights
    in [0.5, 1.5).

    Not the plain mean: a mean sends the same gradient to every element, and a BatchNorm's
    training backward maps a constant gradient to zero, so every gradient below a model's last
    BatchNorm would be rounding noise (eager-fp32 2% off fp64 on resnet18's conv weights) and a
    tolerance built on eager's error would be vacuous. The weights come from a seeded generator
    (not the global RNG), in float32 then cast, so every compiler and the fp64 reference share them.
    """
    tensors = [t for t in flatten(out) if t.is_floating_point()]
    if not tensors:
        raise TypeError("model output has no floating tensor to train on")
    return sum((t * _loss_weights(i, t)).mean() for i, t in enumerate(tensors))


_WEIGHTS: dict = {}


def _loss_weights(i: int, t):
    import torch
    key = (i, tuple(t.shape), t.dtype, t.device)
    if key not in _WEIGHTS:
        gen = torch.Generator().manual_seed(1000 + i)
        _WEIGHTS[key] = torch.rand(t.shape, generator=gen).add_(0.5).to(t.dtype).to(t.device)
    return _WEIGHTS[key]


def compare(got: list, ref: list) -> tuple[float, float, list[float]]:
    """(max abs error, max relative error, relative error of each tensor).

    A tensor's relative error is its max abs error over its own largest finite reference
    magnitude; a NaN where the reference has none is an infinite error. A tensor that is zero in
    exact arithmetic (its fp64 reference at most ZERO_BELOW times the largest magnitude of all
    the tensors: e.g. the bias gradient of a BatchNorm feeding a conv and another training-mode
    BatchNorm, which removes any per-channel shift) has no scale of its own: every compiler's
    value there is rounding noise of the terms that cancel, so its error is taken over that
    largest magnitude instead (mobilenet_v2: fp64 3e-20, eager-fp32 4e-12, ember and Inductor
    1e-9, all noise; over its own scale ember's was 24x "over tolerance").
    """
    import torch
    if len(got) != len(ref):
        raise AssertionError(f"{len(got)} output tensors, the reference has {len(ref)}")
    scales = [_scale(r.double()) if r.is_floating_point() else 0.0 for r in ref]
    overall = max(scales, default=0.0)
    max_abs = 0.0
    per: list[float] = []
    for g, r, scale in zip(got, ref, scales):
        if g.shape != r.shape:
            raise AssertionError(f"output shape {tuple(g.shape)} != reference {tuple(r.shape)}")
        if not r.is_floating_point():
            bad = float((g != r).sum())
            max_abs = max(max_abs, bad)
            per.append(bad)
            continue
        g64, r64 = g.double(), r.double()
        # equal values (infinities included) and NaN where the reference has NaN agree; a NaN
        # anywhere else is an infinite error (a NaN difference used to compare as a pass)
        diff = torch.where((g64 == r64) | (g64.isnan() & r64.isnan()), 0.0, (g64 - r64).abs())
        diff = diff.nan_to_num(nan=math.inf, posinf=math.inf)
        a = float(diff.max()) if diff.numel() else 0.0
        if scale <= ZERO_BELOW * overall:
            scale = overall
        max_abs = max(max_abs, a)
        per.append(a / max(scale, 1e-6))
    return max_abs, max(per, default=0.0), per


ZERO_BELOW = 1e-12     # fp64 rounding residue of a cancelling sum, relative to the largest tensor


def _scale(r64) -> float:
    finite = r64.abs()[r64.isfinite()]
    return float(finite.max()) if finite.numel() else 0.0


def worst_excess(per: list[float], eager_per: list[float], floor: float,
                 allowed: list[float] | None = None) -> tuple[int, float] | None:
    """The tensor whose error most exceeds 10x eager-fp32's error on that same tensor + floor
    (+ its kink allowance, kinks.allowance, in training).

    Per tensor, because some tensors are pure rounding noise for every compiler (a gradient that
    is zero in exact arithmetic): their eager error is large too, and they must not fail a model.
    """
    worst = None
    allowed = allowed or [0.0] * len(per)
    for i, (c, e, a) in enumerate(zip(per, eager_per, allowed)):
        tol = 10 * e + a + floor
        if c > tol and (worst is None or c / tol > worst[1]):
            worst = (i, c / tol)
    return worst


# ------------------------------------------------------------------------------------- runners
class Runner:
    """One model instance of one compiler: `step()` is one inference or one training step."""

    def __init__(self, fn, module, mode: str, args: tuple, kwargs: dict, lr: float = 1e-3):
        import torch
        self.fn, self.module, self.mode, self.args, self.kwargs = fn, module, mode, args, kwargs
        self.opt = torch.optim.SGD(module.parameters(), lr=lr) if mode == "train" else None

    def step(self):
        import torch
        if self.mode == "infer":
            with torch.no_grad():
                return self.fn(*self.args, **self.kwargs)
        self.opt.zero_grad(set_to_none=True)
        out = self.fn(*self.args, **self.kwargs)
        self.last_outputs = [t.detach() for t in flatten(out)]
        loss = reduce_loss(out)
        loss.backward()
        self.opt.step()
        return loss.detach()

    n_outputs = 0

    def param_names(self) -> list[str]:
        return [n for n, p in sorted(self.module.named_parameters()) if p.requires_grad]

    def observed(self, out) -> list:
        """What correctness compares: the outputs (infer) or outputs + loss + gradients (train)."""
        if self.mode == "infer":
            outs = [t.detach() for t in flatten(out)]
            self.n_outputs = len(outs)
            return outs
        self.n_outputs = len(self.last_outputs)
        grads = [p.grad if p.grad is not None else p.new_zeros(p.shape)
                 for _, p in sorted(self.module.named_parameters()) if p.requires_grad]
        return self.last_outputs + [out] + grads


def peak_bytes(step) -> int | None:
    """Peak extra CPU tensor memory during one call of `step`, from profiler allocation events."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    except Exception:  # noqa: BLE001 - memory is an extra; its absence is recorded as None
        return None
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return peak


def channels_last_errors(fresh, mode: str, args: tuple, kwargs: dict, ref: list) -> list | None:
    """Per-tensor errors vs `ref` of eager fp32 run channels-last (model and 4-D inputs), or
    None when no input is a 4-D float tensor.

    Both layouts are eager PyTorch, so a compiler's tolerance counts the larger of the two
    errors: on CPU, NCHW BatchNorm accumulates its statistics and its backward sums in double
    where channels-last accumulates in float, so eager NCHW can be ~100x closer to fp64 on a
    BN gradient than any float-accumulating run (ghostnet's BN bias gradients: NCHW 1e-5,
    channels-last 3.2e-4, ember 3.4e-4, Inductor 2.5e-4).
    """
    import torch
    cl = torch.channels_last

    def conv(x):
        return x.contiguous(memory_format=cl) if isinstance(x, torch.Tensor) and \
            x.dim() == 4 and x.is_floating_point() else x
    if not any(isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()
               for x in (*args, *kwargs.values())):
        return None

    def errors():
        m = fresh().to(memory_format=cl)
        r = Runner(m, m, mode, tuple(map(conv, args)), {k: conv(v) for k, v in kwargs.items()})
        return compare(r.observed(r.step()), ref)[2]
    return _in_child(errors)


def _in_child(fn):
    """fn() run in a forked child, or None when it raises or the child dies: eager
    channels-last can crash inside PyTorch (timm fastvit_t8's training backward segfaults in
    eager), which must not take the compilers' rows with it. Without the value the check is
    stricter, not looser. Forked only from a single-threaded process (the bench worker), and
    the child runs torch on one thread: a fork beside other threads, or entering the parent's
    OpenMP pool, can deadlock the child (a pytest-xdist worker runs fn() in place)."""
    import pickle
    import threading
    if threading.active_count() > 1:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - as a failed child: no value
            return None
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                                # the child: write the pickled value, exit
        os.close(rd)
        try:
            import torch
            torch.set_num_threads(1)
            data = pickle.dumps(fn())
        except BaseException:  # noqa: BLE001 - reported to the parent as no value
            data = pickle.dumps(None)
        with os.fdopen(wr, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        print(f"eager channels-last reference died (wait status {status}): not counted",
              file=sys.stderr)
        return None
    return pickle.loads(data)


def _describe_tensor(mode: str, i: int, runner: Runner) -> str:
    if mode == "infer" or i < runner.n_outputs:
        return f"output {i}"
    if i == runner.n_outputs:
        return "loss"
    names = runner.param_names()
    k = i - runner.n_outputs - 1
    return f"grad of {names[k]}" if k < len(names) else f"tensor {i}"


# ---------------------------------------------------------------------------------------- worker
def measure(spec, mode: str, compiler_names: list[str], reps: int, warmup: int, backend: str,
            front: str, memory: bool, emit) -> None:
    """Benchmark one model in one mode; call `emit(record)` once per compiler, as soon as known."""
    from . import compilers
    from .suites import instantiate

    env = hygiene.describe()
    base = {"model": spec.name, "suite": spec.suite, "family": spec.family or spec.suite,
            "note": spec.note, "mode": mode, "threads": env["threads"],
            "allocator": env["allocator"], "env": env, "reps": reps, "warmup": warmup}
    names = ["eager"] + [c for c in compiler_names if c != "eager"]
    t_start = time.perf_counter()
    try:
        model, args, kwargs = instantiate(spec)
        model.train(mode == "train")
    except Exception as exc:  # noqa: BLE001
        for c in names:
            emit({**base, "compiler": c, "status": "fail",
                  "error": "build: " + compilers.describe_exception(exc)})
        return

    def fresh():
        return copy.deepcopy(model)

    # fp64 reference
    ref = None
    try:
        m64 = fresh().double()
        r64 = Runner(m64, m64, mode, to_double(args), to_double(kwargs))
        out64 = r64.observed(r64.step())
        del m64, r64
        if any(t.is_floating_point() and bool(t.isnan().any()) for t in out64):
            raise ValueError("the fp64 run gives NaN")   # (ProphetNet: masks from float32's min)
        ref = out64
    except Exception as exc:  # noqa: BLE001 - some models do not run in fp64; fall back to fp32
        base["reference"] = f"fp32 eager (fp64 failed: {compilers.describe_exception(exc)[:120]})"
    else:
        base["reference"] = "fp64 eager"
    allowed = None
    if mode == "train" and ref is not None:
        def step(m, double):
            r = Runner(m, m, mode, to_double(args) if double else args,
                       to_double(kwargs) if double else kwargs)
            return r.observed(r.step())
        try:
            found = kinks.allowance(fresh, lambda m: step(m, True), lambda m: step(m, False),
                                    ref, compare)
        except Exception as exc:  # noqa: BLE001 - without it the check is stricter, not looser
            base["kinks"] = "failed: " + compilers.describe_exception(exc)[:120]
        else:
            if found is not None:
                allowed, base["kinks"] = found[0], {**found[1], "max_allowed": max(found[0])}

    # eager channels-last's error, before any compiler starts threads (a compile's pool makes
    # _in_child run it in place, where fastvit_t8's eager channels-last backward corrupted the
    # heap and took the worker's rows with it)
    cl_per = channels_last_errors(fresh, mode, args, kwargs, ref) \
        if ref is not None and base["reference"] == "fp64 eager" else None

    runners: dict[str, Runner] = {}
    records: dict[str, dict] = {}
    for c in names:
        rec = {**base, "compiler": c}
        records[c] = rec
        holder: dict[str, Runner] = {}

        def first_call(compiled, _holder=holder):
            module = getattr(compiled, "_orig_mod", compiled)
            _holder["r"] = Runner(compiled, module, mode, args, kwargs)
            return _holder["r"].step()

        try:
            compiled, path, out, first_s = compilers.first_working(
                c, fresh, first_call, backend=backend, front=front)
        except Exception as exc:  # noqa: BLE001 - reported, the next compiler goes on
            rec.update(status="fail", error=compilers.describe_exception(exc),
                       rejected_paths=getattr(exc, "ember_bench_tried", []))
            if c == "eager":
                for other in names[1:]:
                    emit({**base, "compiler": other, "status": "fail",
                          "error": "eager failed: " + rec["error"]})
                emit(rec)
                return
            continue
        runner = holder["r"]
        rec.update(path.record(), first_call_s=first_s)
        if c == "ember":
            import ember
            rec["ember_stats"] = ember.stats()
        got = runner.observed(out)
        if ref is None and c == "eager":
            ref = [t.detach().clone() for t in got]
        try:
            rec["max_err"], rec["rel_err"], rec["_per"] = compare(got, ref)
        except AssertionError as exc:
            rec["status"], rec["error"] = "wrong", f"AssertionError: {exc}"
        runners[c] = runner
        rec["_path"] = path

    eager_err = records["eager"].get("rel_err") or 0.0
    eager_per = records["eager"].get("_per") or []
    if eager_per and cl_per is not None and len(cl_per) == len(eager_per):
        records["eager"]["eager_cl_rel_err"] = max(cl_per, default=0.0)
        eager_per = [max(a, b) for a, b in zip(eager_per, cl_per)]
    floor = 1e-4 if mode == "train" else 1e-5
    for c, rec in records.items():
        per = rec.pop("_per", None)
        if "status" in rec:
            continue
        rec["eager_rel_err"], rec["tol"] = eager_err, f"per tensor: 10 x eager-fp32 error + {floor:g}" + (" + kink allowance" if allowed else "") + \
            (" (eager: the larger of NCHW, channels-last)" if "eager_cl_rel_err" in records["eager"] else "")
        path = rec["_path"]
        bad = worst_excess(per or [], eager_per, floor, allowed)
        if not path.compiled:
            rec["status"] = "fallback"
            rec["error"] = (f"none of {len(path.rejected)} paths compiled; first: "
                            f"{path.problem or 'ran eagerly'}")
        elif bad is not None:
            i, ratio = bad
            what = _describe_tensor(mode, i, runners[c])
            rec["status"] = "wrong"
            kink = f", kink allowance {allowed[i]:.3g}" if allowed else ""
            rec["error"] = (f"{what}: rel_err {per[i]:.3g} vs eager-fp32 {eager_per[i]:.3g}{kink} "
                            f"({ratio:.1f}x over tolerance)")
        elif path.rejected and (path.front, path.backend) != \
                compilers.candidates(c, backend, front)[0]:
            # compiled, but not as asked: ember's capture or backend failed and a lesser path
            # (torch.compile's capture, the aot_eager backend: eager kernels) ran instead
            rec["status"] = "degraded"
            rec["error"] = f"ran as {path.label}; {path.rejected[0]}"
        else:
            rec["status"] = "pass"

    # warm-up (warnings recorded: a late fallback or recompile still shows) and paired timing
    order = list(runners)
    try:
        for i in range(warmup):
            for c in (order if i % 2 == 0 else order[::-1]):
                compilers.call_recording(records[c]["_path"], runners[c].step)
        clock = step_clock()
        times: dict[str, list[float]] = {c: [] for c in order}
        walls: dict[str, list[float]] = {c: [] for c in order}
        for r in range(reps):
            for c in (order if r % 2 == 0 else order[::-1]):
                w0, t0 = time.perf_counter(), clock()
                runners[c].step()
                times[c].append(clock() - t0)
                walls[c].append(time.perf_counter() - w0)
    except Exception as exc:  # noqa: BLE001 - a later-step failure fails only that model
        for c in order:
            records[c].update(status="fail", error="timing: " + compilers.describe_exception(exc))
        times = {}
    for c in order:
        rec = records[c]
        if times.get(c):
            rec["times"] = [round(t, 6) for t in times[c]]
            rec["wall_times"] = [round(t, 6) for t in walls[c]]
            rec["clock"] = "thread_cpu" if clock is time.thread_time else "wall"
            rec["step_s"] = statistics.median(times[c])
            rec["eager_step_s"] = statistics.median(times["eager"])
            rec["speedup"] = statistics.median(e / t for e, t in zip(times["eager"], times[c]))
            rec["speedup_of_medians"] = rec["eager_step_s"] / rec["step_s"]
            rec["compile_s"] = max(rec["first_call_s"] - rec["step_s"], 0.0)
        path = rec.pop("_path")
        if c == "ember":
            path.refresh_stats()          # a fallback or recompile during warm-up shows here
            rec["ember_stats"] = path.stats
            rec["counted_fallbacks"] = path.counted_fallbacks
        rec["fallback_warnings"] = path.fallbacks[:5]
        if rec.get("status") == "pass" and not path.compiled:
            rec["status"], rec["error"] = "fallback", "fell back to eager after the first call"
    if memory and times:
        for c in order:
            records[c]["peak_bytes"] = peak_bytes(runners[c].step)
        e_peak = records["eager"].get("peak_bytes")
        for c in order:
            p = records[c].get("peak_bytes")
            records[c]["mem_ratio"] = (e_peak / p) if e_peak and p else None
    wall = time.perf_counter() - t_start
    for c in names:
        records[c]["wall_s"] = wall
        records[c].pop("_path", None)
        emit(records[c])


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ember.bench.harness worker")
    p.add_argument("--model", required=True)
    p.add_argument("--mode", required=True, choices=("infer", "train"))
    p.add_argument("--compilers", required=True)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--backend", default="ember")
    p.add_argument("--front", default="auto")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    hygiene.apply_threads()
    from .suites import REGISTRY
    spec = REGISTRY[a.model]

    with open(a.out, "a") as f:
        def emit(rec):
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
        measure(spec, a.mode, a.compilers.split(","), a.reps, a.warmup, a.backend, a.front,
                not a.no_memory, emit)
    return 0


# ---------------------------------------------------------------------------------------- parent
def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            text = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-400:]


def run_worker(cmd: list, env: dict, timeout: float, out: str, log: str):
    """Run a worker command in its own session (output to `log`), killed after `timeout` s:
    (the JSON records it wrote to `out`, None or what went wrong, wall seconds)."""
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            outcome = None if rc == 0 else f"crash: exit code {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            outcome = f"timeout after {timeout:.0f} s"
    records = []
    if os.path.exists(out):
        with open(out) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records, outcome, time.perf_counter() - t0


def run_one(spec, mode: str, opts, env: dict) -> list[dict]:
    """Run one (model, mode) in a subprocess; always returns one record per compiler."""
    names = ["eager"] + [c for c in opts.compilers if c != "eager"]
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        out, log = os.path.join(tmp, "out.jsonl"), os.path.join(tmp, "log.txt")
        cmd = [sys.executable, "-m", "ember.bench.harness", "worker", "--model", spec.name,
               "--mode", mode, "--compilers", ",".join(names), "--reps", str(opts.reps),
               "--warmup", str(opts.warmup), "--backend", opts.backend, "--front", opts.front,
               "--out", out] + (["--no-memory"] if opts.no_memory else [])
        records, outcome, wall = run_worker(cmd, env, opts.timeout, out, log)
        have = {r["compiler"] for r in records}
        status = "timeout" if outcome and outcome.startswith("timeout") else "crash"
        for c in names:
            if c not in have:
                records.append({"model": spec.name, "suite": spec.suite,
                                "family": spec.family or spec.suite, "note": spec.note, "mode": mode,
                                "compiler": c, "status": status,
                                "error": f"{outcome or 'no result'}; log: {_tail(log)}",
                                "wall_s": wall})
        for r in records:
            for key in RESULT_FIELDS:     # every record has every field, None when unknown
                r.setdefault(key, None)
            r.setdefault("wall_s", wall)
            r["subprocess_wall_s"] = wall
        order = {c: i for i, c in enumerate(names)}
        return sorted(records, key=lambda r: order.get(r["compiler"], 99))


def _progress(total: int):
    """A tqdm bar on a TTY; None (one line per model) otherwise."""
    if not sys.stdout.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="model", dynamic_ncols=True, leave=False)


def run_suite(specs, modes: list[str], opts, env: dict, on_record=None) -> list[dict]:
    from .report import one_line
    results: list[dict] = []
    jobs = [(s, m) for s in specs for m in modes]
    bar = _progress(len(jobs))
    for i, (spec, mode) in enumerate(jobs, 1):
        if bar is not None:
            bar.set_description(f"{spec.name} {mode}")
        recs = run_one(spec, mode, opts, env)
        results.extend(recs)
        if on_record:
            for r in recs:
                on_record(r)
        line = f"[{i}/{len(jobs)}] {one_line(recs)}"
        if bar is not None:
            bar.write(line)
            bar.update(1)
        else:
            print(line, flush=True)
    if bar is not None:
        bar.close()
    return results


def run_suite_cli(args, argv: list[str]) -> int:
    """`ember bench` (suite mode): select, run, print the table and summary, write JSON/PNG."""
    from . import report
    from .suites import REGISTRY, select
    if args.from_json:
        return report.from_json(args.from_json, args.plot)
    suite = args.suite
    try:
        specs = select(suite, args.models, args.quick, args.family, args.shard)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.include_test_models and suite != "test":
        specs += select("test", args.models)
    if not specs:
        print(f"no model matches suite={suite} models={args.models!r}", file=sys.stderr)
        return 2
    if args.list:
        for s in specs:
            print(f"{s.name:36} {s.suite:11} {s.family:15} {s.note}".rstrip())
        print(f"{len(specs)} models (registry: {len(REGISTRY)})")
        return 0
    args.compilers = [c.strip() for c in args.compilers.split(",") if c.strip()]
    for c in args.compilers:
        if c not in ("eager", "ember", "torch"):
            print(f"unknown compiler {c!r}; valid: eager, ember, torch", file=sys.stderr)
            return 2
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]
    env, allocator = hygiene.child_env(args.threads, args.allocator, args.strict)
    print(f"ember bench: {len(specs)} models x {len(modes)} mode(s), compilers "
          f"{','.join(['eager'] + [c for c in args.compilers if c != 'eager'])}, reps {args.reps}, "
          f"warmup {args.warmup}, threads {args.threads}, allocator {allocator}, "
          f"EMBER_STRICT={'1' if args.strict else 'unset'}, timeout {args.timeout:.0f} s/model",
          flush=True)
    json_file = open(args.json, "w") if args.json else None

    def on_record(rec):
        if json_file:
            json_file.write(json.dumps(rec, default=str) + "\n")
            json_file.flush()
    try:
        results = run_suite(specs, modes, args, env, on_record)
    finally:
        if json_file:
            json_file.close()
    print()
    print(report.table(results))
    print()
    print(report.summary(results))
    if args.plot:
        where = report.plot(results, args.plot)
        print(where)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    print("usage: python -m ember.bench.harness worker ... (use `ember bench`)", file=sys.stderr)
    sys.exit(2)
