"""EMBER_DEBUG_DIR: one folder per compiled frame, every stage's file once, in the order the
stages ran (ember/debug.py)."""
import torch

import ember


def _stages(folder):
    return [p.stem.split("_", 1)[1] for p in sorted(folder.iterdir())]


def test_a_graph_break_gives_each_frame_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))   # codegen runs: no warm cache

    def f(x):
        y = x.sin()
        print("break")
        return y.cos() + 1

    x = torch.randn(8)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f)(x), f(x))
    # the frame and its resume (numbers run on across the process: other tests dumped before)
    folders = sorted((tmp_path / "debug").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert len(folders) == 2 and all(p.name.startswith("graph_") for p in folders)
    for folder in folders:
        assert _stages(folder) == ["capture", "aot_forward", "lower", "schedule", "kernels",
                                   "wrapper", "guards"]
        guards = (folder / "07_guards.py").read_text()
        assert guards.startswith("# after guards: the cache entry's ") and "def " in guards
    assert "sin" in (folders[0] / "01_capture.py").read_text()
    assert "cos" in (folders[1] / "01_capture.py").read_text()


def test_the_backward_joins_its_forwards_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    w = torch.randn(4, 4, requires_grad=True)
    g = ember.compile(lambda x: (x @ w).tanh().sum())
    g(torch.randn(3, 4))
    (folder,) = (tmp_path / "debug").iterdir()
    before = _stages(folder)
    assert "aot_backward" in before and not any(s.startswith("backward_") for s in before)
    g(torch.randn(3, 4)).backward()                     # the backward compiles now
    after = _stages(folder)
    assert after[:len(before)] == before
    assert after[len(before):] == ["backward_lower", "backward_schedule", "backward_kernels",
                                   "backward_wrapper"]
    cpp = sorted(folder.glob("*_backward_kernels.cpp"))[0].read_text()
    assert cpp.startswith("// after kernels (backward): ")
