"""Exact resumes on a packed set: a run on the shards, stopped mid-epoch by SIGTERM or killed by SIGKILL, then
resumed with ``--resume auto``, ends with bitwise the weights of an uninterrupted run on the folder they were
packed from (the shards train as the folder does), on the pytorch and the dali-cpu backends."""

from __future__ import annotations

import pytest

from helpers import REPO, run_script

from .harness import INTERVAL, ITERATIONS_PER_EPOCH, RUN, TALLY, assert_same_state, explain, load, train, \
    train_here, wait_unlocked

STOPPED = 75
KILLED = -9


@pytest.fixture(scope="module")
def packed(data, tmp_path_factory):
    """The fault tests' dataset, packed into 64KB shards."""
    destination = tmp_path_factory.mktemp("faults_packed") / "data"
    result = run_script(["-m", "image_classification.data.pack", data, destination, "--shard-size", "64KB"],
                        cwd=REPO)
    assert result.returncode == 0, explain(result)
    return destination


def _interrupt_and_resume(packed, workspace, capsys, *args, **fault) -> dict:
    """Stop or kill the run on the shards mid-epoch 1, resume it there; the resumed run's checkpoint."""
    interrupted = train(packed, workspace, *RUN, "-j", "0", *args, **fault)
    assert interrupted.returncode == (KILLED if "kill_at" in fault else STOPPED), explain(interrupted)
    wait_unlocked(workspace)
    saved = load(workspace / "checkpoint.pth.tar")
    assert saved["epoch"] == 1 and 0 < saved["batch"] < ITERATIONS_PER_EPOCH
    if "kill_at" in fault:
        TALLY["kills"] += 1
        TALLY["redone"] += fault["kill_at"] - saved["iterations"]
    else:
        TALLY["stops"] += 1
    resumed = train_here(packed, workspace, *RUN, "-j", "0", *args, capsys=capsys)
    assert resumed.returncode == 0, explain(resumed)
    assert "--resume auto: loading checkpoint" in resumed.stdout
    return load(workspace / "checkpoint.pth.tar")


@pytest.mark.parametrize("fault", [{"kill_at": ITERATIONS_PER_EPOCH + 3},
                                   {"signal_at": f"{ITERATIONS_PER_EPOCH + 3}:SIGTERM"}], ids=["SIGKILL", "SIGTERM"])
def test_a_run_on_shards_interrupted_mid_epoch_resumes_to_the_folder_s_weights(packed, straight, tmp_path, fault,
                                                                               capsys):
    resumed = _interrupt_and_resume(packed, tmp_path / "ws", capsys, **fault)
    assert_same_state(load(straight / "checkpoint.pth.tar"), resumed)


def test_a_dali_run_on_shards_killed_mid_epoch_resumes_to_the_folder_s_weights(data, packed, tmp_path, capsys):
    pytest.importorskip("nvidia.dali")
    dali = ["--data-backend", "dali-cpu"]
    folder = train_here(data, tmp_path / "straight", *RUN, "-j", "1", *dali, capsys=capsys)
    assert folder.returncode == 0, explain(folder)
    resumed = _interrupt_and_resume(packed, tmp_path / "ws", capsys, *dali, kill_at=ITERATIONS_PER_EPOCH + INTERVAL + 1)
    assert_same_state(load(tmp_path / "straight" / "checkpoint.pth.tar"), resumed)


@pytest.mark.slow  # four fresh interpreters; test_pack.py checks every rank's batches against the folder's
def test_two_processes_on_shards_train_the_weights_of_two_on_the_folder(data, packed, tmp_path):
    """multiproc.py, 2 gloo processes: the packed copy deals each rank the folder's samples."""
    from .test_distributed import RUN as TWO_PROCESS_RUN, needs_linux, two_processes

    if needs_linux.args[0]:
        pytest.skip(needs_linux.kwargs["reason"])
    runs = {name: two_processes(root, tmp_path / name / "ws", *TWO_PROCESS_RUN)
            for name, root in (("folder", data), ("shards", packed))}
    for result in runs.values():
        assert result.returncode == 0, explain(result)
    assert_same_state(load(tmp_path / "folder" / "ws" / "checkpoint.pth.tar"),
                      load(tmp_path / "shards" / "ws" / "checkpoint.pth.tar"))


def test_a_resume_onto_a_set_repacked_with_fewer_images_says_so(data, tmp_path, capsys):
    """A run on the shards is cut mid-epoch; its resume on the folder they were packed from says nothing (the same
    images), while one on the set packed again without 4 of them says that the set changed and that the rest
    of the epoch is dealt anew: before, it went on silently."""
    import shutil

    from helpers import train_until_crash, tiny_registered

    from .harness import COMMON

    source = tmp_path / "folder"
    shutil.copytree(data, source)
    packed = tmp_path / "packed"
    pack = ["-m", "image_classification.data.pack", source, packed, "--shard-size", "64KB"]
    assert run_script(pack, cwd=REPO).returncode == 0
    with tiny_registered():
        train_until_crash([*COMMON, "--workspace", str(tmp_path / "ws"), *RUN, "-j", "0", str(packed)],
                          step=ITERATIONS_PER_EPOCH + INTERVAL + 1)
    saved = load(tmp_path / "ws" / "checkpoint.pth.tar")
    assert (saved["epoch"], saved["batch"]) == (1, INTERVAL) and saved["dataset"]["images"] == 24
    shutil.copytree(tmp_path / "ws", tmp_path / "same")
    same = train_here(source, tmp_path / "same", *RUN, "-j", "0", capsys=capsys)
    assert same.returncode == 0 and "dataset changed" not in same.stdout, explain(same)

    for image in sorted((source / "train" / "class_00").iterdir())[:4]:
        image.unlink()
    assert run_script(pack, cwd=REPO).returncode == 0
    fewer = train_here(packed, tmp_path / "ws", *RUN, "-j", "0", capsys=capsys)
    assert fewer.returncode == 0, explain(fewer)
    assert "=> the dataset changed since the checkpoint was written (24 training images then, 20 now): the rest of " \
           "this epoch is dealt from the new set's order" in fewer.stdout
    assert load(tmp_path / "ws" / "checkpoint.pth.tar")["dataset"]["images"] == 20  # the next resume compares with it
