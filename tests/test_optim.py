"""Learning-rate schedules, weight-decay groups, the optimizers' kernels and the EMA, against the formulas."""

import copy
import math

import pytest
import torch
from torch.torch_version import TorchVersion

from helpers import refused, run_config
from image_classification.arguments import parse_args
from image_classification.models import build_model
from image_classification.system.cli import run as cli_run
from image_classification.train.optim import build_optimizer, lr_at, split_weight_decay
from image_classification.training import main as train_main


@pytest.mark.parametrize("epoch, expected", [(0, 0.1), (29, 0.1), (30, 0.01), (59, 0.01), (60, 0.001), (80, 1e-4)])
def test_step_schedule_divides_by_ten_at_30_60_80(epoch, expected):
    assert lr_at(epoch, base_lr=0.1, schedule="step", warmup=0, epochs=90) == pytest.approx(expected)


def test_warmup_is_linear_over_the_first_epochs_for_every_schedule():
    for schedule in ("step", "linear", "cosine"):
        values = [lr_at(e, base_lr=2.048, schedule=schedule, warmup=8, epochs=90) for e in range(8)]
        assert values == pytest.approx([2.048 * (e + 1) / 8 for e in range(8)])


def test_linear_and_cosine_follow_the_spec_formulas():
    base, warmup, epochs = 1.024, 8, 90
    for e in (8, 20, 49, 89):
        progress = (e - warmup) / (epochs - warmup)
        assert lr_at(e, base_lr=base, schedule="linear", warmup=warmup, epochs=epochs) == pytest.approx(
            base * (1 - progress))
        assert lr_at(e, base_lr=base, schedule="cosine", warmup=warmup, epochs=epochs, end_lr=1e-4) == pytest.approx(
            1e-4 + 0.5 * (1 + math.cos(math.pi * progress)) * (base - 1e-4))
    assert lr_at(8, base_lr=base, schedule="cosine", warmup=8, epochs=90) == pytest.approx(base)


def test_every_batchnorm_is_excluded_from_weight_decay_downsample_included():
    model = build_model("resnet50")
    bn, rest, biases = split_weight_decay(model)
    assert biases == []
    names = {id(p): n for n, p in model.named_parameters()}
    bn_names = {names[id(p)] for p in bn}
    assert "layer1.0.downsample.1.weight" in bn_names and "layer4.0.downsample.1.bias" in bn_names
    assert all(".bn" in n or n.startswith("bn1") or "downsample.1" in n for n in bn_names)
    assert len(bn) == 106 and len(rest) == 55  # the reference decayed 8 downsample BN tensors (98 / 63)
    optimizer = build_optimizer(model, name="sgd", lr=0.1, momentum=0.875, weight_decay=3e-5, log=lambda *_: None)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 3e-5]


def test_bn_weight_decay_flag_decays_batchnorm_too_and_rmsprop_is_built():
    model = build_model("resnet18", num_classes=10)
    optimizer = build_optimizer(model, name="rmsprop", lr=0.1, momentum=0.9, weight_decay=1e-4, bn_weight_decay=True,
                                rmsprop_alpha=0.85, rmsprop_eps=0.01, log=lambda *_: None)
    assert isinstance(optimizer, torch.optim.RMSprop)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [1e-4, 1e-4]
    assert optimizer.defaults["alpha"] == 0.85 and optimizer.defaults["eps"] == 0.01


def _train_copies(name: str, steps: int = 4) -> tuple[torch.optim.Optimizer, list, list, list]:
    """(our optimizer, its final weights, the same optimizer's final weights with the plain for-loop update,
    the initial weights), on the tiny ResNet (conv, BatchNorm and fc tensors as ResNet-18 has, fewer)."""
    torch.manual_seed(0)
    ours_model = build_model("tiny", num_classes=10)
    plain_model = build_model("tiny", num_classes=10)
    plain_model.load_state_dict(ours_model.state_dict())
    initial = [p.detach().clone() for p in ours_model.parameters()]
    kwargs = dict(name=name, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=name == "sgd", log=lambda *_: None)
    ours = build_optimizer(ours_model, **kwargs)
    plain = build_optimizer(plain_model, **kwargs)
    for group in plain.param_groups:
        group["foreach"] = False
    images, targets = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 5, 9])
    for _ in range(steps):
        for model, optimizer in ((ours_model, ours), (plain_model, plain)):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), targets).backward()
            optimizer.step()
    return ours, list(ours_model.parameters()), list(plain_model.parameters()), initial


# SGD's kernel on the CPU: torch 2.3's fused SGD accepts CPU tensors but has a kernel for CUDA only
SGD_KERNEL = "fused" if TorchVersion(torch.__version__) >= "2.4" else "foreach"


@pytest.mark.parametrize("name, flag", [("sgd", SGD_KERNEL), ("rmsprop", "foreach")])
def test_cpu_optimizers_use_fused_or_foreach_kernels_and_match_the_for_loop(name, flag, tiny_arch):
    ours, got, expected, initial = _train_copies(name)
    assert all(group[flag] is True for group in ours.param_groups)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(got, initial))  # every tensor moved


def test_an_optimizer_without_a_fused_kernel_for_the_device_gets_foreach():
    from image_classification.train.optim import make_optimizer

    class CudaOnlyFused(torch.optim.SGD):
        def __init__(self, params, fused=None, **options):
            if fused:
                raise RuntimeError("`fused=True` requires all the params to be CUDA tensors")
            super().__init__(params, **options)

    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = make_optimizer(CudaOnlyFused, [{"params": params}], lr=0.1)
    assert optimizer.param_groups[0]["foreach"] is True and not optimizer.param_groups[0]["fused"]


def test_an_optimizer_that_accepts_fused_but_has_no_kernel_to_step_with_gets_foreach():
    """torch 2.3's SGD takes ``fused=True`` for CPU tensors and fails only at its first step."""
    from image_classification.train.optim import make_optimizer

    class FusedStepMissing(torch.optim.SGD):
        def step(self, closure=None):
            if self.defaults["fused"]:
                raise NotImplementedError("Could not run 'aten::_fused_sgd_' with arguments from the 'CPU' "
                                          "backend.")
            return super().step(closure)

    params = [torch.nn.Parameter(torch.ones(2))]
    params[0].grad = torch.ones(2)
    optimizer = make_optimizer(FusedStepMissing, [{"params": params}], lr=0.5)
    optimizer.step()
    assert optimizer.param_groups[0]["foreach"] is True and not optimizer.param_groups[0]["fused"]
    assert params[0].tolist() == [0.5, 0.5]


def test_a_checkpoint_of_another_implementation_loads_without_changing_the_kernels():
    from image_classification.train.optim import load_optimizer_state

    model = build_model("resnet18", num_classes=10)
    old = torch.optim.SGD([{"params": g} for g in split_weight_decay(model)[:2]], lr=0.3, momentum=0.9)
    ours = build_optimizer(model, name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, log=lambda *_: None)
    load_optimizer_state(ours, old.state_dict())
    assert [g["lr"] for g in ours.param_groups] == [0.3, 0.3]  # the checkpoint's values are restored
    assert all(g[SGD_KERNEL] is True for g in ours.param_groups)  # ours, not the checkpoint's (neither set)


def _layout_model(memory_format: torch.memory_format, weights: dict | None = None,
                  device: str = "cpu") -> torch.nn.Module:
    """A 3x3 conv (strides that differ between layouts), a 1x1 conv, BatchNorm and a linear head."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 2))
    if weights is not None:
        model.load_state_dict(weights)
    return model.to(device, memory_format=memory_format)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One step with the same gradients, index by index, in every layout (each in its parameter's strides,
    as autograd gives them)."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        param.grad = torch.empty_like(param).copy_(torch.randn(param.shape, generator=generator))
    optimizer.step()


def assert_resumes_across_layouts(name: str, written_in: torch.memory_format, resumed_in: torch.memory_format,
                                  loss_scaling: bool = False, device: str = "cpu") -> None:
    """An optimizer state written in ``written_in`` and resumed in ``resumed_in`` is held in each parameter's
    strides, with the written values, and takes the next step of a resume in ``written_in``."""
    from image_classification.train.optim import load_optimizer_state

    options = dict(name=name, lr=0.5, momentum=0.9, weight_decay=1e-4, loss_scaling=loss_scaling,
                   log=lambda *_: None)
    writer = _layout_model(written_in, device=device)
    optimizer = build_optimizer(writer, **options)
    _step(writer, optimizer, seed=1)
    after = {}
    for layout in (written_in, resumed_in):
        model = _layout_model(layout, writer.state_dict(), device)
        resumed = build_optimizer(model, **options)
        load_optimizer_state(resumed, copy.deepcopy(optimizer.state_dict()))  # a fresh copy, as a file gives
        for param, written_param in zip(model.parameters(), writer.parameters()):
            written = optimizer.state[written_param]
            for key, value in resumed.state[param].items():
                layout_of = param if value.shape == param.shape else written[key]  # a scalar keeps its own
                assert value.stride() == layout_of.stride(), key
                assert torch.equal(value, written[key]), key
        _step(model, resumed, seed=2)
        after[layout] = model.state_dict()
    for key, value in after[written_in].items():
        torch.testing.assert_close(after[resumed_in][key], value, rtol=1e-6, atol=1e-6, msg=key)


NCHW, CHANNELS_LAST = torch.contiguous_format, torch.channels_last


@pytest.mark.parametrize("name, loss_scaling", [("sgd", False), ("sgd", True), ("adamw", False),
                                                ("rmsprop", False), ("lamb", False), ("lars", False)])
@pytest.mark.parametrize("written_in, resumed_in", [(NCHW, CHANNELS_LAST), (CHANNELS_LAST, NCHW)])
def test_a_resumed_optimizer_state_takes_each_parameter_s_memory_layout(name, loss_scaling, written_in,
                                                                        resumed_in):
    """Momentum and moments written in one layout load in the strides of the parameter they belong to
    (torch's fused SGD and AdamW, which the CPU takes without a loss scaler, pair them by memory position;
    CUDA's stop at a layout other than the parameter's), and the next step is a same-layout resume's."""
    assert_resumes_across_layouts(name, written_in, resumed_in, loss_scaling)


def test_a_state_tensor_takes_the_strides_of_a_tensor_of_its_shape_and_keeps_its_dtype():
    from image_classification.train.optim import in_layout_of

    param = torch.zeros(4, 3, 2, 2).contiguous(memory_format=CHANNELS_LAST)
    state = torch.arange(48, dtype=torch.float64).view(4, 3, 2, 2)
    relaid = in_layout_of(state, param)
    assert relaid.stride() == param.stride() and relaid.dtype == torch.float64 and torch.equal(relaid, state)
    step, other = torch.tensor(3.0), torch.zeros(4, 3)
    assert in_layout_of(step, param) is step and in_layout_of(other, param) is other
    assert in_layout_of(relaid, param) is relaid  # already in its layout: no copy


# ------------------------------------------------------------------------------------------------
# AdamW, LAMB and LARS
# ------------------------------------------------------------------------------------------------
def _toy_problem(steps: int = 6) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """The batches (inputs, targets) of a small least-squares problem, the same for every run."""
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 5, generator=generator), torch.randn(16, 3, generator=generator)) for _ in range(steps)]


def _toy_weights() -> list[torch.Tensor]:
    """A matrix, a zero bias (its trust ratio is 1 at the first step) and a per-feature scale, in float64."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(5, 3, generator=generator, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
            torch.randn(3, generator=generator, dtype=torch.float64)]


def _toy_gradients(weights: list[torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of ``mean((x @ (W * scale) + b) - y)^2``; ``scale`` is a normalisation-like per-feature weight."""
    weights = [w.detach().clone().requires_grad_(True) for w in weights]
    matrix, bias, scale = weights
    loss = ((inputs.double() @ (matrix * scale) + bias - targets.double()) ** 2).mean()
    return list(torch.autograd.grad(loss, weights))


def _run_ours(optimizer_class, groups_of: list[int], decays: list[float], adapt: list[bool], **options):
    """Our optimizer on the toy problem; tensor i is in group ``groups_of[i]``."""
    params = [torch.nn.Parameter(w.clone()) for w in _toy_weights()]
    groups = [{"params": [p for p, g in zip(params, groups_of) if g == index], "weight_decay": decay, "adapt": flag}
              for index, (decay, flag) in enumerate(zip(decays, adapt))]
    optimizer = optimizer_class(groups, **options)
    for inputs, targets in _toy_problem():
        for param, grad in zip(params, _toy_gradients(list(params), inputs, targets)):
            param.grad = grad
        optimizer.step()
    return [p.detach() for p in params]


def _paper_lamb(decays: list[float], adapt: list[bool], lr: float, betas=(0.9, 0.999), eps=1e-6):
    """You et al. 2019, Algorithm 2, per layer, with bias correction; phi is the identity."""
    beta1, beta2 = betas
    weights = _toy_weights()
    m = [torch.zeros_like(w) for w in weights]
    v = [torch.zeros_like(w) for w in weights]
    for t, (inputs, targets) in enumerate(_toy_problem(), start=1):
        grads = _toy_gradients(weights, inputs, targets)
        for i, (w, g) in enumerate(zip(weights, grads)):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat, v_hat = m[i] / (1 - beta1**t), v[i] / (1 - beta2**t)
            update = m_hat / (v_hat.sqrt() + eps) + decays[i] * w
            ratio = 1.0
            if adapt[i] and w.norm() > 0 and update.norm() > 0:
                ratio = w.norm() / update.norm()
            weights[i] = w - lr * ratio * update
    return weights


def _paper_lars(decays: list[float], adapt: list[bool], lr: float, momentum: float, eta: float = 1e-3):
    """You et al. 2017, Algorithm 1 (constant global LR: the velocity holds lr, as the paper writes it)."""
    weights = _toy_weights()
    velocity = [torch.zeros_like(w) for w in weights]
    for inputs, targets in _toy_problem():
        grads = _toy_gradients(weights, inputs, targets)
        for i, (w, g) in enumerate(zip(weights, grads)):
            local = 1.0
            if adapt[i] and w.norm() > 0 and g.norm() > 0:
                local = eta * w.norm() / (g.norm() + decays[i] * w.norm())
            velocity[i] = momentum * velocity[i] + lr * local * (g + decays[i] * w)
            weights[i] = w - velocity[i]
    return weights


@pytest.mark.parametrize("adapt_second_group", [False, True])
def test_lamb_is_the_papers_algorithm_with_bias_correction_and_trust_ratio(adapt_second_group):
    from image_classification.train.optim import Lamb

    adapt = [True, adapt_second_group]
    got = _run_ours(Lamb, [0, 1, 1], [0.01, 0.0], adapt, lr=0.02)
    expected = _paper_lamb([0.01, 0.0, 0.0], [True, adapt[1], adapt[1]], lr=0.02)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert got[0].abs().max() > 0 and got[1].abs().max() > 0  # the zero tensor moved: its ratio was 1


def test_lamb_trust_ratio_changes_the_step_from_adams():
    from image_classification.train.optim import Lamb

    adapted = _run_ours(Lamb, [0, 0, 0], [0.01], [True], lr=0.02)
    plain = _run_ours(Lamb, [0, 0, 0], [0.01], [False], lr=0.02)
    assert not torch.allclose(adapted[0], plain[0])
    torch.testing.assert_close(plain[0], _paper_lamb([0.01] * 3, [False] * 3, lr=0.02)[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("adapt_second_group", [False, True])
def test_lars_is_the_papers_algorithm_with_momentum(adapt_second_group):
    from image_classification.train.optim import Lars

    adapt = [True, adapt_second_group]
    got = _run_ours(Lars, [0, 1, 1], [0.01, 0.0], adapt, lr=2.0, momentum=0.9)
    expected = _paper_lars([0.01, 0.0, 0.0], [True, adapt[1], adapt[1]], lr=2.0, momentum=0.9)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    unadapted = _paper_lars([0.01, 0.0, 0.0], [False] * 3, lr=2.0, momentum=0.9)
    assert not torch.allclose(got[0], unadapted[0])  # eta * ||w|| / ||g|| really scaled the step


def test_adamw_lamb_and_lars_are_built_over_the_groups_lars_and_lamb_skip_the_undecayed_ones():
    model = build_model("resnet18", num_classes=10)
    quiet = dict(lr=0.1, momentum=0.9, weight_decay=0.05, log=lambda *_: None)
    adamw = build_optimizer(model, name="adamw", **quiet)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["betas"] == (0.9, 0.999)
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.0, 0.05]
    assert "adapt" not in adamw.param_groups[0]  # the torch optimizers' groups (and checkpoints) are as before
    lars = build_optimizer(model, name="lars", **quiet)
    assert [(g["weight_decay"], g["adapt"]) for g in lars.param_groups] == [(0.0, False), (0.05, True)]
    assert lars.defaults["momentum"] == 0.9 and lars.defaults["eta"] == 1e-3
    lamb = build_optimizer(model, name="lamb", norm_weight_decay=1e-5, bias_weight_decay=0.0, **quiet)
    assert [(g["weight_decay"], g["adapt"]) for g in lamb.param_groups] == [(1e-5, True), (0.05, True), (0.0, False)]
    assert lamb.defaults["eps"] == 1e-6


# ------------------------------------------------------------------------------------------------
# weight-decay groups, against torchvision's references/classification/utils.set_weight_decay
# ------------------------------------------------------------------------------------------------
TORCHVISION_NORM_CLASSES = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
                            torch.nn.modules.instancenorm._InstanceNorm, torch.nn.LocalResponseNorm)


def torchvision_decays(model, weight_decay, norm_weight_decay=None, bias_weight_decay=None) -> dict[str, float]:
    """What torchvision's train.py gives each parameter (by name): ``set_weight_decay`` walks the modules;
    a parameter whose own name is a custom key (``bias`` with --bias-weight-decay) takes that key's decay,
    else a normalisation layer's parameter takes norm_weight_decay when that is given, else weight_decay."""
    decays = {}
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if bias_weight_decay is not None and name == "bias":
                decays[full] = bias_weight_decay
            elif norm_weight_decay is not None and isinstance(module, TORCHVISION_NORM_CLASSES):
                decays[full] = norm_weight_decay
            else:
                decays[full] = weight_decay
    return decays


def _our_decays(model, **flags) -> dict[str, float]:
    optimizer = build_optimizer(model, name="sgd", lr=0.1, momentum=0.9, log=lambda *_: None, **flags)
    names = {id(p): n for n, p in model.named_parameters()}
    decays = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            assert names[id(param)] not in decays  # in one group only
            decays[names[id(param)]] = group["weight_decay"]
    return decays


@pytest.mark.parametrize("arch", ["resnet50", "se-resnext101-32x4d"])
@pytest.mark.parametrize("norm, bias", [(0.0, None), (1e-5, None), (0.0, 0.0), (2e-5, 3e-4), (3e-5, 3e-5)])
def test_norm_and_bias_weight_decay_give_each_parameter_torchvisions_decay(arch, norm, bias):
    model = build_model(arch, num_classes=10)
    ours = _our_decays(model, weight_decay=3e-5, norm_weight_decay=norm, bias_weight_decay=bias)
    assert ours == torchvision_decays(model, 3e-5, norm, bias)
    assert set(ours) == {n for n, _ in model.named_parameters()}
    if bias is not None:
        assert ours["fc.bias"] == ours["bn1.bias"] == ours["layer1.0.downsample.1.bias"] == bias


def test_bn_weight_decay_is_norm_weight_decay_at_the_weight_decay_and_the_default_layout_is_kept():
    model = build_model("resnet50")
    kept = _our_decays(model, weight_decay=1e-4, bn_weight_decay=True)
    assert kept == _our_decays(model, weight_decay=1e-4, norm_weight_decay=1e-4)
    assert kept == torchvision_decays(model, 1e-4)  # torchvision without --norm-weight-decay decays them all
    default = build_optimizer(model, name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, log=lambda *_: None)
    norm, rest, _ = split_weight_decay(model)
    # today's checkpoints hold two groups in this order: BatchNorm (undecayed), then the rest
    assert [g["params"] for g in default.param_groups] == [norm, rest]
    assert [g["weight_decay"] for g in default.param_groups] == [0.0, 1e-4]


# ------------------------------------------------------------------------------------------------
# EMA
# ------------------------------------------------------------------------------------------------
def _small_bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def test_ema_follows_the_formula_over_steps_and_copies_integer_buffers():
    from image_classification.train.ema import ModelEma, ema_decay

    torch.manual_seed(0)
    model = _small_bn_model()
    ema = ModelEma(model, decay=0.8)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(1, 6):
        optimizer.zero_grad()
        model(torch.randn(8, 3, 6, 6)).square().mean().backward()  # train mode: BN statistics move too
        optimizer.step()
        ema.update(model, step)
        mu = min(0.8, (1 + step) / (10 + step))
        assert ema_decay(0.8, step) == mu
        for key, value in model.state_dict().items():
            expected[key] = mu * expected[key] + (1 - mu) * value if value.is_floating_point() else value.clone()
    got = ema.state_dict()
    assert got["1.num_batches_tracked"].item() == 5
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7)
    assert not torch.equal(got["5.weight"], model.state_dict()["5.weight"])  # an average, not a copy


def test_ema_state_dict_round_trips_and_keeps_updating():
    from image_classification.train.ema import ModelEma

    torch.manual_seed(1)
    model = _small_bn_model()
    first = ModelEma(model, decay=0.9)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    first.update(model, step=50)
    second = ModelEma(_small_bn_model(), decay=0.9)
    second.load_state_dict(first.state_dict())
    for key, value in first.state_dict().items():
        assert torch.equal(second.state_dict()[key], value), key
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(0.5)
    first.update(model, step=51)
    second.update(model, step=51)  # loaded in place: its cached tensors are the module's
    for key, value in first.state_dict().items():
        assert torch.equal(second.state_dict()[key], value), key


def host_synchronisations(engine, steps: int = 3) -> int:
    """How many times ``steps`` CUDA training steps of ``engine`` wait for the device (CUDA's sync debug mode
    warns at each), after one step for one-off set-up."""
    import warnings

    device = engine.runtime.device
    images = torch.randn(8, 3, 32, 32, device=device)
    targets = torch.randint(0, 10, (8,), device=device)
    engine.train_step(images, targets, accumulation=1, step_now=True)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                engine.train_step(images, targets, accumulation=1, step_now=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(warning.message) for warning in caught)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp_dtype, use_ema", [(None, False), ("float16", True), ("bfloat16", False)])
def test_cuda_training_steps_synchronise_with_the_host_only_for_fp16_s_skip(amp_dtype, use_ema):
    """FP32 and bf16: the fused SGD and the EMA stay on the device, no step waits for it.  fp16: one read of
    the scaler's inf flag per optimizer step, which decides whether the step is taken (the fused kernel,
    which would skip on the device, mishandles a skipped first step; see tests/test_fp16.py)."""
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import make_runtime
    from image_classification.train.engine import Engine

    runtime = make_runtime("cuda", amp=amp_dtype is not None, amp_dtype=amp_dtype, log=lambda *_: None)
    model = build_model("resnet18", num_classes=10).to(runtime.device)
    config = run_config(arch="resnet18", num_classes=10, model_options=(), preprocessing=Preprocessing(32),
                       ema_decay=0.99 if use_ema else None, dynamic_loss_scale=True, loss_scale=128.0)
    engine = Engine(config, runtime, model, log=lambda *_: None)
    fp16 = amp_dtype == "float16"
    assert all(bool(group["fused"]) != fp16 for group in engine.optimizer.param_groups)
    assert host_synchronisations(engine, steps=3) == (3 if fp16 else 0)
    reading = engine.read_window("the test")
    assert reading.steps == 4 and engine.progress.optimizer_steps == 4


# ------------------------------------------------------------------------------------------------
# exact resume of the new optimizers' state
# ------------------------------------------------------------------------------------------------
def stopped_and_resumed(data, workspace, argv: list[str], stop_after: int) -> tuple[dict, dict]:
    """(the checkpoint of a straight run, that of the same run stopped by SIGTERM after ``stop_after``
    training steps, mid-epoch, and resumed from its checkpoint)."""
    import os
    import signal

    from image_classification.errors import EXIT_PREEMPTED
    from image_classification.train import engine as engine_module
    from image_classification.training import main

    def run(name: str, *extra: str) -> int:
        return main([*argv, "--workspace", str(workspace / name), *extra, str(data)])

    assert run("straight") == 0
    original, calls = engine_module.Engine.train_step, {"n": 0}

    def stepping_then_signalled(self, *args, **kwargs):
        original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    engine_module.Engine.train_step = stepping_then_signalled
    try:
        assert run("stopped") == EXIT_PREEMPTED
    finally:
        engine_module.Engine.train_step = original
    partial = torch.load(workspace / "stopped" / "checkpoint.pth.tar", weights_only=True)
    assert partial["batch"] > 0  # saved mid-epoch
    assert run("stopped", "--resume", str(workspace / "stopped" / "checkpoint.pth.tar")) == 0
    load = lambda name: torch.load(workspace / name / "checkpoint.pth.tar", weights_only=True)  # noqa: E731
    return load("straight"), load("stopped")


def assert_same_tensors(a, b, where: str = "") -> None:
    """``a`` and ``b`` (nested dicts and lists of tensors and numbers) are bitwise equal."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{index}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("optimizer, flag", [
    *(("lamb", flag) for flag in ("--lr", "--weight-decay", "--norm-weight-decay", "--bias-weight-decay")),
    ("lars", "--lr"), ("lars", "--bias-weight-decay"), ("rmsprop", "--lr"), ("rmsprop", "--weight-decay"),
    ("rmsprop", "--rmsprop-eps"), ("sgd", "--lr"), ("adamw", "--lr"), ("sgd", "--end-lr"),
])
def test_a_value_beyond_float32_is_a_flag_error_for_every_optimizer(optimizer, flag, tmp_path, capsys, tiny_arch):
    """float32 holds at most 3.4e38: a larger value crashed LAMB, LARS and RMSprop at their first step and
    made SGD's and AdamW's weights non-finite (exit 3); it is refused before anything runs, naming the flag."""
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "2", "--device", "cpu", "--data-backend", "synthetic",
            "--prof", "1", "--epochs", "1", "--optimizer", optimizer, "--workspace", str(tmp_path / "run")]
    line = refused(cli_run(train_main, [*argv, flag, "1e39"]), capsys)
    assert line.startswith(f"error: main.py: argument {flag}") and "float32" in line and "got 1e39" in line, line
    assert not (tmp_path / "run").exists()
    assert parse_args([*argv, flag, "3.4e38"]).optimizer == optimizer  # float32's largest values still parse


@pytest.mark.parametrize("optimizer, extra", [
    ("adamw", ["--weight-decay", "0.05"]),
    ("lamb", ["--norm-weight-decay", "1e-5", "--bias-weight-decay", "0"]),
    ("lars", ["--lr", "2"]),
])
def test_a_mid_epoch_resume_of_each_new_optimizer_is_bitwise_exact(optimizer, extra, image_folder, tmp_path, tiny_arch):
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "-p", "1", "--num-classes", "3",
            "--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--seed", "5", "--lr", "0.01",
            "--optimizer", optimizer, *extra]
    straight, resumed = stopped_and_resumed(image_folder, tmp_path, argv, stop_after=8)  # epoch 2, batch 2
    assert straight["epoch"] == resumed["epoch"] == 2
    assert_same_tensors(straight["state_dict"], resumed["state_dict"], "state_dict")
    assert_same_tensors(straight["optimizer"], resumed["optimizer"], "optimizer")
    assert len(straight["optimizer"]["param_groups"]) == (3 if optimizer == "lamb" else 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["adamw", "lamb", "lars"])
def test_cuda_steps_of_the_new_optimizers_and_torchvisions_ema_never_synchronise(name):
    """fp32: the trust ratios stay on the device (no .item()), the EMA's interval is counted on the host."""
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import make_runtime
    from image_classification.train.engine import Engine

    runtime = make_runtime("cuda", log=lambda *_: None)
    model = build_model("resnet18", num_classes=10).to(runtime.device)
    config = run_config(arch="resnet18", num_classes=10, model_options=(), preprocessing=Preprocessing(32),
                       optimizer=name, ema_decay=0.9999, ema_style="torchvision", ema_steps=2)
    engine = Engine(config, runtime, model, log=lambda *_: None)
    assert host_synchronisations(engine, steps=3) == 0
    assert engine.ema.updates == 2


# -- the triangular (FFCV's cyclic) schedule --------------------------------------------------------------------
def ffcv_iteration_lrs(epoch: int, iterations: int, lr: float, epochs: int, peak: int) -> list[float]:
    """FFCV train_imagenet.py's learning rates of an epoch's iterations: get_cyclic_lr at the epoch and the next,
    interpolated over the iterations (np.interp, as its text reads)."""
    import numpy as np

    def cyclic(at: int) -> float:
        return float(np.interp([at], [0, peak, epochs], [1e-4 * lr, lr, 0])[0])

    return list(np.interp(np.arange(iterations), [0, iterations], [cyclic(epoch), cyclic(epoch + 1)]))


@pytest.mark.parametrize("epochs,peak", [(16, 2), (88, 2), (5, 0), (4, 3)])
def test_the_triangular_schedule_is_ffcv_s_cyclic_one_at_every_iteration(epochs, peak):
    iterations = 7
    for epoch in range(epochs):
        ours = [lr_at(epoch + i / iterations, base_lr=1.7, schedule="triangular", warmup=0, epochs=epochs,
                      peak_epoch=peak) for i in range(iterations)]
        assert ours == pytest.approx(ffcv_iteration_lrs(epoch, iterations, 1.7, epochs, peak), rel=1e-9, abs=1e-12)


def test_the_loop_sets_the_triangular_rate_at_every_step(tmp_path, tiny_arch):
    """train.lr of every logged step (-p 1) is the schedule's value at that step's place in its epoch."""
    from image_classification.records.raport import read_raport

    assert train_main(["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "synthetic",
                       "--image-size", "32", "-b", "2", "--prof", "4", "--epochs", "3", "-p", "1", "--lr", "0.4",
                       "--lr-schedule", "cyclic", "--lr-peak-epoch", "1", "--training-only", "--no-checkpoints",
                       "--workspace", str(tmp_path)]) == 0
    logged = [r["data"]["train.lr"] for r in read_raport(tmp_path / "experiment_raport.json")
              if isinstance(r.get("step"), list) and len(r["step"]) == 2 and "train.lr" in r["data"]]
    expected = [value for epoch in range(3) for value in ffcv_iteration_lrs(epoch, 4, 0.4, 3, 1)]
    assert logged == pytest.approx(expected)


@pytest.mark.parametrize("argv,message", [
    (["--lr-schedule", "triangular", "--warmup", "5"], "leave out --warmup 5"),
    (["--lr-peak-epoch", "3"], "--lr-peak-epoch places the peak of --lr-schedule triangular"),
    (["--lr-schedule", "triangular", "--lr-peak-epoch", "10", "--epochs", "10"],
     "--lr-peak-epoch 10 leaves --epochs 10 no epoch to come down in"),
    (["--lr-schedule", "triangular", "--epochs", "2"], "--lr-peak-epoch 2 leaves --epochs 2"),  # FFCV's peak
    (["--lr-schedule", "triangular", "--lr-peak-epoch", "-1"], "--lr-peak-epoch must be 0 or more"),
    (["--lr-schedule", "triangle"], "invalid choice: 'triangle'"),
])
def test_the_triangular_schedule_s_flags_are_checked(argv, message, capsys):
    assert message in refused(cli_run(train_main, ["--data-backend", "synthetic", *argv]), capsys)


def test_cyclic_is_ffcv_s_name_for_the_triangular_schedule():
    assert parse_args(["/data", "--lr-schedule", "cyclic"]).lr_schedule == "triangular"
