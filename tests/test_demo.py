"""``python -m image_classification.demo`` without its optional package."""

from __future__ import annotations

import sys

from image_classification import demo
from image_classification.cli import run


def test_the_demo_without_scikit_learn_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # what `import` finds when the package is not installed
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    monkeypatch.setattr(demo, "DATA_DIR", tmp_path / "digits")
    assert run(demo.main, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the demo needs scikit-learn") and err.count("\n") == 1, err
    assert "pip install .[demo]" in err
    assert list(tmp_path.iterdir()) == []
