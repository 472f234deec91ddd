"""One decision, one place: each question a run asks of its flags and its machine is answered by one function of the
package, and every other module asks that function (read from the source, as tests/test_layers.py reads imports)."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from helpers import REPO

PACKAGE = REPO / "image_classification"


def calls_of(name: str) -> dict[str, int]:
    """Where the package calls ``name`` (a function or a method of that name), by module: the count of calls."""
    found: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    module = str(path.relative_to(REPO))
                    found[module] = found.get(module, 0) + 1
    return found


@pytest.mark.parametrize("question, function, where", [
    ("whether torch sees a CUDA device", "is_available", {"image_classification/system/machine.py"}),
    # launch.py's dry run asks the same function what the run would take (as it asks host.choose)
    ("which data backend a run uses", "resolve_backend",
     {"image_classification/train/plan.py", "image_classification/launch.py"}),
    ("a learning rate scaled to the global batch", "resolve_lr",
     {"image_classification/train/plan.py", "image_classification/launch.py"}),
    ("the precision, device and layout on this machine", "choose",
     {"image_classification/system/runtime.py", "image_classification/launch.py"}),
    ("the loss scale of a precision", "choose_loss_scale", {"image_classification/train/plan.py"}),
])
def test_each_question_is_answered_in_one_place(question, function, where):
    assert set(calls_of(function)) == where, question


def test_whether_a_precision_scales_its_loss_is_one_function():
    """``host.scales_loss``: no module compares an autocast dtype with fp16 itself."""
    pattern = re.compile(r"==\s*torch\.float16|!=\s*torch\.float16|==\s*[\"']float16[\"']")
    offenders = [str(path.relative_to(REPO)) for path in PACKAGE.rglob("*.py")
                 if pattern.search(path.read_text()) and path.name != "host.py"]
    assert offenders == []


def test_every_flag_of_main_py_is_a_field_of_one_group():
    """A new flag is one field in one group: the parser's destinations are exactly the groups' flag fields, each in
    one group."""
    from image_classification.arguments import build_parser
    from image_classification.arguments.data import DataConfig
    from image_classification.arguments.deployed import DeployConfig
    from image_classification.arguments.model import ModelConfig
    from image_classification.arguments.optimisation import OptimConfig
    from image_classification.arguments.precision import PrecisionConfig
    from image_classification.arguments.run import RunSettings

    owners: dict[str, list[str]] = {}
    for group in (DataConfig, ModelConfig, OptimConfig, PrecisionConfig, DeployConfig, RunSettings):
        for item in dataclasses.fields(group):
            if "flags" in item.metadata:
                owners.setdefault(item.name, []).append(group.__name__)
    dests = {action.dest for action in build_parser()._actions if action.dest != "help"}
    assert set(owners) == dests and all(len(groups) == 1 for groups in owners.values())


def test_the_raport_records_the_configuration_itself():
    """What the PARAMETER record holds is the composed configuration, every group's field under its name (the
    values the run settled), not a dictionary assembled beside it."""
    from helpers import run_config

    config = run_config(arch="resnet18", num_classes=7, lr=0.25, batch_size=16, seed=3)
    recorded = config.recorded()
    assert (recorded["arch"], recorded["num_classes"], recorded["lr"], recorded["batch_size"], recorded["seed"]) == \
        ("resnet18", 7, 0.25, 16, 3)
    assert recorded["preprocessing"] == config.preprocessing.to_dict()
    names = {item.name for group in (config.model, config.optim, config.data, config.precision, config.run,
                                     config.deploy) for item in dataclasses.fields(group)}
    assert set(recorded) == names
