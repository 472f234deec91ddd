"""Every command of the documentation's ``bash`` blocks runs as written, with tiny sizes substituted.

The pages are README.md and docs/*.md, and the per-model READMEs.  The commands run in a scratch folder
that holds what the pages assume: the digits dataset and the checkpoint ``make demo`` leaves (a one-epoch
demo run, cut to a few steps), NGC-named weight files (freshly initialised, in the layout NGC publishes),
a photograph, and for the per-model READMEs a two-step training run of each model in the
workspace its README names.  ImageNet paths point at the digits; batch sizes, epochs, image sizes and
process counts are cut down so that each command takes seconds.  A command that cannot run on one CPU
machine is listed in ``NOT_RUN`` with the reason and where it is covered instead; any other command,
including one added later or on a new page, is run.  The commands run in page order, as a user would type
them (model2onnx.py converts the weights that checkpoint2model.py wrote): README.md and then the pages of
docs/ in one folder, a command that a page repeats from an earlier one (the README's tour) once, where it
first appears; each per-model README in a folder of its own.  README.md's and docs/' commands run in the
default suite, but for the few in ``SLOW`` (a minute or so each, what they run covered there by the test each
names), which run with the slow tests; the per-model READMEs' (ResNeXt-101 and SE-ResNeXt-101 take seconds per step on a CPU) are
marked slow, and the default suite checks that every flag they use is one their scripts accept.  A
``/tmp/`` path of a command is a folder of the scratch folder, so nothing is written outside it.  A
command that reads with DALI (``--data-backend dali-*``, ``--dali-stages``, ``benchmarks/dali_validation.py``)
is skipped, with that reason, where ``nvidia.dali`` does not import; the data set it would have made is still written, for the commands
after it.

A command runs in the test's process (the script or module executed as ``__main__``, as ``python``
does: see helpers.run_script), which spares an interpreter and a torch import per command; those in
``REAL_PROCESS`` run as real processes: the ones that start worker processes (the launcher forked from
the test's process, its workers fresh interpreters: see helpers.run_process), and one smoke run, a fresh
interpreter, that checks a documented command as typed into a shell.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from helpers import REPO, explain, load_script, reuse_exports, run_process, run_script

README = REPO / "README.md"
# the pages whose commands run in one folder, in this order: the README's set-up and tour, then docs/
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
# per-model README -> (architecture, the workspace its commands use, weights file it converts to)
MODEL_READMES = {
    REPO / "resnet50v1.5/README.md": ("resnet50", "rn50"),
    REPO / "resnext101-32x4d/README.md": ("resnext101-32x4d", "rnxt"),
    REPO / "se-resnext101-32x4d/README.md": ("se-resnext101-32x4d", "sernxt"),
}

# pattern (searched in the command) -> why it is not run here
NOT_RUN = {
    r"^make ": "make builds .venv and runs the suite; CI runs `make test` itself",
    r"^\. \.venv/bin/activate$|^source \.venv/bin/activate$": "shell set-up",
    r"^python -m venv ": "environment set-up: `make` does the same and the suite runs in its environment",
    r"^export |^head=\$\(scontrol ": "shell set-up of the SLURM examples",
    r"^srun ": "needs a SLURM cluster",
    r"--nnodes 2": "needs two machines",
    r"^bash \S+\.sh": "the recipes: tests/test_recipes.py runs every one of them",
    r"^until python main\.py --resume auto": "a re-queue loop: tests/faults resumes with --resume auto after kills",
    r"-m pytest -q tests/faults": "the fault suite is part of `make test` already",
    r"scripts/gpu_report\.py": "needs a CUDA device, and --smoke takes minutes: tests/test_gpu_report.py runs --smoke "
                               "(slow) and checks every step's command against its script's parser",
    r"prepare_imagenet\.py": "needs the ImageNet archives: tests/test_prepare_imagenet.py runs it on archives it builds",
    r"benchmarks/startup\.py --make": "writes 1.28 M files and starts main.py four times: tests/test_pack.py runs its "
                                      "parts on a small set",
    r"benchmarks/decode_scale_accuracy\.py": "trains 6 to 16 models: tests/test_benchmarks.py runs it on tiny ones "
                                             "(slow) and checks its replay of the reduced decodes",
    r"benchmarks/peer_timm\.py": "needs timm's train.py from a clone of pytorch-image-models and trains ResNet-50 four "
                                 "times: tests/test_benchmarks.py runs it against stand-ins",
    r"benchmarks/resize_timing\.py": "six full trainings, an hour on 2 cores: tests/test_resize_timing.py runs it on tiny "
                                  "ones (slow)",
    r"hf-timm-resnet50|hf-microsoft-resnet-50": "a Hugging Face download: tests/test_safetensors.py builds both "
                                               "layouts offline and classifies, fine-tunes and reads them",
    r"\.pt2\b|--runtime aoti|--paths .*\baoti\b": "compiles a package, a minute or more on 2 cores even at 32 px: "
                                                "tests/test_aoti.py compiles, runs and validates one (slow)",
}

# pattern (searched in the command) -> where the same behaviour is covered in the default suite: run only with the
# slow tests (`make test-all`), each a quarter to a minute and a half on 2 cores; each reads only what the folder
# holds before the first command (`-m slow` runs it without the commands before it) and writes nothing a later one reads
SLOW = {
    r"benchmarks/infer_throughput\.py": "tests/test_benchmarks.py times every path of it on a tiny model",
    r"^torchrun ": "tests/test_multiproc.py starts torchrun's processes; tests/test_distributed.py trains two",
    r"^python \./multiproc\.py --nproc_per_node 8 \./main\.py": "tests/test_distributed.py trains, validates and "
                                                               "resumes two gloo processes of main.py through it",
    r"multiproc\.py --nproc_per_node 8 \./launch\.py": "tests/test_distributed.py's runs of multiproc.py and "
                                                      "tests/test_launch.py's of launch.py",
    r"^python classify\.py --weights workspace/digits/model_best\.pth\.tar --image data/digits/val/3 --runtime "
    r"onnxruntime --quantize int8": "tests/test_quantization.py classifies in int8 and checks the predictions",
    r"^python main\.py -a resnet18 --evaluate --resume workspace/digits/model_best\.pth\.tar --runtime onnxruntime "
    r"--quantize int8": "tests/test_quantization.py validates the int8 export through the same loop",
    r"--triton-repository models -b 1 --quantize int8": "tests/test_quantization.py writes int8 and FP32 Triton "
                                                        "models and reads their config.pbtxt",
}

SMOKE = r"^python main\.py --evaluate --resume workspace/digits/"
# pattern (searched in the command) -> why it runs in a process of its own rather than in the test's
REAL_PROCESS = {
    r"multiproc\.py|torch\.distributed\.run": "starts worker processes: the launcher and its workers are the point",
    SMOKE: "the smoke run: a command as typed into a shell, in a fresh interpreter",
}

# Flags appended to the training commands: argparse keeps the last value, so these win.  A learning
# rate meant for batches of 256 makes two steps on batches of 4 diverge, which stops a run (exit 3).
TINY_TRAINING = ["--epochs", "1", "--prof", "2", "-b", "4", "--image-size", "32", "-j", "0", "--print-freq", "1",
                 "--lr", "0.001", "--seed", "1"]
TRAINING_SCRIPTS = {"main.py", "quant_main.py", "launch.py"}

# (pattern, replacement) applied to the command text, in order
SUBSTITUTIONS = [
    (r"^OMP_NUM_THREADS=\d+ ", ""),  # the suite runs its commands on one thread already
    (r"<path to imagenet>|<path to your dataset>|(?<![\w/])/imagenet\b|\./tiny-imagenet|\./flowers", "data/digits"),
    (r" \.\.\. ", " "),  # "the other flags as before"
    (r"--num-classes 102\b", "--num-classes 10"),
    (r"--nproc_per_node 8\b", "--nproc_per_node 2"),
    (r"--nproc-per-node 8\b", "--nproc-per-node 2"),
    (r"^torchrun ", "python -m torch.distributed.run "),
    (r" \[--[\w-]+\]", ""),  # an optional flag shown in brackets: the demo's checkpoint has no EMA
    (r"--make-dataset \d+", "--make-dataset 12"),
    (r"(?<![\w./-])/tmp/", "tmp-"),  # the scratch folder stands for /tmp: /tmp/photos is tmp-photos there
    (r"--photos(?! \d)", "--photos 3"),
    (r"--camera(?! \d)", "--camera 4"),  # a batch of -b 4 (each takes seconds to write)
    (r"--camera \d+", "--camera 4"),
    (r"--photos \d+(?! \d)", "--photos 3"),
    (r"--batch-sizes( \d+)+", "--batch-sizes 1"),
    (r"--iterations \d+", "--iterations 2"),
    (r"(export_time\.py .*) --pt2\b", r"\1"),  # the package's compilation: tests/test_aoti.py (slow)
    # FFCV's recipes ramp the crops and peak the learning rate past the one epoch the commands run: a step to the
    # largest crop at epoch 0 (END 0, the first epoch at MAX, within the one epoch) and the peak there
    (r"(--recipe fast-\d+)", r"\1 --progressive-resize 32 64 0 0 --lr-peak-epoch 0"),
]
# extra flags per script (beyond TINY_TRAINING for the training scripts)
SCRIPT_FLAGS = {
    "infer_throughput.py": ["-a", "resnet18", "--image-size", "32", "--iters", "1", "--repeats", "1", "--warmup", "0"],
    "train_throughput.py": ["--image-size", "32", "-b", "2", "--iters", "1", "--repeats", "1",
                            "--warmup", "0"],
    "export_time.py": ["-a", "resnet18", "--image-size", "32", "--repeats", "1"],
    # a camera set (--camera) of 1008x756 photographs, a sixteenth of 12 MP: the commands' paths, at a sixteenth of the
    # writing and decoding
    "benchmark_loader.py": ["-b", "4", "--epochs", "2", "--image-size", "32", "--camera-size", "1008x756"],
    "benchmark_decoders.py": ["--images", "2", "--rounds", "1"],
    "dali_validation.py": ["--image-size", "32", "-b", "4", "--rounds", "1"],
    "inference_benchmark.py": ["--image-size", "32", "--warmup", "0", "--precisions", "FP32", "--batch-sizes", "1",
                               "--iterations", "2"],
}


def readme_commands(text: str) -> list[str]:
    """The shell commands of the ``bash`` blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.split(r"\s+#\s", line)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def not_run_reason(command: str) -> str | None:
    return next((why for pattern, why in NOT_RUN.items() if re.search(pattern, command)), None)


DALI_COMMAND = r"--data-backend dali-|--dali-stages|benchmarks/dali_validation\.py"


def missing_dali(command: str) -> str | None:
    """Why a command that reads with DALI cannot run here (DALI does not import), else None."""
    from image_classification.data import dali_available

    if re.search(DALI_COMMAND, command) and not dali_available():
        return "needs NVIDIA DALI, which cannot be imported here"
    return None


def write_what_later_commands_read(argv: list[str], folder: Path) -> None:
    """For a command skipped for want of DALI: the data set it would have made (``benchmark_loader.py
    --make-dataset``), which the commands after it read."""
    if Path(argv[1]).name == "benchmark_loader.py":
        loader = load_script("benchmark_loader", "benchmarks")
        opts = loader.build_parser().parse_args(argv[2:])
        opts.data = str(folder / opts.data)
        loader.write_data(opts)


def needs_a_process(command: str) -> str | None:
    """None (run it here), "fresh" (the smoke run) or "forked" (a launcher of worker processes)."""
    if re.search(SMOKE, command):
        return "fresh"
    return "forked" if any(re.search(pattern, command) for pattern in REAL_PROCESS) else None


def page_commands(pages: list[Path]) -> list[tuple[Path, str]]:
    """Each command of ``pages`` once, with the page where it first appears: a training command run a second
    time in the same folder would find its workspace taken by the first."""
    first: dict[str, Path] = {}
    for page in pages:
        for command in readme_commands(page.read_text()):
            first.setdefault(command, page)
    return [(page, command) for command, page in first.items()]


PAGE_COMMANDS = page_commands(PAGES)
COMMANDS = [command for _, command in PAGE_COMMANDS]
MODEL_COMMANDS = [(path, command) for path in MODEL_READMES for command in readme_commands(path.read_text())]


def _script(token: str) -> str | None:
    """The repository file a token of the command names (``./main.py``, ``scripts/x.py``), if any."""
    path = REPO / token.removeprefix("./")
    return str(path) if token.endswith(".py") and path.is_file() else None


def tiny(command: str) -> list[str]:
    """The command as run here: substitutions made, scripts resolved to the repository, tiny flags added."""
    for pattern, replacement in SUBSTITUTIONS:
        command = re.sub(pattern, replacement, command)
    argv = shlex.split(command)
    assert argv[0] == "python", f"the docs run their commands with `python`: {command}"
    argv[0] = sys.executable
    scripts = []
    for index, token in enumerate(argv):
        resolved = _script(token)
        if resolved is not None:
            argv[index] = resolved
            scripts.append(Path(resolved).name)
    if any(name in TRAINING_SCRIPTS for name in scripts):
        argv += TINY_TRAINING
        if "--resume" in argv and "--evaluate" not in argv:
            argv += ["--epochs", "2"]  # the workspace's run has finished its one epoch: train one more
    for name in scripts:
        argv += SCRIPT_FLAGS.get(name, [])
    return argv


ENV = {"MPLBACKEND": "Agg"}


def _run(argv: list[str], cwd: Path, capsys=None, process: str | None = None):
    """Run a command in ``cwd``: in this process, or in a process of its own ("fresh" or "forked").  The ONNX
    cache is a folder of ``cwd``'s, so that ``--runtime onnxruntime`` writes nothing outside it."""
    local = {**ENV, "IMAGE_CLASSIFICATION_CACHE": str(cwd / ".cache")}
    if process is None:
        return run_script(argv, capsys, cwd=cwd, env=local)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # keeps the caller's
    env = {**os.environ, "PYTHONPATH": path, **local}
    if process == "forked":
        return run_process(argv, cwd=cwd, env=env)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _check(result) -> None:
    assert result.returncode == 0, explain(result)


def _ngc_weights(folder: Path, arch: str) -> None:
    """Freshly initialised 1000-class weights under the NGC file name the READMEs use."""
    import torch

    from image_classification.models import build_model

    torch.manual_seed(0)
    torch.save(build_model(arch, num_classes=1000).state_dict(), folder / f"nvidia_{arch}_200821.pth.tar")


def _digits_folder(tmp_path_factory, name: str) -> Path:
    """A folder after `make demo` (one epoch, of 4 steps: the commands need its files, not its accuracy):
    data/digits, workspace/digits, and photographs."""
    samples = pytest.importorskip("skimage.data")

    folder = tmp_path_factory.mktemp(name)
    # the default recipe's workspace, which a demo run with flags of its own would leave alone
    _check(_run([sys.executable, "-m", "image_classification.demo", "--epochs", "1", "--prof", "4", "-j", "0",
                 "--workspace", "workspace/digits"], folder))
    for photo in ("photo.jpg", "cat.jpg", "photos/astronaut.jpg"):
        (folder / photo).parent.mkdir(exist_ok=True)
        Image.fromarray(samples.astronaut()).save(folder / photo, quality=90)
    Image.fromarray(samples.chelsea()).save(folder / "photos/cat.jpg", quality=90)
    return folder


@pytest.fixture(autouse=True)
def exports_reused(monkeypatch) -> None:
    """A model the pages export a second time (digits.pth's FP32 graph again for its int8 file, the QAT checkpoint
    again for main.py --runtime onnxruntime) gets the first export's file (helpers.reuse_exports): the same model,
    the same bytes, without the export's seconds."""
    reuse_exports(monkeypatch)


@pytest.fixture(scope="module")
def docs_folder(tmp_path_factory) -> Path:
    """A folder laid out as README.md and docs/ assume after `make demo`."""
    folder = _digits_folder(tmp_path_factory, "readme")
    for arch in ("resnet50", "se-resnext101-32x4d"):
        _ngc_weights(folder, arch)
    return folder  # no file a documented run would not write: the pages' commands read what theirs wrote


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory) -> dict[Path, Path]:
    """Per model README: a folder with NGC-named weights and a two-step run in its workspace."""
    folders = {}
    for readme, (arch, workspace) in MODEL_READMES.items():
        folder = _digits_folder(tmp_path_factory, arch)
        _ngc_weights(folder, arch)
        _check(_run([sys.executable, str(REPO / "main.py"), "--arch", arch, "--workspace", workspace,
                     *TINY_TRAINING, "data/digits"], folder))
        folders[readme] = folder
    return folders


def test_the_pages_have_commands_and_every_skip_is_used():
    assert len(COMMANDS) > 10 and {page.name for page, _ in PAGE_COMMANDS} > {"README.md", "training.md"}
    everywhere = COMMANDS + [command for _, command in MODEL_COMMANDS]
    for pattern in NOT_RUN:
        assert any(re.search(pattern, command) for command in everywhere), f"stale NOT_RUN entry {pattern!r}"
    run = [command for command in COMMANDS if not not_run_reason(command)]
    for pattern in [*REAL_PROCESS, *SLOW]:
        assert any(re.search(pattern, command) for command in run), f"stale entry {pattern!r}"


def test_commands_write_only_under_their_scratch_folder():
    """No command as run names an absolute path but the repository's scripts: what it writes stays in the
    test's temporary folder (a /tmp of the docs is a folder there)."""
    for command in [c for c in COMMANDS + [c for _, c in MODEL_COMMANDS] if not not_run_reason(c)]:
        argv = tiny(command)
        outside = [token for token in argv[1:]
                   if re.search(r"(^|=)/", token) and not token.startswith(f"{REPO}/")]
        assert not outside, f"{command}: {outside}"


def test_a_command_that_reads_with_dali_is_skipped_where_dali_does_not_import(monkeypatch, tmp_path):
    dali = [command for command in COMMANDS if re.search(DALI_COMMAND, command)]
    others = [command for command in COMMANDS if "dali" not in command]
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # `import nvidia.dali` raises ImportError
    assert dali and all(missing_dali(command) for command in dali)
    assert not any(missing_dali(command) for command in others)
    maker = next(command for command in dali if "--make-dataset" in command)
    write_what_later_commands_read(tiny(maker), tmp_path)  # the commands after it read its data set
    assert len(list(tmp_path.glob("tmp-*/train/*/*.jpg"))) == 2 * 12


def missing_torchcodec(command: str) -> str | None:
    """Why a command that times TorchCodec's decoder cannot run here (it is not installed), else None."""
    from image_classification.data.decoders import installed

    if re.search(r"decoder torchcodec", command) and not installed("torchcodec"):
        return "needs TorchCodec, which is not installed here"
    return None


def _short(command: str) -> str:
    return " ".join(command.split()[:3])[:40]


def _id(value) -> str:
    return str(value.relative_to(REPO)) if isinstance(value, Path) else _short(value)


def slow_reason(command: str) -> str | None:
    return next((why for pattern, why in SLOW.items() if re.search(pattern, command)), None)


@pytest.mark.parametrize("page, command", [
    pytest.param(p, c, marks=[pytest.mark.slow] if slow_reason(c) else []) for p, c in PAGE_COMMANDS
    if not not_run_reason(c)], ids=_id)
def test_docs_command_runs(page, command, docs_folder, capsys):
    if reason := missing_dali(command) or missing_torchcodec(command):
        write_what_later_commands_read(tiny(command), docs_folder)
        pytest.skip(reason)
    _check(_run(tiny(command), docs_folder, capsys, process=needs_a_process(command)))


@pytest.mark.slow
@pytest.mark.parametrize("readme, command", [(r, c) for r, c in MODEL_COMMANDS if not not_run_reason(c)],
                         ids=_id)
def test_model_readme_command_runs(readme, command, model_folders, capsys):
    if reason := missing_dali(command):
        pytest.skip(reason)
    _check(_run(tiny(command), model_folders[readme], capsys, process=needs_a_process(command)))


@functools.cache
def _accepted_flags(script: str) -> frozenset[str]:
    """The long and short options a script's -h lists."""
    result = _run([sys.executable, script, "-h"], REPO)  # in this process: the output is captured here
    _check(result)
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", result.stdout))


@pytest.mark.parametrize("readme", [*PAGES, *MODEL_READMES], ids=_id)
def test_readme_flags_are_accepted(readme):
    """Every flag a documented command gives to a script of ours is one that script (or main.py behind it)
    knows."""
    texts = readme_commands(readme.read_text())
    commands = [tiny(c) if c.startswith("python ") else shlex.split(c) for c in texts]
    main_flags = _accepted_flags(str(REPO / "main.py"))
    for command, argv in zip(texts, commands):
        scripts = [token for token in argv if token.startswith(str(REPO)) and token.endswith(".py")]
        if not scripts:
            continue
        known = set().union(*(_accepted_flags(script) for script in scripts))
        if any(Path(script).name in ("launch.py", "multiproc.py", "resize_timing.py") for script in scripts):
            known |= main_flags  # they hand the flags they do not know (resize_timing.py: those after --) to main.py
        unknown = [token.split("=")[0] for token in argv[1:]
                   if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", token) and token.split("=")[0] not in known]
        assert not unknown, f"{readme.relative_to(REPO)}: {command}: unknown {unknown}"
