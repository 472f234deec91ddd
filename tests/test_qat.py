"""Quantization-aware training: quant_main.py trains fake-quantized, resumes exactly, and exports int8 QDQ
graphs that ONNX Runtime runs as PyTorch's fake-quantized model computes them."""

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import refused, run_script
from image_classification.arguments import parse_args
from image_classification.commands import QUANT_DEFAULTS
from image_classification.models import build_model
from image_classification.models.quantized import (calibrate, deployable, fake_quantize_weight, fold_batchnorms,
                                                   holds_quantizers, is_calibrated, quantize_model, quantizers,
                                                   weight_scale)
from test_optim import assert_same_tensors, stopped_and_resumed

ROOT = Path(__file__).resolve().parents[1]
QAT_ARGV = ["--image-size", "32", "-b", "4", "--device", "cpu", "-p", "1", "--num-classes", "3",
            "--data-backend", "pytorch", "-j", "0", "--seed", "3", "--lr", "0.02", "--quantize-aware"]


def _calibrated(arch: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = quantize_model(build_model(arch, num_classes=3))
    calibrate(model, [torch.randn(8, 3, 32, 32) for _ in range(2)])
    return model.eval()


def test_the_reference_command_line_parses_as_the_plain_arch_trained_quantized():
    args = parse_args(["/imagenet", "--arch", "efficientnet-quant-b0", "--epochs", "10", "-j5", "-p", "500",
                       "--data-backend", "pytorch", "--optimizer", "sgd", "-b", "128", "--lr", "0.0125",
                       "--momentum", "0.89", "--weight-decay", "4.50e-05", "--lr-schedule", "cosine",
                       "--pretrained-from-file", "weights.pth"], defaults=QUANT_DEFAULTS, require_data=False)
    assert (args.arch, args.quantize_aware, args.pretrained_weights) == ("efficientnet-b0", True, "weights.pth")
    assert (args.lr, args.momentum, args.weight_decay, args.lr_schedule) == (0.0125, 0.89, 4.5e-5, "cosine")
    plain = parse_args(["/imagenet", "--arch", "resnet50"], defaults=QUANT_DEFAULTS, require_data=False)
    assert (plain.arch, plain.quantize_aware) == ("resnet50", True)
    assert not parse_args(["/imagenet", "--arch", "resnet50"], require_data=False).quantize_aware


def test_quant_main_s_help_offers_the_quantization_flag_and_the_reference_s_arch_name():
    result = run_script([str(ROOT / "quant_main.py"), "-h"])
    assert result.returncode == 0 and "usage: quant_main.py" in result.stdout
    assert "--quantize-aware" in result.stdout and "efficientnet-quant-bN" in result.stdout


def test_a_quantized_model_keeps_the_float_names_and_holds_its_ranges_in_the_state_dict(tiny_arch):
    plain = build_model(tiny_arch, num_classes=3)
    model = quantize_model(build_model(tiny_arch, num_classes=3))
    assert set(plain.state_dict()) < set(model.state_dict())
    assert holds_quantizers(model.state_dict()) and not holds_quantizers(plain.state_dict())
    assert not is_calibrated(model)
    calibrate(model, [torch.randn(4, 3, 32, 32)])
    assert is_calibrated(model) and model.training
    assert all(float(quantizer.scale) > 0 for quantizer in quantizers(model))


def test_fake_quantized_weights_and_inputs_lie_on_the_int8_grid(tiny_arch):
    model = _calibrated(tiny_arch)
    conv = model.conv1
    weight = conv.quantized_weight()
    steps = weight / (conv.weight.abs().flatten(1).amax(1) / 127).view(-1, 1, 1, 1)
    assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 127 + 1e-4
    x = torch.randn(2, 3, 32, 32)
    quantizer = conv.input_quantizer
    levels = quantizer(x) / quantizer.scale + quantizer.zero_point
    assert torch.allclose(levels, levels.round(), atol=1e-3) and 0 <= levels.min() and levels.max() <= 255 + 1e-3


def test_the_weight_rounding_is_torch_s_per_channel_fake_quantization_bit_for_bit():
    generator = torch.Generator().manual_seed(3)
    for shape in [(64, 32, 3, 3), (10, 512), (8, 4, 1, 1)]:
        weight = (torch.randn(shape, generator=generator) * torch.rand(shape[0], *[1] * (len(shape) - 1),
                                                                        generator=generator)).requires_grad_()
        with torch.no_grad():
            weight[1] = 0  # a channel of zeros: step 1
            steps = torch.arange(weight[2].numel()) % 254 - 126.5  # halfway between two levels: ties
            weight[2] = (steps * 0.0123).view(weight[2].shape)
            weight[2].view(-1)[0] = 127 * 0.0123
        scale = weight_scale(weight)
        zero = torch.zeros(shape[0], dtype=torch.int32)
        expected = torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, -128, 127)
        got = fake_quantize_weight(weight)
        assert torch.equal(got, expected)
        upstream = torch.randn(shape, generator=generator)
        assert torch.equal(*(torch.autograd.grad(out, weight, upstream)[0] for out in (got, expected)))


def test_qat_trains_a_tiny_model_on_the_cpu_and_its_loss_falls(tiny_arch):
    model = _calibrated(tiny_arch).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images, targets = torch.randn(16, 3, 32, 32, generator=generator), torch.arange(16) % 3
    losses = []
    for _ in range(12):
        loss = torch.nn.functional.cross_entropy(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(parameter.grad is not None for parameter in model.parameters())  # straight through
    assert losses[-1] < 0.5 * losses[0], losses


def _trained_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with BatchNorm statistics and affine factors of a trained model (not the fresh 0 and 1), so that
    every folded convolution gets a bias; negative factors too (their integers are negated)."""
    generator = torch.Generator().manual_seed(5)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            for tensor, (low, high) in ((module.running_mean, (-0.5, 0.5)), (module.running_var, (0.5, 2.0)),
                                        (module.weight.data, (-1.5, 1.5)), (module.bias.data, (-0.5, 0.5))):
                tensor.copy_(torch.empty(tensor.shape).uniform_(low, high, generator=generator))
    return model


def test_folding_the_batchnorms_computes_what_the_trained_model_computes(tiny_arch):
    model = _trained_statistics(_calibrated(tiny_arch))
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    folded = fold_batchnorms(model, images[:1])
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    with torch.no_grad():
        expected, got = model(images), folded(images)
    assert (expected.argmax(1) == got.argmax(1)).all()
    assert (expected - got).abs().max() < 0.02 * expected.abs().max()


def test_every_folded_bias_is_a_whole_number_of_accumulator_steps(tiny_arch):
    model = _trained_statistics(_calibrated(tiny_arch))
    folded = deployable(model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    layers = [module for module in folded.modules() if hasattr(module, "frozen_scale") and module.bias is not None]
    assert len(layers) == len(quantizers(model))  # every conv (folded) and the classifier
    for layer in layers:
        step = layer.input_quantizer.scale * weight_scale(layer.weight)  # float32, as ONNX Runtime computes it
        bias = layer.bias.detach()
        assert torch.equal(torch.round(bias / step) * step, bias)  # ONNX Runtime's int32 bias is this one


def test_onnx_runtime_s_int8_kernels_give_pytorch_s_logits_with_coarse_activation_ranges(tiny_arch, tmp_path):
    """ONNX Runtime (its default optimizations) fuses a convolution whose output is quantized again into an int8
    QLinearConv, which adds the bias rounded to a whole number of its accumulator's steps; with coarse
    activation ranges a step is a large part of an activation's, and a bias off that grid moved the logits by
    31% of the largest here, where the export's check allows 5%."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from image_classification.deploy.export import onnx_agreement
    from image_classification.deploy.onnx_runtime import QAT, logit_limit
    from image_classification.deploy.torch_export import export_onnx

    model = _trained_statistics(_calibrated(tiny_arch))
    for quantizer in quantizers(model):
        if int(quantizer.zero_point) == 0:  # the ranges after a ReLU, 32 times wider: a few levels used
            quantizer.scale.mul_(32)
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    folded = deployable(model, images[:1])
    path = tmp_path / "qat.onnx"
    export_onnx(folded, images[:2], path, dynamic_batch=True)
    (found,) = onnx_agreement(path, folded, [images])
    assert found.max_difference < logit_limit(QAT.tolerance, found.scale, QAT.floor), found


@pytest.mark.slow
def test_the_export_is_a_qdq_graph_that_onnx_runtime_runs_as_pytorch_predicts(tiny_arch, tmp_path):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")

    from image_classification.deploy.torch_export import export_onnx

    model = _calibrated(tiny_arch)
    images = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    folded = deployable(model, images[:1])
    path = tmp_path / "qat.onnx"
    assert export_onnx(folded, images[:2], path, dynamic_batch=True) == "torch.export"
    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") >= len(quantizers(model)) and "DequantizeLinear" in ops
    assert "BatchNormalization" not in ops
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["output"], {"input": images.numpy()})[0]
    with torch.no_grad():
        expected = model(images).numpy()
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()


def test_a_mid_epoch_resume_of_qat_is_bitwise_exact(image_folder, tmp_path, tiny_arch):
    argv = ["-a", tiny_arch, *QAT_ARGV, "--epochs", "2"]
    straight, resumed = stopped_and_resumed(image_folder, tmp_path, argv, stop_after=9)  # epoch 2, batch 3
    assert straight["quantization"] == resumed["quantization"]
    assert holds_quantizers(straight["state_dict"])
    assert_same_tensors(straight["state_dict"], resumed["state_dict"], "state_dict")
    assert_same_tensors(straight["optimizer"], resumed["optimizer"], "optimizer")


@pytest.mark.slow
def test_quant_main_trains_exports_and_evaluates_in_int8(image_folder, tmp_path, tiny_arch):
    """quant_main.py from FP32 weights, model2onnx.py of its checkpoint, and main.py --evaluate --runtime
    onnxruntime of it: the int8 graph's top-1 within a few images of PyTorch's fake-quantized one."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    common = ["-a", "tiny", "--image-size", "32", "-b", "4", "-p", "1", "--data-backend", "pytorch", "-j", "0",
              "--seed", "1"]
    fp32 = tmp_path / "fp32"
    assert run_script([str(ROOT / "main.py"), *common, "--epochs", "1", "--workspace", str(fp32),
                       str(image_folder)]).returncode == 0
    qat = tmp_path / "qat"
    trained = run_script([str(ROOT / "quant_main.py"), *common, "--epochs", "1", "--lr", "0.01", "--workspace",
                          str(qat), "--pretrained-from-file", str(fp32 / "checkpoint.pth.tar"), str(image_folder)])
    assert trained.returncode == 0 and "activation ranges calibrated" in trained.stdout
    checkpoint = qat / "checkpoint.pth.tar"
    onnx_file = tmp_path / "qat.onnx"
    exported = run_script([str(ROOT / "model2onnx.py"), "--arch", "tiny", "--weights", str(checkpoint), "--output",
                           str(onnx_file)])
    assert exported.returncode == 0 and onnx_file.is_file(), exported.stderr
    evaluated = run_script([str(ROOT / "main.py"), *common, "--evaluate", "--runtime", "onnxruntime", "--resume",
                            str(checkpoint), "--workspace", str(tmp_path / "eval"), str(image_folder)],
                           env={"IMAGE_CLASSIFICATION_CACHE": str(tmp_path / "cache")})
    assert evaluated.returncode == 0 and "val top1" in evaluated.stdout


def test_a_checkpoint_trained_without_qat_is_refused_where_qat_is_required(image_folder, tmp_path, tiny_arch,
                                                                          capsys):
    common = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "--data-backend", "pytorch",
              "-j", "0", "--num-classes", "3"]
    from image_classification.training import main

    assert main([*common, "--epochs", "1", "--workspace", str(tmp_path / "fp32"), str(image_folder)]) == 0
    capsys.readouterr()
    from image_classification.system.cli import run

    code = run(lambda: main([*common, "--quantize-aware", "--evaluate", "--resume",
                             str(tmp_path / "fp32" / "checkpoint.pth.tar"), "--workspace", str(tmp_path / "eval"),
                             str(image_folder)]))
    line = refused(code, capsys)
    assert "was not trained quantization-aware" in line and "--pretrained-from-file" in line


def test_a_damaged_activation_range_is_one_line(tiny_arch, tmp_path, capsys):
    from image_classification.deploy.export import model2onnx_main
    from image_classification.system.cli import run

    state = _calibrated(tiny_arch).state_dict()
    state["conv1.input_quantizer.scale"] = torch.tensor(-1.0)
    path = tmp_path / "damaged.pth"
    torch.save(state, path)
    code = run(lambda: model2onnx_main(["--arch", tiny_arch, "--num-classes", "3", "--weights", str(path),
                                        "--output", str(tmp_path / "m.onnx")]))
    line = refused(code, capsys)
    assert "is damaged: the activation range of conv1.input_quantizer (scale -1" in line
    assert not (tmp_path / "m.onnx").exists()
