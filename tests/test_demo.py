"""``python -m image_classification.demo`` without its optional package."""

from __future__ import annotations

import sys
from pathlib import Path

from image_classification import demo
from image_classification.system.cli import run


def test_the_demo_without_scikit_learn_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # what `import` finds when the package is not installed
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    monkeypatch.setattr(demo, "DATA_DIR", tmp_path / "digits")
    assert run(demo.main, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the demo needs scikit-learn") and err.count("\n") == 1, err
    assert "pip install .[demo]" in err
    assert list(tmp_path.iterdir()) == []


def test_a_changed_recipe_trains_in_a_workspace_of_its_own(tmp_path, monkeypatch, capsys):
    """`python -m image_classification.demo --epochs 1` must not replace the default recipe's model, which the
    README's next commands classify and evaluate: flags beyond the recipe get a workspace named by them,
    said at the start and the end; `make demo` (no flags) keeps workspace/digits."""
    default = tmp_path / "workspace" / "digits"
    monkeypatch.setattr(demo, "DATA_DIR", tmp_path / "data")
    monkeypatch.setattr(demo, "WORKSPACE", default)
    (tmp_path / "data" / "val").mkdir(parents=True)  # the digits, written already
    runs = []
    monkeypatch.setattr("image_classification.training.train", lambda args: runs.append(args) or 0)

    def workspace_of(*flags: str) -> Path:
        assert run(demo.main, list(flags)) == 0
        out = capsys.readouterr().out
        workspace = Path(runs[-1].workspace)
        assert out.count(f"{workspace}/") >= 2, out  # at the start and at the end
        return workspace

    assert workspace_of() == default
    one_epoch = workspace_of("--epochs", "1")
    assert one_epoch.parent == default.parent and one_epoch != default
    assert workspace_of("--epochs", "1") == one_epoch and not runs[-1].overwrite  # the same flags, the same place
    assert workspace_of("--epochs", "2") not in (default, one_epoch)
    (one_epoch / "checkpoint.pth.tar").parent.mkdir(parents=True)
    (one_epoch / "checkpoint.pth.tar").write_bytes(b"")
    assert workspace_of("--epochs", "1") == one_epoch and runs[-1].overwrite  # its own earlier run, replaced
    (one_epoch / "checkpoint.pth.tar").unlink()
    (one_epoch / "experiment_raport.json").write_text("DLLL {}\n")  # a run killed before its first checkpoint
    assert workspace_of("--epochs", "1") == one_epoch and runs[-1].overwrite
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "checkpoint.pth.tar").write_bytes(b"")
    assert workspace_of("--epochs", "1", "--workspace", str(mine)) == mine and not runs[-1].overwrite


def test_a_mistyped_flag_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "DATA_DIR", tmp_path / "digits")
    assert run(demo.main, ["--epoch", "1", "--no-such-flag"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_the_command_it_echoes_names_each_flag_once_with_the_value_it_runs_with(tmp_path, monkeypatch, capsys):
    """Extra flags replace the recipe's in the command run and echoed: not `--epochs 6 ... --epochs 3`."""
    monkeypatch.setattr(demo, "DATA_DIR", tmp_path / "data")
    monkeypatch.setattr(demo, "WORKSPACE", tmp_path / "workspace" / "digits")
    (tmp_path / "data" / "val").mkdir(parents=True)
    runs = []
    monkeypatch.setattr("image_classification.training.train", lambda args: runs.append(args) or 0)
    assert run(demo.main, ["--epochs", "3", "-b8", "--lr=0.1", "--workspace", str(tmp_path / "mine")]) == 0
    echoed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("=> python main.py "))
    tokens = echoed.split()
    for flag in ("--epochs", "--workspace"):
        assert tokens.count(flag) == 1, echoed
    assert "--batch-size" not in tokens and "--lr" not in tokens and "--arch" in tokens, echoed
    args = runs[-1]
    assert (args.epochs, args.batch_size, args.lr, args.workspace) == (3, 8, 0.1, str(tmp_path / "mine"))
    assert (args.arch, args.label_smoothing, args.lr_schedule) == ("resnet18", 0.1, "cosine")  # the recipe's rest


def test_the_recipe_is_the_one_its_published_figures_were_measured_with():
    """A plain run's defaults changed (the learning rate, the last BatchNorm); the demo's recipe did not."""
    from image_classification.arguments import parse_args

    args = parse_args([*demo.RECIPE, "data/digits"])
    assert (args.arch, args.lr, args.batch_size, args.epochs, args.last_bn_0_init) == ("resnet18", 0.05, 64, 6, False)
