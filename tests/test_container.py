"""The Dockerfile (read, not built), .dockerignore and scripts/container_requirements.py."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers import REPO, load_script

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            pairs.append((keyword.upper(), arguments.strip()))
    return pairs


def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def docker_ignores(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the context) out, by Docker's rules: patterns
    from the context root, ``*`` within one name, ``**`` across folders, a folder taking its contents."""
    def regex(pattern: str) -> str:
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/"))
        table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return "".join(table.get(part, re.escape(part)) for part in parts)

    names = path.split("/")
    prefixes = ["/".join(names[:i]) for i in range(1, len(names) + 1)]
    return any(re.fullmatch(regex(p), prefix) for p in ignore_patterns() for prefix in prefixes)


def test_the_base_image_is_a_recent_ngc_pytorch_image():
    steps = instructions()
    assert steps[0][0] == "ARG" and steps[1] == ("FROM", "${FROM_IMAGE_NAME}")
    name, _, default = steps[0][1].partition("=")
    assert name == "FROM_IMAGE_NAME"
    match = re.fullmatch(r"nvcr\.io/nvidia/pytorch:(\d\d)\.(\d\d)-py3", default)
    assert match and int(match.group(1)) >= 25, default  # 25.03 and later carry the pip constraints file
    assert ("WORKDIR", "/workspace/rn50") in steps


def test_every_copied_path_exists_and_reaches_the_build():
    copies = [shlex.split(args) for keyword, args in instructions() if keyword in ("COPY", "ADD")]
    assert copies
    for *sources, _destination in copies:
        assert not any(s.startswith("--") for s in sources), "flags would need parsing here"
        for source in sources:
            assert (REPO / source).exists(), source
            assert source == "." or not docker_ignores(source), source


def test_torch_is_not_reinstalled():
    runs = [args for keyword, args in instructions() if keyword == "RUN"]
    assert any("container_requirements.py requirements.txt" in run for run in runs)
    assert not any(re.search(r"pip install[^;&]*-r\s+\S*requirements\.txt", run) for run in runs)
    package = [run for run in runs if run.endswith("-e .")]
    assert len(package) == 1 and "--no-deps" in package[0]  # the package itself adds no dependency


def test_dockerignore_keeps_out_runs_data_and_environments():
    for path in ("workspace", "workspace/rn50/checkpoint.pth.tar", "data/train/a.JPEG", ".venv/bin/python",
                 ".venv-pins/torch-2.3-tv-0.18-py3.11/bin/python",
                 "model_best.pth.tar", "results/rn50/model_best.pth.tar", "image_classification.egg-info"):
        assert docker_ignores(path), path
    for path in ("image_classification/data/folder.py", "configs.yml", "image_classification/configs.yml",
                 "requirements.txt", "scripts/recipe_args.sh", "resnet50v1.5/training/AMP"):
        assert not docker_ignores(path), path
    assert not any(p.startswith("!") for p in ignore_patterns())  # the check above does not model these


# ------------------------------------------------------------------------------------------------
# scripts/container_requirements.py
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def container_requirements():
    return load_script("container_requirements")


def test_only_what_the_image_lacks_is_installed(container_requirements):
    lines = (REPO / "requirements.txt").read_text().splitlines()
    # an NGC image of CUDA 13: its own torch, torchvision, numpy, Pillow and DALI builds
    ngc = {"torch", "torchvision", "numpy", "pillow", "pyyaml", "nvidia-dali-cuda130", "matplotlib",
           "tensorboard"}
    missing = container_requirements.missing_requirements(lines, ngc)
    names = {container_requirements.canonical(re.match(r"[\w.-]+", line).group()) for line in missing}
    assert names == {"tqdm", "nvidia-ml-py", "onnx", "onnxscript", "onnxruntime", "scikit-learn", "safetensors"}
    assert "onnx==1.23.2" in missing  # as pinned
    assert container_requirements.missing_requirements(lines, set()) == \
        [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_container_requirements_here(container_requirements, tmp_path, capsys):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\ntorch==2.14.1\nno-such-package-anywhere==1.0  # ours\n\n")
    assert container_requirements.main([str(requirements)]) == 0
    assert capsys.readouterr().out == "no-such-package-anywhere==1.0\n"  # torch is installed here
    with pytest.raises(SystemExit) as exit_:
        container_requirements.main([str(tmp_path / "missing.txt")])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error: cannot read")
