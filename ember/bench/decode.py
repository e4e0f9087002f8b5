"""`ember bench llm-decode`: greedy `generate()` of a small HF Llama / GPT-2, tokens per second.

Consumes: a model config (random weights, nothing downloaded), a cache kind (dynamic: the
default DynamicCache that grows every token; static: `cache_implementation="static"`, fixed
shapes) and the compilers to compare. Produces one record per (model, cache, compiler): first
generate seconds (compile included), the median time of a generate (prefill of `--prompt` tokens
+ `--new-tokens` decode steps) and its tokens/s, the speedup vs eager (median of paired per-round ratios,
order reversed every round), how many graphs each backend compiled in the first generate and
during the timed rounds (a recompile per generated token shows here), and whether the greedy
tokens equal eager's.

`--step-reps N` (static cache) also times one decode step alone: the model call of the 10th
generated token, recorded and replayed N times per compiler (its cache position counters reset
before each, untimed), alternating compilers. A step is ~1/32 of a generate with none of
generate()'s own Python, so the per-token cost of guards, wrapper and kernels shows with less
noise than tokens/s does on a shared machine.

Every compiler works on a deep copy of the same seeded model; the model is compiled in place
(`ember.compile(model)`, `model.compile()` for torch.compile) so `generate()`'s own `self(...)`
calls go through it. Batch 1, greedy, EOS disabled so every run makes exactly N tokens.
Times are thread CPU seconds at one thread (wall seconds otherwise), as the harness's rounds
(`backends.paired.step_clock`): on a shared machine other processes do not count against a row.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

from . import hygiene
from ..backends.paired import step_clock

MODELS = ("llama", "gpt2")
CACHES = ("dynamic", "static")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="llama,gpt2", help=f"comma list from {', '.join(MODELS)}")
    p.add_argument("--cache", default="dynamic,static", help="comma list: dynamic, static")
    p.add_argument("--compilers", default="eager,ember,torch")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per call")
    p.add_argument("--reps", type=int, default=5, help="paired timed rounds")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--step-reps", type=int, default=0,
                   help="static cache: also time N replays of one decode step per compiler")
    p.add_argument("--json", default=None, help="write JSON lines here")


def build(name: str, layers: int, hidden: int, vocab: int, max_len: int):
    """A ~30M-parameter causal LM from a config (defaults: 6 layers, d=512, vocab 8192)."""
    import transformers
    if name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=hidden // 64,
                                       num_key_value_heads=max(hidden // 128, 1),
                                       intermediate_size=hidden * 8 // 3 // 16 * 16,
                                       vocab_size=vocab, max_position_embeddings=max_len)
        model = transformers.LlamaForCausalLM(cfg)
    elif name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=hidden // 64,
                                      vocab_size=vocab, n_positions=max_len, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.do_sample = None, 0, False
    return model.eval()


def _compile(compiler: str, model):
    """Compile `model` in place; returns the graph counter (None for eager)."""
    import ember

    from .compilers import CompileCounter, _torch_inductor_backend
    if compiler == "eager":
        return None
    if compiler == "ember":
        counter = CompileCounter(ember.get_backend("ember"), "ember")
        ember.compile(model, backend=counter)
    elif compiler == "torch":
        counter = CompileCounter(_torch_inductor_backend(), "inductor")
        model.compile(backend=counter)
    else:
        raise ValueError(f"unknown compiler {compiler!r}; valid: eager, ember, torch")
    return counter


def measure(name: str, cache: str, compilers: list[str], args) -> list[dict]:
    import torch

    from .compilers import call_recording, describe_exception, is_fallback_warning, Path
    torch.manual_seed(0)
    base_model = build(name, args.layers, args.hidden, args.vocab,
                       args.prompt + args.new_tokens + 8)
    prompt = torch.randint(1, args.vocab, (1, args.prompt))
    gen_kw = {"do_sample": False}
    if cache == "static":
        gen_kw["cache_implementation"] = "static"

    def generate(model, n):
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **gen_kw)

    names = ["eager"] + [c for c in compilers if c != "eager"]
    env = hygiene.describe()
    recs, models, counters = {}, {}, {}
    ref = None
    for c in names:
        rec = {"bench": "llm-decode", "model": f"{name}_{cache}", "cache": cache,
               "compiler": c, "prompt": args.prompt, "new_tokens": args.new_tokens,
               "params_m": round(sum(p.numel() for p in base_model.parameters()) / 1e6, 1),
               "threads": env["threads"], "allocator": env["allocator"], "env": env,
               "clock": "thread_cpu" if step_clock() is time.thread_time else "wall"}
        recs[c] = rec
        model = copy.deepcopy(base_model)
        path = Path(c, c)
        try:
            counters[c] = _compile(c, model)
            t0 = time.perf_counter()
            out = call_recording(path, generate, model, args.new_tokens)
            rec["first_generate_s"] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - recorded, the next compiler goes on
            rec.update(status="fail", error=describe_exception(exc))
            continue
        rec["graphs_first"] = counters[c].graphs if counters[c] else 0
        rec["fallback_warnings"] = [w for w in path.warnings if is_fallback_warning(w)][:3]
        if c == "ember":
            import ember
            rec["ember_stats"] = ember.stats()
        tokens = out[0, args.prompt:].tolist()
        if ref is None:
            ref = tokens
        same = sum(a == b for a, b in zip(tokens, ref))
        rec["tokens_match"] = f"{same}/{len(ref)}"
        rec["status"] = "pass" if tokens == ref else "wrong"
        if rec["fallback_warnings"] and rec["status"] == "pass":
            rec["status"] = "fallback"
        models[c] = model
    order = list(models)
    t_full = {c: [] for c in order}

    clock = step_clock()

    def timed(c) -> bool:
        """One generate of compiler `c`, timed; a failure fails that compiler's row only."""
        t0 = clock()
        try:
            generate(models[c], args.new_tokens)
        except Exception as exc:  # noqa: BLE001
            recs[c].update(status="fail", error="timing: " + describe_exception(exc))
            order.remove(c)
            return False
        t_full[c].append(clock() - t0)
        return True
    # Always the same length: generate() sizes a static cache from the longest call so far.
    for c in list(order):                  # one untimed warm-up call each
        if timed(c):
            t_full[c].clear()
    for r in range(args.reps):
        for c in (list(order) if r % 2 == 0 else order[::-1]):
            timed(c)
    if cache == "static" and getattr(args, "step_reps", 0) and order:
        for c, (med, p10) in step_times(models, order, lambda m: generate(m, args.new_tokens),
                                        args.step_reps).items():
            recs[c].update(step_ms=med * 1e3, step_p10_ms=p10 * 1e3)
    if "eager" not in order:
        order = []
    n = args.new_tokens
    for c in order:
        rec = recs[c]
        full = statistics.median(t_full[c])
        rec.update(generate_s=full, tokens_per_s=n / full,
                   times=[round(t, 5) for t in t_full[c]],
                   speedup=statistics.median(e / t for e, t in zip(t_full["eager"], t_full[c])),
                   graphs_after_first=(counters[c].graphs - rec["graphs_first"])
                   if counters[c] else 0)
        if c == "ember":          # a graph that fell back while timing makes the row a fallback
            import ember
            rec["ember_stats"] = ember.stats()
            fallbacks = rec["ember_stats"]["counts"].get("fallbacks", 0)
            if fallbacks and rec["status"] == "pass":
                rec["status"] = "fallback"
                rec["error"] = f"{fallbacks} graph(s) ran eagerly (ember.stats())"
    return [recs[c] for c in names]


def step_times(models: dict, order: list, generate, reps: int) -> dict:
    """{compiler: (median, 10th percentile) seconds of one replayed decode step}."""
    import torch
    calls = {}
    for c in order:
        model, seen = models[c], []
        inner = model._compiled_call_impl

        def spy(*a, _inner=inner or model._call_impl, _seen=seen, **kw):
            if len(_seen) == 10:           # the 10th decode step (call 0 is the prefill)
                layers = getattr(kw.get("cache", kw.get("past_key_values")), "layers", [])
                counters = [(t, t.clone()) for t in (getattr(x, "cumulative_length", None)
                                                     for x in layers)
                            if isinstance(t, torch.Tensor)]
                _seen.append((a, {k: v.clone() if isinstance(v, torch.Tensor) else v
                                  for k, v in kw.items()}, counters))
            else:
                _seen.append(None)
            return _inner(*a, **kw)
        model._compiled_call_impl = spy
        try:
            generate(model)
        finally:
            model._compiled_call_impl = inner
        calls[c] = seen[10]
    times: dict = {c: [] for c in order}
    clock = step_clock()
    with torch.no_grad():
        for r in range(reps):
            for c in (order if r % 2 == 0 else order[::-1]):
                a, kw, counters = calls[c]
                for t, value in counters:
                    t.copy_(value)
                t0 = clock()
                models[c](*a, **kw)
                times[c].append(clock() - t0)
    return {c: (statistics.median(v), sorted(v)[len(v) // 10]) for c, v in times.items()}


def table(records: list[dict]) -> str:
    heads = ("model", "compiler", "status", "tokens", "first_s", "gen_ms", "tok/s", "speedup",
             "step_ms", "graphs", "+graphs", "error")
    rows = []
    for r in records:
        def f(key, fmt):
            v = r.get(key)
            return "-" if v is None else fmt.format(v)
        rows.append((r["model"], r["compiler"], r.get("status", "?"), r.get("tokens_match", "-"),
                     f("first_generate_s", "{:.1f}"),
                     "-" if r.get("generate_s") is None else f"{r['generate_s'] * 1e3:.0f}",
                     f("tokens_per_s", "{:.1f}"),
                     f("speedup", "{:.2f}x"), f("step_ms", "{:.2f}"), f("graphs_first", "{}"),
                     f("graphs_after_first", "{}"), (r.get("error") or "")[:60]))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append("tokens = greedy tokens equal to eager's; first_s = first generate incl. compile; "
                 "speedup = median paired eager/compiler generate time; step_ms = median of one "
                 "replayed decode step (--step-reps); graphs = graphs compiled in the first "
                 "generate, +graphs = compiled later (recompiles while timing)")
    return "\n".join(lines)


def llm_decode(args) -> int:
    hygiene.apply_threads(args.threads)
    compilers = [c.strip() for c in args.compilers.split(",") if c.strip()]
    out = open(args.json, "w") if args.json else None
    records = []
    try:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            for cache in [c.strip() for c in args.cache.split(",") if c.strip()]:
                import ember
                ember.reset()
                recs = measure(name, cache, compilers, args)
                records += recs
                for r in recs:
                    print(f"{r['model']:16} {r['compiler']:6} {r.get('status')} "
                          f"{r.get('tokens_per_s') or 0:.1f} tok/s {r.get('error') or ''}",
                          flush=True)
                    if out:
                        out.write(json.dumps(r, default=str) + "\n")
                        out.flush()
    finally:
        if out:
            out.close()
    print()
    print(table(records))
    return 0
