"""The functional local updates (``tasks.functional``) against independent references.

(a) One round of each converted method equals the module-based training it replaces: a loop
    written here as ``DriftClient``'s hook loop was (``torch.optim`` on a module, the method's
    correction added to ``.grad``), on a channels-last CNN and on a BatchNorm CNN. Exactly, bit
    for bit: on CPU ``torch.func.grad`` runs the same autograd kernels as ``backward()`` and
    ``tasks.functional.optim`` the same tensor ops, in the same order, as ``torch.optim``'s
    single-tensor path. And each converted NumPyClient equals its hook-path twin through
    ``fit`` over two rounds (state in ``context.state`` and replies included). The hand
    computations of tests/test_fedprox.py, test_control_variates.py, test_fedsam.py and
    test_feddyn.py check the maths itself.
(b) A cohort of K = 3 (one ``vmap``) equals three separate ``local_round`` calls within 1e-5
    relative (float32: the batched convolutions and matmuls of vmap sum in another order, a
    few ulp per step), and a cohort of one equals ``local_round`` exactly.
(c) Clients with fewer or shorter batches are masked: each still equals its own round; a
    client with no local step (SCAFFOLD on a 1-sample lenet-bn client) keeps its c_i.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.base import DriftClient
from clients.control_variates import CI_STATE
from clients.fedasam import FedASAMClient
from clients.fedavg import FedAvgClient
from clients.feddyn import STATE as FEDDYN_STATE
from clients.feddyn import FedDynClient
from clients.fedprox import FedProxClient
from clients.fedsam import FedSAMClient
from clients.fedsmoo import FedSMOOClient
from clients.perturbation import global_norm, perturbed, sam_eps
from clients.scaffold import ScaffoldClient
from tasks.catalogue import InputShape
from tasks.functional import METHODS, Hyper, cohort_round, local_round, module_state, tree_norm
from tasks.functional.optim import opt_init, opt_step
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import build_model
from tests.conftest import fake_context, make_client
from tests.helpers_cohort import assert_cohort_client_equals

ROOT = Path(__file__).resolve().parent.parent
SHAPE = InputShape(1, 8, 10)  # MNIST-like, one channel (a channels-last quirk: keep_layout), small for speed
KEYS = {"proximal-mu": 0.3, "sam-rho": 0.05, "feddyn-alpha": 0.1}


# ----------------------------------------------------------------------------- optimisers
@pytest.mark.parametrize("optimizer,momentum,wd", [
    ("sgd", 0.0, 0.0), ("sgd", 0.9, 5e-4), ("adam", 0.0, 1e-3), ("adamw", 0.0, 1e-2)])
def test_optimiser_step_equals_torch_optim(optimizer, momentum, wd):
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(5, generator=gen)}
    ref = [torch.nn.Parameter(p.clone()) for p in params.values()]
    torch_opt = {"sgd": lambda: torch.optim.SGD(ref, lr=0.1, momentum=momentum, weight_decay=wd),
                 "adam": lambda: torch.optim.Adam(ref, lr=0.1, weight_decay=wd),
                 "adamw": lambda: torch.optim.AdamW(ref, lr=0.1, weight_decay=wd)}[optimizer]()
    hp = Hyper(lr=0.1, optimizer=optimizer, momentum=momentum, weight_decay=wd)
    state = opt_init(params, hp)
    for t in range(1, 5):
        d = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
        for p, g in zip(ref, d.values()):
            p.grad = g.clone()
        torch_opt.step()
        params, state = opt_step(params, d, state, hp, t)
        for p, q in zip(ref, params.values()):
            assert torch.equal(p.detach(), q)


def test_tree_norm_equals_global_norm():
    gen = torch.Generator().manual_seed(1)
    ts = [torch.randn(7, 3, generator=gen), torch.randn(11, generator=gen)]
    assert torch.equal(tree_norm(ts), global_norm(ts))


# --------------------------------------------------- (a) against the module-based loop
def module_round(name, model, x, y, hp, batch_size, epochs, seed, ctx):
    """The hook loop as DriftClient ran it, with each method's correction on ``.grad``."""
    params = list(model.parameters())
    w_t = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    loss_sum, steps = torch.zeros(()), 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            xb, yb = x[order[start:start + batch_size]], y[order[start:start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            if name == "fedsam":
                eps = sam_eps([p.grad for p in params], hp.keys["sam-rho"])
                with perturbed(params, eps, model):
                    for p in params:
                        p.grad = None
                    F.cross_entropy(model(xb), yb).backward()
            with torch.no_grad():
                for i, p in enumerate(params):
                    if name == "fedprox":
                        p.grad.add_(p.detach() - w_t[i], alpha=hp.keys["proximal-mu"])
                    if name == "scaffold":
                        p.grad.add_(ctx["corr"][i])
                    if name == "feddyn":
                        p.grad.sub_(ctx["grad"][i] + hp.keys["feddyn-alpha"] * w_t[i])
                        p.grad.add_(p.detach(), alpha=hp.keys["feddyn-alpha"])
            opt.step()
            loss_sum += loss.detach()
            steps += 1
    return loss_sum.item() / steps


@pytest.mark.parametrize("model_name", ["cnn-small", "cnn-bn"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_functional_round_equals_module_loop(name, model_name):
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 1, 8, 8, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    model = build_model(model_name, SHAPE, seed=0)
    params, buffers = module_state(model)
    names = list(params)
    extra = [torch.randn(p.shape, generator=gen) * 0.1 for p in params.values()]
    state, server, ctx = {}, {}, {}
    if name == "scaffold":  # c and c_i non-zero: the correction really acts
        ci = [torch.randn(p.shape, generator=gen) * 0.1 for p in params.values()]
        state, server = {"ci": dict(zip(names, ci))}, {"c": dict(zip(names, extra))}
        ctx = {"corr": [c - i for c, i in zip(extra, ci)]}
    if name == "feddyn":
        state, ctx = {"grad": dict(zip(names, extra))}, {"grad": extra}
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    result = local_round(METHODS[name], copy.deepcopy(model), params, buffers, state, server, hp,
                         x, y, 4, 2, torch.Generator().manual_seed(3))
    loss = module_round(name, model, x, y, hp, 4, 2, 3, ctx)
    assert result.metrics["train_loss"] == loss and result.metrics["num_steps"] == 6
    for n, p in model.named_parameters():
        assert torch.equal(result.params[n], p.detach()), n
    for n, b in model.named_buffers():
        assert torch.equal(result.buffers[n], b), n


# ------------------------------------- (a) the converted clients against their hook twins
class HookFedProx(DriftClient):
    """FedProx as it was before the conversion: the proximal gradient added in the hook."""

    def adjust_gradients(self) -> None:
        self.add_proximal_gradient(self.cfg["proximal-mu"])


class HookFedAvg(FedAvgClient):
    """Inherits no LOCAL_UPDATE: the hook loop."""


class HookScaffold(ScaffoldClient):
    """ControlVariateClient's hooks."""


class HookFedSAM(FedSAMClient):
    """FedSAMClient's train_step with clients.perturbation."""


class HookFedDyn(FedDynClient):
    """FedDynClient's hooks (those FedSMOO uses)."""


TWINS = {"fedavg": (FedAvgClient, HookFedAvg), "fedprox": (FedProxClient, HookFedProx),
         "scaffold": (ScaffoldClient, HookScaffold), "fedsam": (FedSAMClient, HookFedSAM),
         "feddyn": (FedDynClient, HookFedDyn)}


def test_lookup_is_not_inherited():
    assert FedSAMClient(*_client_args()).local_update() is not None
    assert FedASAMClient(*_client_args()).local_update().name == "fedasam"  # its own, not FedSAM's
    assert FedSMOOClient(*_client_args()).local_update().name == "fedsmoo"  # its own, not FedDyn's or FedSAM's
    for cls in (HookFedAvg, HookScaffold, HookFedSAM, HookFedDyn, DriftClient):
        assert cls.__dict__.get("LOCAL_UPDATE") is None and cls(*_client_args()).local_update() is None


def _client_args():
    from fl_app.registry import validate_config
    return validate_config({"dataset": "synthetic", "model": "logreg"}), fake_context(), 0, 1


@pytest.mark.parametrize("name", sorted(TWINS))
def test_client_equals_its_hook_twin(name):
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(10, 60, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    cfg = {"learning-rate": 0.1, "batch-size": 4, "local-epochs": 2, "momentum": 0.9, "weight-decay": 1e-3,
           "proximal-mu": 0.3, "feddyn-alpha": 0.1, "sam-rho": 0.05}
    new_cls, hook_cls = TWINS[name]
    new_client, hook_client = (make_client(cls, cfg, x, y) for cls in (new_cls, hook_cls))
    assert new_client.local_update() is METHODS[name] and hook_client.local_update() is None
    weights = new_client.get_parameters({})
    c = [np.full_like(w, 0.01) for w in weights] if name == "scaffold" else []
    for server_round in (1, 2):  # round 2 starts from the state round 1 left
        a, n_a, m_a = new_client.fit([w.copy() for w in weights + c], {"server-round": server_round})
        b, n_b, m_b = hook_client.fit([w.copy() for w in weights + c], {"server-round": server_round})
        assert n_a == n_b and m_a == m_b and list(m_a) == list(m_b)
        assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b))
    for key in (CI_STATE, FEDDYN_STATE):
        if key in hook_client.context.state:
            stored = zip(new_client.load_state(key), hook_client.load_state(key))
            assert all(np.array_equal(u, v) for u, v in stored)


# ------------------------------------------------------------------------ (b), (c) cohorts
def _cohort_inputs(model_name, sizes, seed=5, shape=SHAPE):
    gen = torch.Generator().manual_seed(seed)
    models = [build_model(model_name, shape, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}  # the layout vmap batches
    data = [(torch.randn(n, shape.channels, shape.size, shape.size, generator=gen),
             torch.randint(0, shape.classes, (n,), generator=gen)) for n in sizes]
    states = []
    for k in range(len(sizes)):  # non-zero client state, different per client
        p_k = unstack_tree(params, k)
        states.append({"ci": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()},
                       "grad": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()}})
    server = {"c": {n: torch.randn(v.shape[1:], generator=gen) * 0.1 for n, v in params.items()}}
    return build_model(model_name, shape).to("meta"), params, buffers, data, states, server


def _compare(name, model_name, sizes, batch_size, rel, shape=SHAPE):
    skeleton, params, buffers, data, states, server = _cohort_inputs(model_name, sizes, shape=shape)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    update, k_all = METHODS[name], len(sizes)
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, batch_size, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k], server,
                            hp, *data[k], batch_size, 2, torch.Generator().manual_seed(10 + k))
        assert_cohort_client_equals(together, k, alone, rel)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_cohort_of_three_equals_three_rounds(name):
    _compare(name, "cnn-small", [12, 12, 12], 4, rel=1e-5)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_cohort_masks_clients_with_fewer_or_shorter_batches(name):
    # 14 samples: batches 4, 4, 4, 2 per epoch; 6: 4, 2; 12: 4, 4, 4 -> 8, 4 and 6 steps
    _compare(name, "cnn-small", [14, 6, 12], 4, rel=1e-5)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_cohort_of_one_is_exact(name):
    _compare(name, "cnn-small", [10], 4, rel=0)


def test_cohort_batchnorm_buffers_per_client():
    """Running statistics stay each client's own, masked like the weights (batches of >= 4:
    BN over 2 samples is too ill-conditioned to compare rounding-level differences)."""
    _compare("fedavg", "cnn-bn", [16, 8, 12], 4, rel=1e-4)


def test_cohort_refuses_an_empty_client():
    skeleton, params, buffers, data, states, server = _cohort_inputs("cnn-small", [4, 4])
    data[1] = (data[1][0][:0], data[1][1][:0])
    with pytest.raises(ValueError, match="sizes \\[4, 0\\]"):
        cohort_round(METHODS["fedavg"], skeleton, params, buffers, states, server, Hyper(lr=0.1), data, 4, 1,
                     [torch.Generator() for _ in data])


# -------------------------------------------------------------------------- without Flower
def test_bench_runs_without_flower():
    """bench/cohort.py and tasks.functional import torch and the checkout only."""
    code = ("import sys, runpy; sys.modules['flwr'] = None; sys.modules['flwr_datasets'] = None; "
            "sys.argv = ['cohort.py', '--quick', '--models', 'cnn-small', '--clients', '2', '--samples', '8', "
            "'--reps', '1']; runpy.run_path('bench/cohort.py', run_name='__main__')")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "| `cnn-small` | fedavg | 2 |" in out.stdout


def test_cohort_skips_a_batchnorm1d_client_s_last_batch_of_one_as_its_own_round_does():
    """A lenet-bn client (BatchNorm1d after its hidden Linear layers) with 17 samples at batch 8
    has a last batch of one, skipped on both paths (tasks.train.min_train_batch): the cohort
    still equals each client's own round."""
    _compare("fedavg", "lenet-bn", [17, 16, 24], 8, rel=1e-4, shape=InputShape(1, 28, 10))


def test_scaffold_round_without_a_local_step_keeps_c_i():
    """A 1-sample client on lenet-bn takes no local step (its one batch of one is skipped:
    BatchNorm1d cannot train on it, tasks.train.min_train_batch). SCAFFOLD's option II divides
    by lr K_eff, which is 0 after no step: instead c_i+ = c_i, delta c_i = 0 and the weights stay
    w_t, on its own round and in a cohort beside a client that trains (momentum 0.9, so K_eff's
    momentum-corrected form is the one that would be 0)."""
    skeleton, params, buffers, data, states, server = _cohort_inputs("lenet-bn", [1, 9], shape=InputShape(1, 28, 10))
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    update = METHODS["scaffold"]
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, 8, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(2)])
    alone = local_round(update, skeleton, unstack_tree(params, 0), unstack_tree(buffers, 0), states[0], server, hp,
                        *data[0], 8, 2, torch.Generator().manual_seed(10))
    ci = states[0]["ci"]
    for result in (alone, together.client(0)):
        assert result.metrics["num_steps"] == 0
        assert all(torch.equal(result.params[n], p[0]) for n, p in params.items())
        assert all(torch.equal(result.state["ci"][n], v) for n, v in ci.items())
        assert all(torch.equal(d, torch.zeros_like(d)) for d in result.reply["delta_c"].values())
        assert result.metrics["ci_norm"] == pytest.approx(float(tree_norm(ci.values())), rel=1e-6)
    trained = together.client(1)  # its 8-sample batches train (the batch of one is skipped): c_i moves
    assert trained.metrics["num_steps"] == 2
    assert all(torch.isfinite(v).all() for v in trained.state["ci"].values())
    assert not torch.equal(trained.state["ci"]["head.weight"], states[1]["ci"]["head.weight"])
