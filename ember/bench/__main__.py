"""`ember bench` command line: model suites (default) and the seed experiments.

    ember bench [--suite ...] [--mode ...] [--compilers eager,ember,torch] [--models REGEX] ...
    ember bench --suite broad [--family timm,hf_decoder] [--shard K/N] ...
    ember bench seed-resnet18 [--steps N] [--no-torch] [--gpt2-steps N]
    ember bench seed-cifar10 [--model resnet50] [--epochs 5] [--samples N]
    ember bench llm-decode [--models llama,gpt2] [--cache dynamic,static] [--new-tokens 32]

`main(argv)` is what `ember.cli` calls for `ember bench ...`. Every command first re-runs itself
in a child process with the timing-hygiene environment (threads, allocator; see hygiene.py)
unless it already has it.
"""
from __future__ import annotations

import argparse
import sys

from . import hygiene

SEEDS = ("seed-resnet18", "seed-cifar10")
COMMANDS = (*SEEDS, "llm-decode")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=hygiene.default_threads(),
                   help="intra-op threads (torch and OpenMP); default: all cores")
    p.add_argument("--allocator", choices=hygiene.ALLOCATORS, default="auto",
                   help="auto: jemalloc > tcmalloc > glibc with MALLOC_MMAP/TRIM thresholds")
    p.add_argument("--backend", default="ember",
                   help="backend for the ember compiler: ember, aot_eager, eager, inductor")
    p.add_argument("--front", choices=("auto", "ember", "torch"), default="auto",
                   help="capture for the ember compiler: ember.compile, torch.compile, or the "
                        "first that works (auto)")
    p.add_argument("--strict", action="store_true",
                   help="set EMBER_STRICT=1 in the benchmark processes (fallbacks raise)")


def parser(command: str | None = None) -> argparse.ArgumentParser:
    if command == "seed-resnet18":
        from .seed import add_resnet18_args
        p = argparse.ArgumentParser(prog="ember bench seed-resnet18",
                                    description="ResNet18 and GPT-2 training loops: eager vs "
                                                "ember.compile vs torch.compile")
        add_resnet18_args(p)
    elif command == "seed-cifar10":
        from .seed import add_cifar10_args
        p = argparse.ArgumentParser(prog="ember bench seed-cifar10",
                                    description="CIFAR-10 training for N epochs: eager vs ember")
        add_cifar10_args(p)
    elif command == "llm-decode":
        from .decode import add_args
        p = argparse.ArgumentParser(prog="ember bench llm-decode",
                                    description="greedy generate() of small HF Llama/GPT-2 "
                                                "configs: tokens/s, eager vs ember vs torch.compile")
        add_args(p)
    else:
        from .suites import SUITES
        p = argparse.ArgumentParser(
            prog="ember bench",
            description="Benchmark ember against eager and torch.compile on model suites. "
                        f"Seed experiments: {', '.join(SEEDS)} (ember bench seed-resnet18 -h).")
        p.add_argument("--suite", default="all", choices=[*SUITES, "all"])
        p.add_argument("--mode", default="infer", choices=("infer", "train", "both"))
        p.add_argument("--compilers", default="eager,ember,torch",
                       help="comma list from eager, ember, torch (eager is always the reference)")
        p.add_argument("--models", default=None, help="regex on model names")
        p.add_argument("--family", default=None,
                       help="comma list of families (broad: tv_cls, tv_seg, timm, hf_encoder, "
                            "hf_decoder, hf_seq2seq, hf_vision_audio, custom)")
        p.add_argument("--shard", default=None, metavar="K/N",
                       help="run every N-th selected model from the K-th (1-based)")
        p.add_argument("--reps", type=int, default=10, help="timed paired repetitions (median)")
        p.add_argument("--warmup", type=int, default=2, help="untimed iterations after the first")
        p.add_argument("--timeout", type=float, default=900.0, help="seconds per model subprocess")
        p.add_argument("--json", default=None, help="write JSON lines here")
        p.add_argument("--plot", default=None, help="write a PNG here (matplotlib)")
        p.add_argument("--from-json", nargs="+", default=None, metavar="FILE",
                       help="run nothing: print the table and summary (and --plot) of saved "
                            "JSON lines, e.g. the shards of one broad run")
        p.add_argument("--quick", action="store_true", help="3 small models, for CI smoke tests")
        p.add_argument("--list", action="store_true", help="list the selected models and exit")
        p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
        p.add_argument("--include-test-models", action="store_true", help=argparse.SUPPRESS)
    _common(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    rest = argv[1:] if command else argv
    args = parser(command).parse_args(rest)
    if command is None:
        from .harness import run_suite_cli
        return run_suite_cli(args, argv)
    rc = hygiene.reexec(argv, args.threads, args.allocator, args.strict)
    if rc is not None:
        return rc
    if command == "llm-decode":
        from .decode import llm_decode
        return llm_decode(args)
    from . import seed
    return seed.seed_resnet18(args) if command == "seed-resnet18" else seed.seed_cifar10(args)


if __name__ == "__main__":
    sys.exit(main())
