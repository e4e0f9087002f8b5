"""The `ember` command: `python -m ember` is the console script (`ember.cli:main`)."""
import os
import subprocess
import sys

import pytest

import ember
from ember import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_python_m_ember_version():
    proc = subprocess.run([sys.executable, "-m", "ember", "--version"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ember {ember.__version__}"


def test_command_help_is_the_commands_own(capsys):
    # `-h` after the command belongs to the command, not to the top-level parser
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "seed-resnet18", "-h"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ember bench seed-resnet18") and "--no-torch" in out


def test_bad_command_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "'info', 'bench', 'cache'" in err
