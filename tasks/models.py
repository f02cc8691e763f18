"""The papers' models, selectable by name and sized from the dataset.

Every model is ``body`` (input -> representation vector) followed by ``head`` (the
classifier, the last Linear layer). Methods that need the representation (MOON) call
``model.body``; methods that treat the head specially (FedSOL, FedPGVC, FedPVR) find it as
``model.head``.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.catalogue import InputShape


class Classifier(nn.Module):
    """body -> head; forward returns logits."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _cnn(shape: InputShape, width: tuple[int, int] = (32, 64), hidden: int = 512, bn: bool = False) -> Classifier:
    """McMahan et al. (2017) CNN: two 5x5 conv (32, 64) + 2x2 pool, FC 512, head.

    'same' padding, so MNIST flattens 64*7*7 = 3136 and CIFAR 64*8*8 = 4096.
    """
    c1, c2 = width
    norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
    flat = c2 * (shape.size // 4) ** 2
    body = nn.Sequential(
        nn.Conv2d(shape.channels, c1, 5, padding=2), norm(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), norm(c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(hidden, shape.classes))


def _cnn_small(shape: InputShape) -> Classifier:
    """RI-FedAvg Architecture 2: one 5x5 conv with 16 filters + pool, FC 128, head."""
    flat = 16 * (shape.size // 2) ** 2
    body = nn.Sequential(
        nn.Conv2d(shape.channels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(128, shape.classes))


def _lenet(shape: InputShape, bn: bool = False) -> Classifier:
    """LeNet-5 (FedPGVC / FedGAM MNIST): conv 6, conv 16, FC 120, FC 84, head.

    28x28 inputs get padding 2 on the first conv so both sizes end at 16 x 5 x 5. ``bn``: the
    FedBN twin, BatchNorm after every conv and hidden FC layer (as FedBN's own models), so a
    FedBN row runs the same network as the LeNet rows it is compared with.
    """
    pad = 2 if shape.size == 28 else 0
    norm2d = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
    norm1d = (lambda c: nn.BatchNorm1d(c)) if bn else (lambda c: nn.Identity())
    body = nn.Sequential(
        nn.Conv2d(shape.channels, 6, 5, padding=pad), norm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), norm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), norm1d(120), nn.ReLU(),
        nn.Linear(120, 84), norm1d(84), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(84, shape.classes))


class RawPixels(nn.Module):
    """Undoes the dataset's input normalisation: (x - mean) / std -> x * std + mean, the pixels in
    [0, 1] that ``ToTensor`` gives, for a model whose authors feed it unnormalised images.
    No parameters and no buffers (nothing to send or average); the identity when the shape
    carries no normalisation (``InputShape.pixel_mean`` empty)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.mean, self.std = tuple(mean), tuple(std)
        self._constants: dict = {}  # (device, dtype) -> (std, mean) tensors, made once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.mean:
            return x
        key = (x.device, x.dtype)
        if key not in self._constants:
            self._constants[key] = tuple(torch.tensor(v, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
                                         for v in (self.std, self.mean))
        std, mean = self._constants[key]
        return x * std + mean


def _simple_cnn(shape: InputShape) -> Classifier:
    """NIID-Bench's simple CNN (Li, Diao, Chen, He, ICDE 2022; its ``SimpleCNN`` and
    ``SimpleCNNMNIST``, also Flower's ``baselines/niid_bench``): conv 6 and conv 16 (5x5, no
    padding), each with ReLU and 2x2 max-pool, FC 120, FC 84 (ReLU), head. 28x28 inputs flatten
    16 x 4 x 4 = 256, 32x32 ones 16 x 5 x 5 = 400 (on 32x32 it is ``lenet``'s layers; on 28x28
    ``lenet`` pads its first conv). Its inputs are raw [0, 1] pixels, as NIID-Bench's MNIST, FMNIST
    and CIFAR-10 loaders give them (``ToTensor`` only, no ``Normalize``): ``RawPixels`` undoes
    fl-drift's per-dataset normalisation first. PyTorch's default initialisation, as NIID-Bench."""
    side = ((shape.size - 4) // 2 - 4) // 2
    body = nn.Sequential(
        RawPixels(shape.pixel_mean, shape.pixel_std),
        nn.Conv2d(shape.channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * side * side, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(84, shape.classes))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with a norm after each; a 1x1 conv + norm shortcut
    when the shape changes (He et al. 2016, option B)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = norm(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


def _resnet18(shape: InputShape, bn: bool = False) -> Classifier:
    """ResNet-18 (He et al. 2016) with the CIFAR stem: one 3x3 conv (64, stride 1), no max-pool;
    four stages of two basic blocks (64, 128, 256, 512; stride 2 from the second), global
    average pooling, head Linear(512, classes). 11.2 M parameters for 10 classes.

    Normalisation: GroupNorm with 2 groups (as FL-Simulator of Sun et al., the FedSMOO code,
    which however keeps torchvision's ImageNet stem: 7x7 stride-2 conv and max-pool), since
    BatchNorm statistics do not average well across non-IID clients; ``bn=True`` gives the
    BatchNorm twin ``resnet18-bn`` for FedBN. 28x28 and 32x32 inputs both end at 4x4 before
    the pooling. Convolutions use Kaiming-normal (fan-out) initialisation as torchvision's
    ResNet does; the norms start at weight 1, bias 0, except the last norm of each residual
    branch, which starts at weight 0 (torchvision's ``zero_init_residual=True``; Goyal et al.
    2017), so every block starts as the identity. Without it the GroupNorm net diverged in its
    first steps at lr 0.05, momentum 0.9 on CIFAR-10 batches of 32 (loss 2.4 -> 12 in 3 steps);
    with it the loss fell (2.3 -> 1.7 in 10 steps).
    """
    norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.GroupNorm(2, c))
    layers: list[nn.Module] = [
        nn.Conv2d(shape.channels, 64, 3, padding=1, bias=False), norm(64), nn.ReLU(inplace=True),
    ]
    c_in = 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(c_in, c_out, stride, norm), BasicBlock(c_out, c_out, 1, norm)]
        c_in = c_out
    body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for m in body.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, BasicBlock):
            nn.init.zeros_(m.bn2.weight)
    return Classifier(body, nn.Linear(512, shape.classes))


VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def _vgg11(shape: InputShape) -> Classifier:
    """VGG-11 (Simonyan and Zisserman 2015, configuration A) for 32x32 / 28x28 inputs, as in
    FedSOL's architecture study: eight 3x3 convs (64, 128, 256, 256, 512, 512, 512, 512) with
    ReLU and five 2x2 max-pools, no normalisation; then FC 512, FC 512 (ReLU) and the head
    Linear(512, classes). 32x32 inputs reach 1x1x512 after the five pools; for 28x28 the last
    max-pool is dropped (28 -> 14 -> 7 -> 3 -> 1), so both flatten to 512. 9.8 M parameters
    for 10 classes. Convolutions: Kaiming-normal (fan-out) weights, zero biases, as the
    FedSOL code and torchvision's VGG initialise them (without normalisation the default
    PyTorch init shrinks the signal through eight layers).
    """
    cfg = VGG11[:-1] if shape.size < 32 else VGG11
    layers: list[nn.Module] = []
    c_in = shape.channels
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            conv = nn.Conv2d(c_in, v, 3, padding=1)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU(inplace=True)]
            c_in = v
    body = nn.Sequential(
        *layers, nn.Flatten(),
        nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Linear(512, 512), nn.ReLU(inplace=True),
    )
    return Classifier(body, nn.Linear(512, shape.classes))


def _mlp(shape: InputShape) -> Classifier:
    """One hidden layer of 64 units with ReLU on flat features, then the head."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(shape.size, 64), nn.ReLU())
    return Classifier(body, nn.Linear(64, shape.classes))


def _logreg(shape: InputShape) -> Classifier:
    """Multinomial logistic regression (the FedProx paper's synthetic-data model)."""
    return Classifier(nn.Flatten(), nn.Linear(shape.size, shape.classes))


def _lenet_bn(shape: InputShape) -> Classifier:
    """The lenet with BatchNorm after each conv and hidden FC layer (for FedBN)."""
    return _lenet(shape, bn=True)


def _cnn_bn(shape: InputShape) -> Classifier:
    """The cnn with BatchNorm after each conv (for FedBN)."""
    return _cnn(shape, bn=True)


def _resnet18_bn(shape: InputShape) -> Classifier:
    """The resnet18 with BatchNorm in place of GroupNorm (for FedBN)."""
    return _resnet18(shape, bn=True)


BUILDERS = {
    "cnn": _cnn,
    "cnn-small": _cnn_small,
    "lenet": _lenet,
    "lenet-bn": _lenet_bn,
    "simple-cnn": _simple_cnn,
    "cnn-bn": _cnn_bn,
    "resnet18": _resnet18,
    "resnet18-bn": _resnet18_bn,
    "vgg11": _vgg11,
    "mlp": _mlp,
    "logreg": _logreg,
}
# The models that take flat feature vectors (the synthetic dataset); every other model in
# BUILDERS takes images. The run-config schema derives its model choices from these two.
FLAT_MODELS = ("mlp", "logreg")
MODELS = tuple(BUILDERS)
IMAGE_MODELS = tuple(name for name in MODELS if name not in FLAT_MODELS)


def probe_shape(name: str) -> InputShape:
    """An input shape model ``name`` can be built with, to inspect its layers and buffers
    (which do not depend on the dataset's size or classes)."""
    return InputShape(0, 60, 10) if name in FLAT_MODELS else InputShape(3, 32, 10)


def build_model(name: str, shape: InputShape, seed: int | None = None) -> Classifier:
    """Build a fresh model; with ``seed`` its initial weights are reproducible.

    Models with convolutions keep their weights channels-last (NHWC): on CPU, PyTorch then
    runs its convolutions through oneDNN's NHWC kernels, measured 1.3-1.5x faster per
    training step and 1.8x per forward than the default layout (docs/performance.md, "What the
    code does for speed"). The
    values and shapes are the same; ``get_weights`` hands out ordinary C-ordered arrays.
    """
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; valid choices: {', '.join(BUILDERS)}")
    if seed is None:
        model = BUILDERS[name](shape)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = BUILDERS[name](shape)
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = model.to(memory_format=torch.channels_last)
    return model


_MODEL_CACHE: dict[tuple, Classifier] = {}


def cached_model(name: str, shape: InputShape, device: torch.device, slot: str = "local") -> Classifier:
    """One model object per process, model, input shape, device and slot, reused across
    clients and rounds (a simulation actor serves many).

    Callers load the full state into it before use, so reuse never leaks weights between
    clients; it only saves rebuilding modules.
    """
    key = (name, shape, str(device), slot, torch.get_default_dtype())
    if key not in _MODEL_CACHE:
        _MODEL_CACHE[key] = build_model(name, shape).to(device)
    return _MODEL_CACHE[key]


def parametrised_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that own parameters directly (Conv, Linear, BN), in forward order."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if any(True for _ in m.parameters(recurse=False))
    ]


def last_layers_param_names(model: nn.Module, n_layers: int, kind: type = nn.Linear) -> list[str]:
    """Names of the parameters of the last ``n_layers`` layers of type ``kind``."""
    layers = [(n, m) for n, m in parametrised_layers(model) if isinstance(m, kind)]
    if not 1 <= n_layers <= len(layers):
        raise ValueError(
            f"asked for the last {n_layers} {kind.__name__} layers; the model has {len(layers)}"
        )
    names = []
    for layer_name, module in layers[-n_layers:]:
        names += [f"{layer_name}.{p}" for p, _ in module.named_parameters(recurse=False)]
    return names


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def set_cuda_precision(tf32: bool) -> None:
    """TF32 for CUDA matmuls and cuDNN convolutions on (``tf32``) or off, both alike: the run
    decides it (run-config ``cuda-tf32``, recorded with the config in summary.json) instead of
    inheriting PyTorch's defaults, which enable TF32 for cuDNN convolutions but not for matmuls,
    so the same run gave 10-bit-mantissa convolutions beside full fp32 linear layers. Off (the
    default) trains in full fp32, the numbers the CPU path gives to rounding. No effect on CPU."""
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)


def get_weights(model: nn.Module) -> list:
    """Model state (parameters and buffers, in state_dict order) as numpy arrays.

    Copies: the arrays must not alias a model that is trained again later in this process.
    """
    return [t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format).numpy()
            for t in model.state_dict().values()]


def set_weights(model: nn.Module, arrays: list) -> None:
    """Load numpy arrays in state_dict order, checking count and shapes first."""
    state = model.state_dict()
    if len(arrays) != len(state):
        raise ValueError(f"got {len(arrays)} arrays for a model with {len(state)} state entries")
    new = {}
    for (name, ref), arr in zip(state.items(), arrays):
        if tuple(arr.shape) != tuple(ref.shape):
            raise ValueError(f"array for {name!r} has shape {arr.shape}, expected {tuple(ref.shape)}")
        new[name] = torch.as_tensor(arr, dtype=ref.dtype)
    model.load_state_dict(new, strict=True)
