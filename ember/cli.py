"""The `ember` command: --version, info, bench, cache."""
from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys


def _compiler_info() -> tuple[str, bool]:
    """(g++ version line or 'not found', whether -fopenmp links)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        return "not found", False
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    probe = subprocess.run([cxx, "-fopenmp", "-x", "c++", "-", "-o", "/dev/null"],
                           input="#include <omp.h>\nint main(){return omp_get_max_threads()<0;}\n",
                           capture_output=True, text=True)
    return f"{cxx}: {version}", probe.returncode == 0


def info() -> int:
    import torch

    import ember
    from ember import config

    cxx, openmp = _compiler_info()
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - report absence, whatever the reason
        triton_version = "not installed"
    rows = [
        ("ember", ember.__version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("threads", str(torch.get_num_threads())),
        ("c++ compiler", cxx),
        ("openmp", "yes" if openmp else "no"),
        ("cuda", torch.version.cuda if torch.cuda.is_available() else "not available"),
        ("triton", triton_version),
        ("cache dir", str(config.cache_dir())),
        ("backends", ", ".join(ember.list_backends())),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cache(argv: list[str]) -> int:
    from ember import config

    parser = argparse.ArgumentParser(prog="ember cache")
    parser.add_argument("action", choices=["info", "clear"])
    args = parser.parse_args(argv)
    root = config.cache_dir()
    if args.action == "clear":
        shutil.rmtree(root, ignore_errors=True)
        print(f"cleared {root}")
        return 0
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    size = sum(p.stat().st_size for p in files)
    print(f"{root}: {len(files)} files, {size / 2**20:.1f} MiB")
    return 0


COMMANDS = ("info", "bench", "cache")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="ember", description="ember: a compiler for PyTorch",
        epilog="`python -m ember ...` is the same command. Help for a command: ember bench -h")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("command", nargs="?", choices=COMMANDS)
    # everything after the command is the command's own (so `ember bench seed-resnet18 -h` is
    # bench's help, not this parser's)
    at = next((i for i, a in enumerate(argv) if a in COMMANDS), len(argv))
    args = parser.parse_args(argv[:at + 1])
    rest = argv[at + 1:]
    if args.version:
        from ember import __version__
        print(f"ember {__version__}")
        return 0
    if args.command == "info":
        if rest:
            parser.error(f"ember info takes no arguments (got {' '.join(rest)})")
        return info()
    if args.command == "cache":
        return cache(rest)
    if args.command == "bench":
        from ember.bench.__main__ import main as bench_main
        return bench_main(rest) or 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
