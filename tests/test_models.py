"""Architectures, initialisation and weight loading of image_classification.models."""

from __future__ import annotations

import argparse
import math
import os
import pickle
import urllib.error
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from helpers import hub_load, published_on_ngc
from image_classification.errors import UserError
from image_classification.models import (MODEL_CONFIGS, build_model, default_image_size, list_models,
                                         load_weights)
from image_classification.models import weights as weights_module
from image_classification.models.resnet import Bottleneck, SqueezeExcitation
from image_classification.records import checkpoint as ckpt

# arch: (parameters, state-dict entries) at 1000 classes; the reference toolkit's spec gives resnet50 and
# the two ResNeXt101-32x4d, torchvision the others, our definition resnext101-32x8d-basic.
SIZES = {
    "resnet18": (11_689_512, 122),
    "resnet34": (21_797_672, 218),
    "resnet50": (25_557_032, 320),
    "resnet101": (44_549_160, 626),
    "resnet152": (60_192_808, 932),
    "resnext50-32x4d": (25_028_904, 320),
    "resnext101-32x4d": (44_177_704, 626),
    "resnext101-32x8d": (88_791_336, 626),
    "resnext101-32x8d-basic": (25_521_448, 428),
    "se-resnext101-32x4d": (45_251_128, 758),
}


def randomise_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BN non-trivial statistics and affine parameters, so parity tests see them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.num_batches_tracked.fill_(7)
    return model


def later_nvidia_layout(state: dict) -> dict:
    """Rename layer1..layer4 to the later reference's layers.0..layers.3."""
    out = {}
    for key, value in state.items():
        if key.startswith("layer"):
            stage, rest = key.split(".", 1)
            key = f"layers.{int(stage[5:]) - 1}.{rest}"
        out[key] = value
    return out


@pytest.fixture(scope="module")
def resnet18_state() -> dict:
    return randomise_bn(build_model("resnet18")).state_dict()


@pytest.fixture(scope="module")
def se_resnext() -> nn.Module:
    return build_model("se-resnext101-32x4d")


# ----------------------------------------------------------------------------------------------- registry

def test_list_models_names_every_architecture():
    assert list_models()[:len(SIZES)] == list(SIZES)  # the EfficientNets follow (tests/test_efficientnet.py)
    assert all(default_image_size(a) == 224 for a in SIZES)


META = torch.device("meta")  # shapes without storage: sizes are counted without allocating the weights


@pytest.mark.parametrize("arch", list(SIZES))
def test_every_architecture_builds_with_the_reference_size_and_classifies(arch):
    with META:
        model = build_model(arch).eval()
    assert (sum(p.numel() for p in model.parameters()), len(model.state_dict())) == SIZES[arch]
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32, device=META)).shape == (1, 1000)


def test_resnext_shapes_match_the_reference():
    with META:
        state = build_model("resnext101-32x4d").state_dict()
        basic = build_model("resnext101-32x8d-basic").state_dict()
    assert state["layer1.0.conv2.weight"].shape == (128, 4, 3, 3)
    assert state["layer4.0.conv2.weight"].shape == (1024, 32, 3, 3)
    assert state["fc.weight"].shape == (1000, 2048)
    assert basic["layer1.0.conv1.weight"].shape == (256, 2, 3, 3)  # 64 -> 256 channels in 32 groups
    assert basic["layer4.2.conv2.weight"].shape == (2048, 64, 3, 3)


def test_num_classes_changes_only_the_head():
    with META:
        model = build_model("resnet50", num_classes=10)
    assert model.fc.weight.shape == (10, 2048) and model.fc.bias.shape == (10,)
    assert sum(p.numel() for p in model.parameters()) == SIZES["resnet50"][0] - 990 * 2049


@pytest.mark.parametrize("kwargs, words", [
    ({"arch": "resnet51"}, ["resnet51", "resnet50", "se-resnext101-32x4d"]),
    ({"arch": "resnet50", "model_config": "fancy"}, ["fancy", "classic", "grp-fanout"]),
    ({"arch": "resnet50", "conv_init": "uniform"}, ["uniform", "fan_in"]),
    ({"arch": "resnet50", "dropout": 0.2}, ["dropout", "last_bn_0_init"]),
    ({"arch": "resnet50", "num_classes": 0}, ["positive"]),
])
def test_bad_model_arguments_are_user_errors_naming_the_choices(kwargs, words):
    with pytest.raises(UserError) as info:
        build_model(**kwargs)
    assert all(w in str(info.value) for w in words)


def test_default_image_size_rejects_unknown_arch():
    with pytest.raises(UserError, match="resnet50"):
        default_image_size("vgg16")


# ---------------------------------------------------------------------------- parity with torchvision

TORCHVISION = {
    "resnet18": lambda: torchvision.models.resnet18(weights=None),
    "resnet34": lambda: torchvision.models.resnet34(weights=None),
    "resnet50": lambda: torchvision.models.resnet50(weights=None),
    "resnet101": lambda: torchvision.models.resnet101(weights=None),
    "resnet152": lambda: torchvision.models.resnet152(weights=None),
    "resnext50-32x4d": lambda: torchvision.models.resnext50_32x4d(weights=None),
    "resnext101-32x8d": lambda: torchvision.models.resnext101_32x8d(weights=None),
    "resnext101-32x4d": lambda: torchvision.models.ResNet(
        torchvision.models.resnet.Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4),
}


# the deepest, a few seconds each on 2 cores, run with the slow tests: their blocks are resnet50's and resnext50's
DEEPEST = {"resnet101", "resnet152", "resnext101-32x8d"}


@pytest.mark.parametrize("arch", [pytest.param(arch, marks=[pytest.mark.slow] if arch in DEEPEST else [])
                                  for arch in TORCHVISION])
def test_torchvision_weights_give_identical_logits(arch):
    torch.manual_seed(0)
    reference = randomise_bn(TORCHVISION[arch]()).eval()
    ours = build_model(arch).eval()
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
           {k: v.shape for k, v in reference.state_dict().items()}
    load_weights(ours, reference.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- SE block

def test_se_keys_and_hidden_width(se_resnext):
    state = se_resnext.state_dict()
    for stage, channels in zip(range(1, 5), (256, 512, 1024, 2048)):
        assert state[f"layer{stage}.0.squeeze.squeeze.weight"].shape == (16, channels)
        assert state[f"layer{stage}.0.squeeze.squeeze.bias"].shape == (16,)
        assert state[f"layer{stage}.1.squeeze.expand.weight"].shape == (channels, 16)
        assert state[f"layer{stage}.1.squeeze.expand.bias"].shape == (channels,)
    with META:
        assert "layer1.0.squeeze.squeeze.weight" not in build_model("resnext101-32x4d").state_dict()


def test_se_scales_channels_by_a_sigmoid_gate_of_their_means():
    se = SqueezeExcitation(2, hidden=1)
    with torch.no_grad():
        se.squeeze.weight.copy_(torch.tensor([[1.0, -1.0]]))
        se.squeeze.bias.fill_(0.0)
        se.expand.weight.copy_(torch.tensor([[2.0], [-1.0]]))
        se.expand.bias.copy_(torch.tensor([0.0, 1.0]))
    x = torch.stack([torch.full((2, 2), 3.0), torch.tensor([[0.0, 2.0], [0.0, 2.0]])])[None]  # means 3 and 1
    hidden = max(3.0 - 1.0, 0.0)  # relu(3 - 1)
    gate = torch.sigmoid(torch.tensor([2.0 * hidden, -hidden + 1.0]))
    torch.testing.assert_close(se(x), x * gate[None, :, None, None])


def test_se_bottleneck_adds_the_gated_branch_to_the_residual():
    torch.manual_seed(0)
    block = randomise_bn(Bottleneck(64, 32, expansion=2, groups=4, se=True)).eval()
    captured = {}
    block.bn3.register_forward_hook(lambda module, inputs, output: captured.update(branch=output.clone()))
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        out = block(x)
        branch = captured["branch"]
        gate = torch.sigmoid(block.squeeze.expand(torch.relu(block.squeeze.squeeze(branch.mean((2, 3))))))
    torch.testing.assert_close(out, torch.relu(x + branch * gate[:, :, None, None]))


# ----------------------------------------------------------------------------------------- initialisation

def conv_std(model: nn.Module) -> tuple[float, float, float]:
    w = model.layer4[0].conv1.weight  # (512, 256, 3, 3): fan_in 2304, fan_out 4608
    return w.std().item(), math.sqrt(2 / (256 * 9)), math.sqrt(2 / (512 * 9))


@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_model_config_sets_the_kaiming_fan_mode(config):
    torch.manual_seed(0)
    std, fan_in_std, fan_out_std = conv_std(build_model("resnet18", model_config=config))
    expected = fan_out_std if config in ("classic", "grp-fanout") else fan_in_std
    assert std == pytest.approx(expected, rel=0.02)


def test_conv_init_overrides_the_model_config():
    torch.manual_seed(0)
    std, fan_in_std, _ = conv_std(build_model("resnet18", model_config="classic", conv_init="fan_in"))
    assert std == pytest.approx(fan_in_std, rel=0.02)


@pytest.mark.parametrize("arch, last_bn", [("resnet18", "bn2"), ("resnet50", "bn3")])
def test_last_bn_0_init_zeroes_each_blocks_last_bn_only(arch, last_bn):
    model = build_model(arch, last_bn_0_init=True)
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            zero = name.endswith(last_bn) and name.startswith("layer")
            assert torch.all(m.weight == 0) if zero else torch.all(m.weight == 1), name
            assert torch.all(m.bias == 0), name
    assert torch.all(build_model(arch).layer1[0].get_submodule(last_bn).weight == 1)


# ------------------------------------------------------------------------------------------ loading

def test_native_later_nvidia_and_ddp_layouts_all_load(resnet18_state):
    for state in (resnet18_state, later_nvidia_layout(resnet18_state),
                  {f"module.{k}": v for k, v in later_nvidia_layout(resnet18_state).items()}):
        model = build_model("resnet18")
        load_weights(model, state)
        for key, value in model.state_dict().items():
            assert torch.equal(value, resnet18_state[key]), key


@pytest.mark.parametrize("entry", ["state_dict", "model"])
def test_a_whole_training_checkpoint_file_loads(tmp_path, resnet18_state, entry):
    path = tmp_path / "checkpoint_0003.pth.tar"
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    torch.save({"epoch": 4, "best_prec1": 12.5, entry: {f"module.{k}": v for k, v in resnet18_state.items()},
                "optimizer": optimizer.state_dict()}, path)
    model = build_model("resnet18")
    load_weights(model, str(path))
    assert torch.equal(model.bn1.running_var, resnet18_state["bn1.running_var"])


def test_state_dict_of_a_compiled_or_wrapped_model_loads(resnet18_state):
    model = build_model("resnet18")
    load_weights(model, {f"_orig_mod.{k}": v for k, v in resnet18_state.items()})
    wrapper = nn.Module()
    wrapper.module = build_model("resnet18")  # DataParallel / DistributedDataParallel shape
    load_weights(wrapper, resnet18_state)
    assert torch.equal(wrapper.module.fc.weight, resnet18_state["fc.weight"])


def test_trt_style_4d_se_weights_are_reshaped(se_resnext):
    state = {k: (v[:, :, None, None] if k.endswith(("squeeze.weight", "expand.weight")) else v)
             for k, v in se_resnext.state_dict().items()}
    assert state["layer2.0.squeeze.squeeze.weight"].shape == (16, 512, 1, 1)
    load_weights(se_resnext, later_nvidia_layout(state))


def test_head_mismatch_raises_unless_allowed_and_then_keeps_the_fresh_head(resnet18_state):
    model = build_model("resnet18", num_classes=10)
    with pytest.raises(UserError, match="have 1000 classes and the model 10: pass --num-classes 1000"):
        load_weights(model, resnet18_state)
    fresh_head = model.fc.weight.clone()
    messages = []
    load_weights(model, resnet18_state, allow_head_mismatch=True, log=messages.append)
    assert len(messages) == 1 and "head" in messages[0] and "1000" in messages[0]
    assert torch.equal(model.fc.weight, fresh_head)
    assert torch.equal(model.layer3[1].bn2.running_mean, resnet18_state["layer3.1.bn2.running_mean"])


def test_a_resume_with_another_class_count_is_told_as_a_resume_not_an_evaluation(tmp_path, capsys):
    """--resume auto --num-classes 4 over a 3-class run: the refusal speaks of resuming, what the user did."""
    from helpers import refused
    from image_classification.system.cli import run
    from image_classification.training import main

    run_args = ["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "2", "--prof", "1",
                "--epochs", "2", "--run-epochs", "1", "--workspace", str(tmp_path)]
    assert main(run_args + ["--num-classes", "3"]) == 0
    capsys.readouterr()
    line = refused(run(main, run_args + ["--resume", "auto", "--num-classes", "4"]), capsys)
    assert "have 3 classes and the model 4: pass --num-classes 3 to resume that run as it is" in line
    assert "evaluat" not in line and f"--pretrained-weights '{tmp_path / 'checkpoint.pth.tar'}'" in line


def test_allow_head_mismatch_does_not_hide_other_mismatches(resnet18_state):
    model = build_model("resnet34", num_classes=10)
    with pytest.raises(UserError, match=r"missing keys layer1\.2\.conv1\.weight"):
        load_weights(model, resnet18_state, allow_head_mismatch=True)


def test_missing_and_unexpected_keys_are_named(resnet18_state):
    model = build_model("resnet18")
    before = model.state_dict()["layer1.0.conv1.weight"].clone()
    incomplete = {k: v for k, v in resnet18_state.items() if k != "layer4.1.conv2.weight"}
    with pytest.raises(UserError, match=r"missing keys layer4\.1\.conv2\.weight"):
        load_weights(model, incomplete)
    with pytest.raises(UserError, match=r"unexpected keys extra\.weight"):
        load_weights(model, {**resnet18_state, "extra.weight": torch.zeros(1)})
    assert torch.equal(model.state_dict()["layer1.0.conv1.weight"], before)  # nothing was half-loaded


def test_shape_mismatch_is_named():
    expected = r"shape mismatches layer1\.0\.conv1\.weight \(128, 64, 1, 1\) vs model \(64, 64, 1, 1\)"
    with pytest.raises(UserError, match=expected):
        load_weights(build_model("resnet50"), build_model("resnext50-32x4d").state_dict())


def test_a_state_dict_with_non_tensors_is_rejected():
    with pytest.raises(UserError, match="not a tensor"):
        load_weights(build_model("resnet18"), {"conv1.weight": "oops"})


@pytest.mark.parametrize("content", [b"\x00\x01garbage\xff" * 100, "just some text\n".encode(), b""])
def test_a_file_that_is_not_a_checkpoint_is_a_user_error(tmp_path, content):
    path = tmp_path / "weights.pth"
    path.write_bytes(content)
    with pytest.raises(UserError, match="could not be read as a PyTorch checkpoint"):
        load_weights(build_model("resnet18"), path)


def test_missing_file_and_unsafe_or_non_dict_contents_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist.*NVIDIA's published weights come from the NVIDIA NGC "
                       "catalog, https://catalog.ngc.nvidia.com"):
        ckpt.load_checkpoint_file(tmp_path / "nope.pth")
    torch.save({"args": argparse.Namespace(lr=0.1)}, tmp_path / "pickled.pth")  # refused by weights_only
    with pytest.raises(UserError, match="was refused: it would build argparse.Namespace"):
        ckpt.load_checkpoint_file(tmp_path / "pickled.pth")
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    with pytest.raises(UserError, match="holds a list"):
        ckpt.load_checkpoint_file(tmp_path / "list.pth")


class Payload:
    """What a malicious checkpoint holds: unpickling it would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("protocol,words", [
    (2, "was refused: it would build {system}, which is neither a tensor nor a plain container; checkpoints "
        "are loaded as data only, never as code (a file from a source you trust can be saved again as a plain "
        "state dict)."),
    (4, "could not be read as a PyTorch checkpoint of tensors (Unsupported operand 149); checkpoints are "
        "loaded as data only, never as code."),  # torch's unpickler stops at the protocol-4 frame
], ids=["torch.save", "protocol-4"])
def test_a_malicious_pickle_is_refused_in_one_complete_line_of_ours(tmp_path, recwarn, protocol, words):
    path, marker = tmp_path / "evil.pth.tar", tmp_path / "ran"
    torch.save({"state_dict": Payload(marker)}, path, pickle_protocol=protocol)
    with pytest.raises(UserError) as error:
        ckpt.load_checkpoint_file(path)
    assert str(error.value) == f"'{path}' " + words.format(system=f"{os.system.__module__}.system")
    assert not marker.exists() and not [w for w in recwarn if "pickle protocol" in str(w.message)]


def test_a_refusal_in_torch_2_3s_words_names_the_global_too(tmp_path, monkeypatch):
    """torch 2.3 words the refusal "Unsupported class posix.system" where later versions say "GLOBAL"."""
    path = tmp_path / "evil.pth.tar"
    path.write_bytes(b"stands for a pickle that asks for posix.system")

    def refuse_as_torch_2_3(*args, **kwargs):
        raise pickle.UnpicklingError(
            "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely "
            "succeed, but it can result in arbitrary code execution.Do it only if you get the file from a trusted "
            "source. WeightsUnpickler error: Unsupported class posix.system")

    monkeypatch.setattr(torch, "load", refuse_as_torch_2_3)
    with pytest.raises(UserError, match=r"was refused: it would build posix\.system, which is neither a"):
        ckpt.load_checkpoint_file(path)


def test_torch_load_is_always_safe(tmp_path, resnet18_state, monkeypatch):
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    torch.save(resnet18_state, tmp_path / "w.pth")
    load_weights(build_model("resnet18"), tmp_path / "w.pth")
    assert calls == [{"map_location": "cpu", "weights_only": True}]


# ------------------------------------------------------------------------- layouts, precision, compilers

def test_channels_last_gives_the_same_logits():
    torch.manual_seed(0)
    model = randomise_bn(build_model("resnet50")).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        model = model.to(memory_format=torch.channels_last)
        assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
        actual = model(x.contiguous(memory_format=torch.channels_last))
    scale = expected.abs().max().item()  # random BN statistics make logits of order 100
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale)


def test_bf16_autocast_on_cpu_trains(se_resnext):
    model = build_model("resnext50-32x4d", num_classes=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randn(2, 3, 32, 32))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    logits.float().sum().backward()
    assert model.conv1.weight.grad is not None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(se_resnext.eval()(torch.randn(1, 3, 32, 32))).all()


@pytest.mark.parametrize("arch", ["resnet18", pytest.param("se-resnext101-32x4d", marks=pytest.mark.slow)])
def test_torchscript(arch):
    model = randomise_bn(build_model(arch)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated in newer torch
        scripted = torch.jit.script(model)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))


@pytest.mark.slow
def test_torch_compile():
    model = randomise_bn(build_model("resnet18")).eval()
    compiled = torch.compile(model)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    load_weights(build_model("resnet18"), compiled.state_dict())  # keys carry _orig_mod.


# -------------------------------------------------------------------------------------------- torch.hub

@pytest.mark.parametrize("entry, arch", [("nvidia_resnet50", "resnet50"),
                                         ("nvidia_resnext101_32x4d", "resnext101-32x4d"),
                                         ("nvidia_resneXt", "resnext101-32x4d"),
                                         ("nvidia_se_resnext101_32x4d", "se-resnext101-32x4d")])
def test_hub_entries_build_the_named_models(entry, arch):
    with META:
        model = hub_load(entry, pretrained=False, num_classes=5)
    assert model.fc.out_features == 5
    assert sum(p.numel() for p in model.parameters()) == SIZES[arch][0] - 995 * 2049


def test_hub_pretrained_offline_says_how_to_use_a_local_file(tmp_path, monkeypatch):
    def offline(url, dst, *args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(UserError, match="failed.*pass its path instead"):
        hub_load("nvidia_resnet50")


def test_only_published_architectures_have_pretrained_weights():
    with pytest.raises(UserError, match="resnet50, resnext101-32x4d, se-resnext101-32x4d"):
        weights_module.fetch_pretrained("resnet18")


def test_hub_pretrained_downloads_once_then_loads_the_ngc_file(tmp_path, monkeypatch):
    published = randomise_bn(build_model("resnet50")).state_dict()  # NGC 20.06 files use the layer1.. names
    downloads = published_on_ngc(monkeypatch, tmp_path, published)
    for _ in range(2):
        model = hub_load("nvidia_resnet50", pretrained=True)
        assert torch.equal(model.layer2[0].bn3.running_mean, published["layer2.0.bn3.running_mean"])
    assert downloads == [weights_module.PRETRAINED_URLS["resnet50"]]
    assert (tmp_path / "checkpoints" / "nvidia_resnet50_200821.pth.tar").is_file()
