"""The EfficientNet family of image_classification.models: sizes, the reference's logits, options, weights.

The fixture ``efficientnet_reference.npz`` holds, for efficientnet-b0, -b4, -widese-b0 and -widese-b4, the
state-dict keys of NVIDIA's own model code (in order, with their shapes) and its logits for one input.  It was
made outside this repository from NVIDIA/DeepLearningExamples at commit 729963dd47e7c8bd462ad10bfac7a7b0b604e6dd,
PyTorch/Classification/ConvNets/image_classification/models/efficientnet.py (``architectures[name]``, its
constructor called with the row's parameters and ``num_classes=10``; its common.py and model.py beside it, no
pytorch_quantization installed), in eval mode on the CPU in float32 with torch 2.14.1: every tensor of the
state dict set by :func:`formula` from its name and shape, the input (2 images of 3 x 64 x 64) by :func:`image`.
Arrays: ``{arch}/names`` (the key names, UTF-8, one a line), ``{arch}/shapes`` (int32, one row of four a key,
padded with zeros; a scalar's row is all zeros) and ``{arch}/logits`` (float32, 2 x 10).
"""

from __future__ import annotations

import math
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import hub_load, published_on_ngc
from image_classification.errors import UserError
from image_classification.models import build_model, default_image_size, list_models, load_weights
from image_classification.models import weights as weights_module
from image_classification.models.archs import EFFICIENTNETS, cpu_trains_faster_channels_last, efficientnet_layout
from image_classification.models.efficientnet import MBConv

FIXTURE = Path(__file__).with_name("efficientnet_reference.npz")
MASK32 = 0xFFFFFFFF
META = torch.device("meta")

# arch: (parameters, state-dict entries) at 1000 classes, as the reference's model code builds them
SIZES = {
    "efficientnet-b0": (5_288_548, 360),
    "efficientnet-b1": (7_794_184, 508),
    "efficientnet-b2": (9_109_994, 508),
    "efficientnet-b3": (12_233_232, 574),
    "efficientnet-b4": (19_341_616, 706),
    "efficientnet-b5": (30_389_784, 854),
    "efficientnet-b6": (43_040_704, 986),
    "efficientnet-b7": (66_347_960, 1200),
    "efficientnet-widese-b0": (8_423_848, 360),
    "efficientnet-widese-b1": (13_336_204, 508),
    "efficientnet-widese-b2": (15_678_504, 508),
    "efficientnet-widese-b3": (21_530_032, 574),
    "efficientnet-widese-b4": (34_927_246, 706),
    "efficientnet-widese-b5": (56_146_944, 854),
    "efficientnet-widese-b6": (80_444_154, 986),
    "efficientnet-widese-b7": (125_844_160, 1200),
}
IMAGE_SIZES = {"b0": 224, "b1": 240, "b2": 260, "b3": 300, "b4": 380, "b5": 456, "b6": 528, "b7": 600}
FIXTURE_ARCHS = ["efficientnet-b0", "efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4"]


# ------------------------------------------------------------------------------------ the fixture's formula

def times(x: torch.Tensor, factor: int) -> torch.Tensor:
    """``x * factor`` mod 2^32 for 32-bit ``x`` and ``factor``, in int64 without overflow (16 bits at a time)."""
    low = x * (factor & 0xFFFF)
    high = ((x * (factor >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def mixed(count: int, seed: int) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser of ``(index + seed) mod 2^32`` for each index, over 2^32: [0, 1), float64."""
    x = (torch.arange(count, dtype=torch.int64) + seed) & MASK32
    x = times(x ^ (x >> 16), 0x85EBCA6B)
    x = times(x ^ (x >> 13), 0xC2B2AE35)
    return (x ^ (x >> 16)).to(torch.float64) / 2.0**32


def image(shape: tuple[int, ...]) -> torch.Tensor:
    """The input: ``(2 * mixed - 1) * sqrt(3)`` seeded by crc32 of ``input`` (uniform, unit variance)."""
    return ((2 * mixed(math.prod(shape), zlib.crc32(b"input")) - 1) * math.sqrt(3)).reshape(shape).float()


def formula(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor's value from its name and shape, with ``u = 2 * mixed - 1`` seeded by the name's crc32 (uniform
    in [-1, 1)): BN running variances 0.4 (1 + u / 2), running means and biases u / 10, BN weights 1 + u / 4 (times
    0.3 in the ``proj`` of every block but a stage's first, so that residual sums stay in range), conv and linear
    weights u sqrt(3 / fan_in) (variance 1 / fan_in), ``num_batches_tracked`` the crc32 mod 1000."""
    seed = zlib.crc32(name.encode())
    if name.endswith("num_batches_tracked"):
        return torch.tensor(seed % 1000, dtype=torch.int64)
    u = 2 * mixed(math.prod(shape), seed) - 1
    if name.endswith("running_var"):
        value = 0.4 * (1 + 0.5 * u)
    elif name.endswith(("running_mean", "bias")):
        value = 0.1 * u
    elif len(shape) == 1:
        value = (0.3 if ".proj." in name and ".block0." not in name else 1) * (1 + 0.25 * u)
    else:
        value = u * math.sqrt(3 / math.prod(shape[1:]))
    return value.reshape(shape).float()


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[list[tuple[str, tuple[int, ...]]], torch.Tensor]]:
    """arch: (the reference's state-dict keys with their shapes, in order; its logits)."""
    arrays = np.load(FIXTURE)
    out = {}
    for arch in FIXTURE_ARCHS:
        names = bytes(arrays[f"{arch}/names"]).decode().split("\n")
        shapes = [tuple(int(d) for d in row if d) for row in arrays[f"{arch}/shapes"]]
        out[arch] = (list(zip(names, shapes)), torch.from_numpy(arrays[f"{arch}/logits"]))
    return out


def fresh(arch: str, num_classes: int = 10) -> nn.Module:
    """``arch`` with uninitialised weights (faster to build: every tensor is loaded next)."""
    with META:
        model = build_model(arch, num_classes=num_classes)
    return model.to_empty(device="cpu")


def reference_state(keys: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    return {name: formula(name, shape) for name, shape in keys}


def ngc_layout(state: dict) -> dict:
    """The names NGC's 20.12 EfficientNet files may use: ``module.layer1..`` for ``layers.0..``, and TensorRT's 4-D
    squeeze-and-excitation weights."""
    out = {}
    for key, value in state.items():
        if key.startswith("layers."):
            _, stage, rest = key.split(".", 2)
            key = f"layer{int(stage) + 1}.{rest}"
        if key.endswith(("se.squeeze.weight", "se.expand.weight")):
            value = value[:, :, None, None]
        out[f"module.{key}"] = value
    return out


# ------------------------------------------------------------------------------------------------ registry

def test_list_models_names_both_families_and_each_efficientnets_image_size():
    names = list_models()
    assert names[:10] == [n for n in names if not n.startswith("efficientnet")]
    assert names[10:] == list(SIZES)
    for arch in SIZES:
        assert default_image_size(arch) == IMAGE_SIZES[arch[-2:]]


@pytest.mark.parametrize("arch", list(SIZES))
def test_every_efficientnet_builds_with_the_reference_size(arch):
    with META:
        model = build_model(arch)
    assert (sum(p.numel() for p in model.parameters()), len(model.state_dict())) == SIZES[arch]


def test_b4_scales_b0_as_the_reference_does():
    stem, stages, head = efficientnet_layout("efficientnet-b4")
    assert (stem, head) == (48, 1792)
    assert [stage[2] for stage in stages] == [2, 4, 4, 6, 6, 8, 2]
    assert [stage[4] for stage in stages] == [24, 32, 56, 112, 160, 272, 448]
    assert [stage[:2] for stage in stages] == [(3, 1), (3, 2), (5, 2), (3, 2), (5, 1), (5, 2), (3, 1)]
    assert efficientnet_layout("efficientnet-b0") == (32, [(3, 1, 1, 1, 16), (3, 2, 2, 6, 24), (5, 2, 2, 6, 40),
                                                           (3, 2, 3, 6, 80), (5, 1, 3, 6, 112), (5, 2, 4, 6, 192),
                                                           (3, 1, 1, 6, 320)], 1280)


def test_squeeze_excitation_squeezes_a_quarter_of_the_inputs_or_for_widese_of_the_hidden_channels():
    with META:
        plain, wide = build_model("efficientnet-b0").state_dict(), build_model("efficientnet-widese-b0").state_dict()
    assert plain["layers.1.block0.se.squeeze.weight"].shape == (4, 96)  # 16 inputs, 96 hidden
    assert wide["layers.1.block0.se.squeeze.weight"].shape == (24, 96)
    assert plain["layers.6.block0.se.expand.weight"].shape == (1152, 48)  # 192 inputs, 1152 hidden
    assert wide["layers.6.block0.se.expand.weight"].shape == (1152, 288)
    assert "layers.0.block0.expand.conv.weight" not in plain and "layers.1.block0.expand.conv.weight" in plain


# --------------------------------------------------------------------------------- the reference's logits

@pytest.mark.parametrize("arch", [pytest.param(arch, marks=[pytest.mark.slow] if arch.endswith("b4") else [])
                                  for arch in FIXTURE_ARCHS])  # b4's: a few seconds each on 2 cores
def test_the_reference_weights_give_the_reference_logits(arch, reference):
    keys, logits = reference[arch]
    model = fresh(arch).eval()
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == keys
    load_weights(model, reference_state(keys))
    with torch.no_grad():
        ours = model(image((2, 3, 64, 64)))
    scale = logits.abs().max().item()
    torch.testing.assert_close(ours, logits, rtol=1e-4, atol=1e-4 * scale)
    assert (logits[0] - logits[1]).abs().max() > 0.01 * scale  # the two images are told apart


def test_ngcs_names_a_wrapper_and_a_training_checkpoint_load_the_same_weights(reference):
    keys, _ = reference["efficientnet-b0"]
    state = reference_state(keys)
    for source in (ngc_layout(state), {"state_dict": ngc_layout(state), "epoch": 3},
                   {f"_orig_mod.{k}": v for k, v in state.items()}):
        model = fresh("efficientnet-b0")
        load_weights(model, source)
        for key, value in model.state_dict().items():
            assert torch.equal(value, state[key]), key


# ------------------------------------------------------------------------------------------------- weights

@pytest.fixture(scope="module")
def b0_weights(reference) -> dict:
    """efficientnet-b0's weights at 10 classes, by the formula."""
    return reference_state(reference["efficientnet-b0"][0])


@pytest.mark.parametrize("weights, model, words", [
    ("efficientnet-b4", "efficientnet-b0",
     "are efficientnet-b4's, not efficientnet-b0's: pass --arch efficientnet-b4."),
    ("efficientnet-widese-b0", "efficientnet-b0",
     "are efficientnet-widese-b0's, not efficientnet-b0's: pass --arch efficientnet-widese-b0."),
    ("efficientnet-b0", "resnet18", "are efficientnet-b0's, not a ResNet's: pass --arch efficientnet-b0."),
    ("resnet18", "efficientnet-b0", "are a ResNet's (conv1, layer1..layer4, fc), not an EfficientNet's: pass the "
                                    "--arch they were trained as."),
])
def test_weights_of_another_architecture_are_refused_naming_it(reference, weights, model, words):
    if weights in reference:
        state = ngc_layout(reference_state(reference[weights][0]))
    else:
        state = build_model(weights, num_classes=10).state_dict()
    target = build_model(model, num_classes=10)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(UserError) as error:
        load_weights(target, state, allow_head_mismatch=True)
    assert str(error.value) == f"The weights in the given state dict {words}"
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())  # nothing was half-loaded


def test_a_fine_tune_replaces_the_classifier_only_and_evaluation_asks_for_the_class_count(b0_weights):
    model = build_model("efficientnet-b0", num_classes=3)
    with pytest.raises(UserError, match="have 10 classes and the model 3: pass --num-classes 10"):
        load_weights(model, b0_weights)
    fresh, messages = model.classifier.fc.weight.clone(), []
    load_weights(model, ngc_layout(b0_weights), allow_head_mismatch=True, log=messages.append)
    assert messages == ["Replaced the classifier head: the weights have 10 classes, the model 3; classifier.fc "
                        "starts from its fresh initialisation."]
    assert torch.equal(model.classifier.fc.weight, fresh)
    assert torch.equal(model.layers[3][1].se.expand.weight, b0_weights["layers.3.block1.se.expand.weight"])
    assert weights_module.recorded_num_classes(ngc_layout(b0_weights)) == 10


def test_a_training_checkpoints_weights_stay_in_the_efficientnet_layout(b0_weights):
    extracted = weights_module.extract_state_dict({"state_dict": {f"module.{k}": v for k, v in b0_weights.items()}})
    assert list(extracted) == list(b0_weights)
    assert list(weights_module.extract_state_dict(ngc_layout(b0_weights))) == list(b0_weights)


# ------------------------------------------------------------------------------------------------- options

def test_each_rows_dropout_and_stochastic_depth_and_the_reference_batchnorm():
    with META:
        b0, b4 = build_model("efficientnet-b0"), build_model("efficientnet-b4")
    assert (b0.classifier.dropout.p, b4.classifier.dropout.p) == (0.2, 0.4)
    assert {block.survival for stage in b0.layers for block in stage} == {1.0}
    blocks = [block for stage in b4.layers for block in stage]
    assert [block.survival for block in blocks] == [1.0 - (1.0 - 0.8) * i / 32 for i in range(32)]  # its sums
    norms = {(m.momentum, m.eps) for m in b4.modules() if isinstance(m, nn.BatchNorm2d)}
    assert norms == {(0.01, 1e-3)}


def test_the_options_reach_the_model():
    torch.manual_seed(0)
    model = build_model("efficientnet-b0", dropout=0.3, survival_prob=0.5, bn_momentum=0.1, bn_epsilon=1e-5,
                        conv_init="fan_out")
    assert model.classifier.dropout.p == 0.3
    assert [block.survival for stage in model.layers for block in stage][-1] == 1.0 - (1.0 - 0.5) * 15 / 16
    assert {(m.momentum, m.eps) for m in model.modules() if isinstance(m, nn.BatchNorm2d)} == {(0.1, 1e-5)}
    weight = model.features.conv.weight  # 1x1, 320 -> 1280: fan_in 320, fan_out 1280
    assert weight.std().item() == pytest.approx(math.sqrt(2 / 1280), rel=0.02)
    assert build_model("efficientnet-b0").features.conv.weight.std().item() == pytest.approx(math.sqrt(2 / 320),
                                                                                            rel=0.02)


@pytest.mark.parametrize("options, words", [
    ({"last_bn_0_init": True}, "last_bn_0_init does not apply to efficientnet-b0 (an EfficientNet), whose options "
                               "are conv_init, bn_momentum, bn_epsilon, dropout, survival_prob; leave it out."),
    ({"model_config": "classic"}, "model_config does not apply to efficientnet-b0"),
    ({"dropout": 1.0}, "dropout must be from 0 up to (not including) 1, got 1.0."),
    ({"survival_prob": 0.0}, "survival_prob must be above 0 and at most 1, got 0.0."),
    ({"bn_momentum": 1.5}, "bn_momentum must be from 0 to 1"),
    ({"bn_epsilon": 0.0}, "bn_epsilon must be a positive number"),
    ({"conv_init": "uniform"}, "Unknown conv_init 'uniform'"),
])
def test_options_out_of_range_or_of_the_other_family_are_refused(options, words):
    with pytest.raises(UserError) as error:
        build_model("efficientnet-b0", **options)
    assert words in str(error.value)


def test_an_option_of_the_other_family_that_asks_nothing_passes():
    with META:
        build_model("efficientnet-b0", last_bn_0_init=False, model_config=None)
    with pytest.raises(UserError, match="dropout and survival_prob do not apply to resnet18 .*; leave them out"):
        build_model("resnet18", dropout=0.2, survival_prob=0.8)


# ------------------------------------------------------------------------------------------ stochastic depth

def test_stochastic_depth_drops_the_branch_of_whole_samples_and_scales_the_kept_ones():
    torch.manual_seed(0)
    block = MBConv(8, 8, 3, 1, 6, 2, survival=0.5, norm=nn.BatchNorm2d)
    block.train()
    for module in block.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eval()  # the branch the same in both modes; only the residual's mask differs
    captured = {}
    block.proj.register_forward_hook(lambda module, inputs, output: captured.update(branch=output))
    x = torch.randn(64, 8, 5, 5)
    with torch.no_grad():
        added = block(x) - x
        branch = captured["branch"]
        kept = [torch.allclose(added[i], 2 * branch[i], atol=1e-6) for i in range(64)]
        dropped = [bool((added[i] == 0).all()) for i in range(64)]
        assert all(k != d for k, d in zip(kept, dropped)) and 10 < sum(kept) < 54  # per sample, about half
        torch.testing.assert_close(block.eval()(x), x + branch)  # evaluation keeps every branch, unscaled


# -------------------------------------------------------------------------- layouts, precision, compilers

@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_a_training_step_runs_in_channels_last_and_under_cpu_autocast(dtype):
    torch.manual_seed(0)
    model = build_model("efficientnet-b0", num_classes=4, survival_prob=0.8).to(memory_format=torch.channels_last)
    # 64 px: at 32 px the last stages see 1 x 1 maps, and BatchNorm over so few values overflows fp16 backwards
    images = torch.randn(4, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(images)
    assert logits.dtype == (dtype or torch.float32) and torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits.float(), torch.tensor([0, 3, 1, 2])).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.stem.conv.weight.grad.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_gives_the_same_logits(reference):
    model = fresh("efficientnet-b0").eval()
    load_weights(model, reference_state(reference["efficientnet-b0"][0]))
    x = image((2, 3, 64, 64))
    with torch.no_grad():
        expected = model(x)
        actual = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_torchscript_gives_the_same_logits(reference):
    model = fresh("efficientnet-b0").eval()
    load_weights(model, reference_state(reference["efficientnet-b0"][0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated in newer torch
        scripted = torch.jit.script(model)
    x = image((1, 3, 32, 32))
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))


@pytest.mark.slow
def test_torch_compile_gives_the_same_logits(reference):
    model = fresh("efficientnet-b0").eval()
    load_weights(model, reference_state(reference["efficientnet-b0"][0]))
    compiled = torch.compile(model)
    x = image((2, 3, 64, 64))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    load_weights(build_model("efficientnet-b0", num_classes=10), compiled.state_dict())  # keys carry _orig_mod.


# ---------------------------------------------------------------------------------------- CPU layout rule

def test_the_cpu_layout_rule_answers_for_every_efficientnet():
    assert all(cpu_trains_faster_channels_last(arch) for arch in EFFICIENTNETS)  # docs/performance.md


# -------------------------------------------------------------------------------------------- torch.hub

@pytest.mark.parametrize("entry, arch", [("nvidia_efficientnet_b0", "efficientnet-b0"),
                                         ("nvidia_efficientnet_b4", "efficientnet-b4"),
                                         ("nvidia_efficientnet_widese_b0", "efficientnet-widese-b0"),
                                         ("nvidia_efficientnet_widese_b4", "efficientnet-widese-b4")])
def test_hub_entries_build_the_named_models(entry, arch):
    with META:
        model = hub_load(entry, pretrained=False, num_classes=5)
    head = model.classifier.fc.in_features
    assert model.classifier.fc.out_features == 5
    assert sum(p.numel() for p in model.parameters()) == SIZES[arch][0] - 995 * (head + 1)


def test_hub_pretrained_loads_ngcs_file_as_published(tmp_path, monkeypatch, b0_weights):
    downloads = published_on_ngc(monkeypatch, tmp_path, ngc_layout(b0_weights))
    model = hub_load("nvidia_efficientnet_b0", pretrained=True, num_classes=10)
    assert torch.equal(model.layers[2][1].depsep.bn.running_var, b0_weights["layers.2.block1.depsep.bn.running_var"])
    assert downloads == [weights_module.PRETRAINED_URLS["efficientnet-b0"]]
    assert (tmp_path / "checkpoints" / "nvidia_efficientnet-b0_210412.pth").is_file()
