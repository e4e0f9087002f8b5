"""The seed experiments: the side-by-side training loop and its table/summary at toy sizes (fast),
and end to end through the CLI (slow: each compiles a ResNet18, the torch column with Inductor)."""
import subprocess
import sys

import pytest
import torch

from ember.bench import compilers
from ember.bench.__main__ import parser
from ember.bench.seed import LoopResult, format_loop, run_loop, summary_line


def _tiny_mlp_loop(names, steps=4):
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    batches = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(2)]

    def fresh():
        m = torch.nn.Sequential(*[torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)])
        m.load_state_dict(init.state_dict())
        return m

    def make_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(i):
            x, y = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()
        return step
    return run_loop("mlp", fresh, make_step, steps, names)


def test_loop_runs_columns_side_by_side_and_prints_the_table():
    r = _tiny_mlp_loop(("eager", "ember"), steps=4)
    assert r.names == ["eager", "ember"]
    assert all(len(r.times[n]) == 4 and len(r.losses[n]) == 4 for n in r.names)
    # one graph over all steps: nothing recompiled (an ember.reset() between columns once did)
    assert r.paths["ember"].compiled and r.paths["ember"].graphs == 1
    # same weights, same batches: the same losses (a tiny MLP without BatchNorm does not drift)
    assert r.losses["ember"] == pytest.approx(r.losses["eager"], rel=1e-4)
    assert r.loss_ok("ember") and r.speedup("eager") == 1.0
    assert r.skip == 1 and r.steady("ember") > 0

    text = "\n".join(format_loop(r))
    for row in ("first call (compile)", "steady step (median 3)", "speedup vs eager",
                "loss at step 2", "ember column: ember.compile(backend='ember')  [compiled"):
        assert row in text
    assert "loss diff" not in text and "!" not in text
    line = summary_line([r], ["mlp"])
    assert line.startswith("cold compile (first calls): ember ")
    assert "steady-step speedup vs eager: mlp " in line and "torch.compile" not in line


def _result(first, steady, loss2, names=("eager", "ember", "torch"), steps=12):
    times = {n: [first[n]] + [steady[n]] * (steps - 1) for n in names}
    losses = {n: [2.5, loss2[n]] + [2.0] * (steps - 2) for n in names}
    paths = {"eager": compilers.Path("eager", "eager"),
             "ember": compilers.Path("ember.compile", "ember"),
             "torch": compilers.Path("torch.compile", "inductor")}
    return LoopResult("x", list(names), times, losses, {n: paths[n] for n in names})


def test_three_columns_table_and_one_summary_line():
    resnet = _result({"eager": 0.2, "ember": 4.0, "torch": 36.0},
                     {"eager": 0.16, "ember": 0.16, "torch": 0.2},
                     {"eager": 2.47138, "ember": 2.47129, "torch": 2.47135})
    gpt2 = _result({"eager": 0.5, "ember": 6.0, "torch": 40.0},
                   {"eager": 0.6, "ember": 0.5, "torch": 0.55},
                   {"eager": 7.6838, "ember": 7.6838, "torch": 7.6838})
    text = "\n".join(format_loop(resnet))
    assert "torch column: torch.compile(inductor) (the peer)" in text
    assert "steady step (median 10)" in text            # steps 1-2 left out of 12
    assert "1.00x        1.00x        0.80x" in text
    assert "2.47138      2.47129      2.47135" in text and "!" not in text
    line = summary_line([resnet, gpt2], ["resnet18", "gpt2"])
    assert line == ("cold compile (first calls): ember 10.0 s vs torch.compile 76.0 s (7.6x "
                    "faster); steady-step speedup vs eager: resnet18 1.00x (torch.compile 0.80x), "
                    "gpt2 1.20x (torch.compile 1.09x)")
    assert "\n" not in line

    no_torch = _result({"eager": 0.2, "ember": 4.0}, {"eager": 0.16, "ember": 0.2},
                       {"eager": 2.5, "ember": 2.5}, names=("eager", "ember"))
    assert summary_line([no_torch], ["resnet18"]) == (
        "cold compile (first calls): ember 4.0 s; steady-step speedup vs eager: resnet18 0.80x")


def test_speedup_is_the_median_of_paired_ratios():
    # a burst of load slows both sides of each pair: the pairs say 2x, the plain medians 0.5x
    r = LoopResult("x", ["eager", "ember"],
                   {"eager": [9, 1, 1, 1, 4, 4], "ember": [9, .5, .5, 2, 2, 2]},
                   {"eager": [1.0] * 6, "ember": [1.0] * 6},
                   {"eager": compilers.Path("eager", "eager"),
                    "ember": compilers.Path("ember.compile", "ember")})
    assert r.speedup("ember") == 2.0 and r.steady("eager") / r.steady("ember") == 0.5


def test_a_wrong_step2_loss_is_flagged():
    r = _result({"eager": 0.2, "ember": 4.0, "torch": 30.0}, {"eager": 1, "ember": 1, "torch": 1},
                {"eager": 2.47, "ember": 2.60, "torch": 2.47})
    text = "\n".join(format_loop(r))
    assert "2.60000!" in text and "step-2 loss of ember is more than 0.001" in text


def test_columns_are_checked():
    with pytest.raises(ValueError, match="eager, ember, torch"):
        run_loop("x", lambda: None, lambda m: None, 3, ("eager", "inductor"))
    with pytest.raises(ValueError, match="must include 'eager'"):
        run_loop("x", lambda: None, lambda m: None, 3, ("ember",))


def test_flags_old_and_new():
    p = parser("seed-resnet18")
    assert not p.parse_args([]).no_torch                  # torch column on by default
    assert not p.parse_args(["--torch"]).no_torch         # the old flag still parses
    args = p.parse_args(["--no-torch", "--gpt2-steps", "0"])
    assert args.no_torch and args.gpt2_steps == 0


def _run(*args, timeout=900):
    proc = subprocess.run([sys.executable, "-m", "ember.bench", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_seed_resnet18_prints_both_tables_and_the_summary():
    out = _run("seed-resnet18", "--steps", "3", "--batch", "4", "--size", "32", "--gpt2-steps", "3",
               "--gpt2-seq", "32", "--gpt2-embd", "64")
    assert "allocator" in out and "threads" in out
    assert "torch column: torch.compile(inductor)" in out and "GPT-2 training loop" in out
    for row in ("first call (compile)", "steady step (median", "speedup vs eager (paired)",
                "loss at step 2   "):          # the rows, not the drift note's words
        assert out.count("   " + row) == 2, row
    assert "loss diff" not in out
    assert out.count("[compiled; graphs=1]") == 2          # ember: one graph each, no recompile
    last = out.strip().splitlines()[-2]
    assert last.startswith("cold compile (first calls): ember ") and "x faster" in last
    assert "resnet18 " in last and "gpt2 " in last


@pytest.mark.slow
def test_seed_cifar10_fakedata(tmp_path):
    png = tmp_path / "epochs.png"
    out = _run("seed-cifar10", "--model", "resnet18", "--epochs", "1", "--samples", "64",
               "--batch", "32", "--root", str(tmp_path / "none"), "--plot", str(png))
    assert "FakeData" in out and "epoch" in out and png.exists()
