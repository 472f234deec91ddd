"""scripts/slow_tests.py: which slow tests a change must pass before it is done (CI's `make test` leaves them out)."""

from __future__ import annotations

from conftest import load_script

slow_tests = load_script("slow_tests")


def test_a_changed_module_selects_the_slow_tests_of_every_test_module_that_imports_it_however_indirectly():
    # deploy/aoti.py is imported by training.py, which tests/test_training.py imports; the GPU report's script by
    # name alone
    selected = slow_tests.covering_tests(["image_classification/deploy/aoti.py"])
    assert {"tests/test_aoti.py", "tests/test_training.py"} <= set(selected)
    assert "tests/test_resize_timing.py" not in selected
    assert slow_tests.covering_tests(["scripts/gpu_report.py"]) == ["tests/test_gpu_report.py"]


def test_a_changed_test_module_or_page_selects_its_own_slow_tests_and_only_modules_with_slow_tests_are_listed():
    assert slow_tests.covering_tests(["tests/test_compile.py"]) == ["tests/test_compile.py"]
    assert "tests/test_readme_commands.py" in slow_tests.covering_tests(["docs/performance.md"])
    assert slow_tests.covering_tests(["tests/test_layers.py"]) == []  # it has none
    every = slow_tests.covering_tests(["image_classification/errors.py"])  # imported by everything
    assert all(slow_tests.has_slow_tests(slow_tests.REPO / path) for path in every) and len(every) >= 10


def test_relative_imports_resolve_to_the_package_s_modules():
    imports = slow_tests.package_imports(slow_tests.REPO / "image_classification/train/loop.py")
    assert {"image_classification.train.engine", "image_classification.records.raport",
            "image_classification.train.validation"} <= imports
