"""The larger CIFAR models (resnet18, resnet18-bn, vgg11): shapes, parameter counts, the
body/head split the methods rely on, and two rounds of `flwr run` with each."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters
from torch import nn

from fl_app.config import ConfigError
from fl_app.node.node_client import NodeClient
from fl_app.registry import get_method, validate_config
from protocol.layout import bn_indices
from strategies.base import fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights, last_layers_param_names, set_weights
from tests.kit import make_client
from tests.kit_runs import local_simulation

LARGE = ("resnet18", "resnet18-bn", "vgg11")


@pytest.mark.parametrize("name", LARGE)
@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_forward_shapes_and_body_head_split(name, dataset):
    shape = input_shape(dataset)
    model = build_model(name, shape, seed=0).eval()
    x = torch.randn(3, shape.channels, shape.size, shape.size)
    with torch.no_grad():
        z = model.body(x)
        logits = model(x)
    assert z.shape == (3, 512) and logits.shape == (3, shape.classes)
    assert isinstance(model.head, nn.Linear) and model.head.in_features == 512
    torch.testing.assert_close(model.head(z), logits)
    # the head is the last parametrised layer, as FedSOL / FedPVR expect
    assert last_layers_param_names(model, 1) == ["head.weight", "head.bias"]


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_match_a_hand_count():
    # ResNet-18, CIFAR stem, 10 classes: the widely quoted 11,173,962 (1x1-conv shortcuts)
    assert _count(build_model("resnet18", input_shape("cifar10"))) == 11_173_962
    assert _count(build_model("resnet18-bn", input_shape("cifar10"))) == 11_173_962
    # the 1-channel stem has 64 * 9 * 2 fewer weights
    assert _count(build_model("resnet18", input_shape("mnist"))) == 11_173_962 - 64 * 9 * 2
    # VGG-11: convs 3-64-128-256-256-512-512-512-512 (3x3, with bias), FC 512-512, head 512-10
    widths = [3, 64, 128, 256, 256, 512, 512, 512, 512]
    convs = sum(a * b * 9 + b for a, b in itertools.pairwise(widths))
    assert _count(build_model("vgg11", input_shape("cifar10"))) == convs + 2 * (512 * 512 + 512) + 512 * 10 + 10


def test_lenet_bn_is_lenet_plus_batchnorm():
    plain = build_model("lenet", input_shape("mnist"), seed=0)
    twin = build_model("lenet-bn", input_shape("mnist"), seed=0)
    # LeNet-5 on 28x28 (padding 2): conv 1-6, conv 6-16, FC 400-120-84, head 84-10
    lenet = (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    assert _count(plain) == lenet
    assert _count(twin) == lenet + 2 * (6 + 16 + 120 + 84)  # a weight and a bias per BN channel
    assert len(bn_indices(twin)) == 4 * 5 and not bn_indices(plain)
    # the same draws initialise the shared layers: only the BN layers are new
    shared = [p for p in twin.parameters() if p.dim() > 1]
    assert all(torch.equal(a, b) for a, b in zip(shared, [p for p in plain.parameters() if p.dim() > 1]))


def test_resnet18_norms():
    gn = build_model("resnet18", input_shape("cifar10"))
    bn = build_model("resnet18-bn", input_shape("cifar10"))
    groups = [m for m in gn.modules() if isinstance(m, nn.GroupNorm)]
    # stem + 8 blocks x 2 + 3 shortcut projections
    assert len(groups) == 20 and all(m.num_groups == 2 for m in groups)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gn.modules())
    assert len([m for m in bn.modules() if isinstance(m, nn.BatchNorm2d)]) == 20
    assert not any(isinstance(m, nn.MaxPool2d) for m in gn.modules())  # CIFAR stem
    stem = gn.body[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert len(bn_indices(bn)) == 20 * 5  # weight, bias, running mean/var, num_batches_tracked


def test_resnet18_blocks_start_as_identity_and_first_steps_do_not_diverge():
    """Zero-initialised last norm of each residual branch: at lr 0.05 and momentum 0.9 the
    GroupNorm net's loss rose from 2.4 to over 10 within 3 steps without it."""
    for name in ("resnet18-bn", "resnet18"):
        model = build_model(name, input_shape("cifar10"), seed=0)
        blocks = [m for m in model.modules() if m.__class__.__name__ == "BasicBlock"]
        assert len(blocks) == 8 and all(torch.count_nonzero(b.bn2.weight) == 0 for b in blocks)
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert max(losses) < 3.0, losses


@pytest.mark.parametrize("name", LARGE)
def test_channels_last_weights_give_the_same_outputs(name):
    shape = input_shape("cifar10")
    model = build_model(name, shape, seed=0).eval()
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    plain = build_model(name, shape).eval()
    set_weights(plain, get_weights(model))
    plain = plain.to(memory_format=torch.contiguous_format)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=1e-4, atol=1e-4)


def _fit(method: str, model: str, **over):
    """One local round of ``method`` on 4 random CIFAR-10-sized samples (one step); the reply."""
    cfg = {"strategy": method, "dataset": "cifar10", "model": model, "batch-size": 4, "local-epochs": 1,
           "learning-rate": 0.01, **over}
    full = validate_config(cfg)
    w0 = get_weights(build_model(full["model"], input_shape("cifar10"), seed=0))
    strategy_cls, update = get_method(method)
    strategy_cls.from_config(full, **fedavg_kwargs(full, ndarrays_to_parameters(w0), None))  # refuses misfits
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    client = make_client(update, {k: v for k, v in full.items() if k != "strategy"}, x, y)
    out, n, metrics = client.fit([a.copy() for a in w0], {"server-round": 1})
    assert n == 4 and metrics["num_steps"] == 1 and math.isfinite(metrics["train_loss"])
    assert all(np.isfinite(a).all() for a in out)
    assert any(not np.array_equal(a, b) for a, b in zip(out, w0))
    return w0, out, client


METHOD_CASES = [("fedsol", {"fedsol-perturb": "head"}), ("fedsol", {"fedsol-perturb": "all"}),
                ("moon", {}), ("fedpvr", {}), ("fedpgvc", {"pgvc-layers": 1})]


# ResNet-18 steps cost about 4x VGG-11's on CPU: its runs are in the slow set
@pytest.mark.parametrize("model,method,over", [
    *[("vgg11", m, o) for m, o in METHOD_CASES],
    *[pytest.param("resnet18", m, o, marks=pytest.mark.slow) for m, o in METHOD_CASES],
])
def test_head_methods_run_on_the_large_models(model, method, over):
    w0, out, client = _fit(method, model, **over)
    n_state = len(w0)
    assert [a.shape for a in out[:n_state]] == [a.shape for a in w0]
    if method == "fedpvr":  # control variates only for the head (pvr-layers = 1)
        assert [a.shape for a in out[n_state:]] == [w0[-2].shape, w0[-1].shape]
    if method == "moon":  # a second round uses the contrastive term on model.body
        out2, _, metrics = NodeClient(client).fit(out, {"server-round": 2})
        assert all(np.isfinite(a).all() for a in out2) and metrics["state_arrays_in"] > 0


def test_fedpgvc_default_masks_two_linear_layers_of_vgg11():
    model = build_model("vgg11", input_shape("cifar10"))
    assert last_layers_param_names(model, 2) == ["body.24.weight", "body.24.bias", "head.weight", "head.bias"]
    _fit("fedpgvc", "vgg11")


def test_fedpgvc_default_refuses_resnet18_with_one_linear_layer():
    cfg = validate_config({"strategy": "fedpgvc", "dataset": "cifar10", "model": "resnet18"})
    w0 = get_weights(build_model("resnet18", input_shape("cifar10")))
    with pytest.raises(ConfigError, match="'pgvc-layers' = 2 is invalid for model 'resnet18'.*has 1"):
        get_method("fedpgvc").strategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))


def test_fedbn_runs_resnet18_bn_and_refuses_resnet18_naming_its_twin():
    with pytest.raises(ConfigError, match="set model = 'resnet18-bn'"):
        _fit("fedbn", "resnet18")
    w0, out, client = _fit("fedbn", "resnet18-bn")
    stored = client.load_state(client.update.personal.record)
    assert len(stored) == 100
    idx = bn_indices(client.model)
    assert all(np.array_equal(out[i], s) for i, s in zip(idx, stored))
    with pytest.raises(ConfigError, match="FedBN needs a model with batch-norm layers; valid choices: lenet-bn, cnn-bn, resnet18-bn"):
        cfg = validate_config({"strategy": "fedbn", "dataset": "cifar10", "model": "vgg11"})
        get_method("fedbn").strategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))


# ------------------------------------------------------------------ two rounds of flwr run
def _tiny_data_dir(shared_data, tmp_path, dataset: str, train: int = 96, test: int = 64):
    """A data-dir with a random subset of the real dataset (hub schema), so two rounds of a
    large model stay short: 2 clients x 48 samples, evaluation on 64 test images."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    (tmp_path / "data" / dataset).mkdir(parents=True)
    for split, rows in (("train", train), ("test", test)):
        table = pq.read_table(shared_data / dataset / f"{split}.parquet")
        pq.write_table(table.take(rng.choice(table.num_rows, size=rows, replace=False)),
                       tmp_path / "data" / dataset / f"{split}.parquet")
    return tmp_path / "data"


@pytest.fixture(scope="module")
def sim():
    simulation = local_simulation()
    simulation.start()
    yield simulation
    assert simulation.close() == [], "processes survived the simulation"


@pytest.mark.slow
@pytest.mark.parametrize("model,dataset,augment", [
    ("resnet18", "cifar10", "crop,flip,cutout"),
    ("vgg11", "mnist", "crop"),
])
def test_flwr_run_two_rounds(sim, shared_data, tmp_path, model, dataset, augment):
    from runner.results.report import read_metrics

    data = _tiny_data_dir(shared_data, tmp_path, dataset)
    cfg = {"strategy": "fedavg", "dataset": dataset, "model": model, "augment": augment,
           "partitioner": "iid", "num-server-rounds": 2, "fraction-fit": 1.0, "min-available-clients": 2,
           "batch-size": 16, "learning-rate": 0.01, "momentum": 0.9, "data-dir": str(data),
           "results-dir": str(tmp_path), "run-name": model}
    lines: list[str] = []
    assert sim.run(cfg, num_supernodes=2, on_line=lines.append) == 0, "\n".join(lines[-30:])
    rows = read_metrics(tmp_path / model)
    assert [r["round"] for r in rows] == [1, 2], "\n".join(lines[-30:])
    for r in rows:
        assert r["num_clients"] == 2 and r["num_failures"] == 0 and r["num_rejected"] == 0
        assert math.isfinite(r["test_loss"]) and math.isfinite(r["train_loss"])
