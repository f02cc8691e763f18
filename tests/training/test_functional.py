"""The functional local updates (``tasks.functional``) against independent references.

(a) One round of each update equals the module-based training the clients ran before they
    became functions: a loop written here (``torch.optim`` on a module, the method's
    correction added to ``.grad``), on a channels-last CNN and on a BatchNorm CNN. Exactly, bit
    for bit: on CPU ``torch.func.grad`` runs the same autograd kernels as ``backward()`` and
    ``tasks.functional.optim`` the same tensor ops, in the same order, as ``torch.optim``'s
    single-tensor path. And each client, through ``fit`` over two rounds (state in
    ``context.state`` and replies included), equals its round written out in float64 on
    logistic regression. The hand computations of tests/methods/test_fedprox.py,
    test_control_variates.py, test_fedsam.py and test_feddyn.py check the maths further.
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

from clients import control_variates, feddyn, scaffold
from fl_app.node.drift_client import DriftClient
from fl_app.registry import METHODS, get_method, validate_config
from tasks.catalogue import InputShape
from tasks.functional import Hyper, LocalUpdate, Round, cohort_round, local_round, module_state, tree_norm
from tasks.functional.optim import opt_init, opt_step
from tasks.functional.rounds import unstack_tree
from tasks.models import build_model
from tests.kit import fake_context, make_client
from tests.kit_training import (
    COHORT_KEYS,
    COHORT_NAMES,
    COHORT_SHAPE,
    COHORT_UPDATES,
    client_batches,
    cohort_inputs,
    compare_cohort,
    foreach_norm,
    module_round,
    module_sam_eps,
    perturbed,
    sgd_round64,
    softmax_regression_grad,
    softmax_regression_loss,
)

ROOT = Path(__file__).resolve().parents[2]


def client_class(name: str):
    """The update method ``name``'s client runs (the registry's), as ``make_client`` takes it."""
    return get_method(name).update


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


def test_tree_norm_is_the_norm_of_the_concatenation():
    """By hand (3, 0, 4: 5), and bit for bit the norm of ``torch._foreach_norm``'s per-tensor
    norms (the kernel a module's clients used)."""
    assert float(tree_norm([torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])])) == 5.0
    gen = torch.Generator().manual_seed(1)
    ts = [torch.randn(7, 3, generator=gen), torch.randn(11, generator=gen)]
    assert torch.equal(tree_norm(ts), foreach_norm(ts))
    assert torch.allclose(tree_norm(ts), torch.linalg.vector_norm(torch.cat([t.flatten() for t in ts])))


# --------------------------------------------------- (a) against the module-based loop
def corrected_step(name: str, w_t: list[torch.Tensor]):
    """The step of the module-based loop the clients ran before they became functions
    (``tests.kit_training.module_round``), each method's correction on ``.grad``; ``w_t`` the
    weights the round started from."""
    def step(model, xb, yb, keys, ctx):
        params = list(model.parameters())
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        if name == "fedsam":
            eps = module_sam_eps([p.grad for p in params], keys["sam-rho"])
            with perturbed(params, eps, model):
                for p in params:
                    p.grad = None
                F.cross_entropy(model(xb), yb).backward()
        with torch.no_grad():
            for i, p in enumerate(params):
                if name == "fedprox":
                    p.grad.add_(p.detach() - w_t[i], alpha=keys["proximal-mu"])
                if name == "scaffold":
                    p.grad.add_(ctx["corr"][i])
                if name == "feddyn":
                    p.grad.sub_(ctx["grad"][i] + keys["feddyn-alpha"] * w_t[i])
                    p.grad.add_(p.detach(), alpha=keys["feddyn-alpha"])
        return loss.detach()

    return step


@pytest.mark.parametrize("model_name", ["cnn-small", "cnn-bn"])
@pytest.mark.parametrize("name", COHORT_NAMES)
def test_functional_round_equals_module_loop(name, model_name):
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 1, 8, 8, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    model = build_model(model_name, COHORT_SHAPE, seed=0)
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
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=COHORT_KEYS)
    result = local_round(Round(COHORT_UPDATES[name], copy.deepcopy(model), params, buffers, state, server, hp,
                         x, y, 4, 2, torch.Generator().manual_seed(3)))
    w_t = [p.detach().clone() for p in model.parameters()]
    loss = module_round(corrected_step(name, w_t), model, x, y, hp, 4, 2, 3, ctx)
    assert result.metrics["train_loss"] == loss and result.metrics["num_steps"] == 6
    for n, p in model.named_parameters():
        assert torch.equal(result.params[n], p.detach()), n
    for n, b in model.named_buffers():
        assert torch.equal(result.buffers[n], b), n


# ------------------------- (a) each client through fit against its float64 round by hand
def _lookup_args(model="logreg"):
    return validate_config({"dataset": "synthetic", "model": model}), fake_context(), 0, 1


def test_each_client_runs_its_method_s_update_and_anything_else_is_refused():
    """A method's client runs the ``LocalUpdate`` the registry names for it: its own (FedASAM's
    not FedSAM's, FedSMOO's neither FedDyn's nor FedSAM's), FedAvg's for the server-side
    methods on FedAvg's client. A client given anything but a ``LocalUpdate`` (here the method
    pair itself) is refused in one line when it is built, before it trains."""
    fedavg = get_method("fedavg").update
    for name, method in METHODS.items():
        assert isinstance(method.update, LocalUpdate)
        assert method.update.name == name or method.update is fedavg, name
        assert DriftClient(method.update, *_lookup_args()).update is method.update
    direction = {name: get_method(name).update.direction for name in ("fedasam", "fedsam", "fedsmoo", "feddyn")}
    assert direction["fedasam"] is not direction["fedsam"]
    assert direction["fedsmoo"] not in (direction["feddyn"], direction["fedsam"])
    with pytest.raises(TypeError, match="a client runs a tasks.functional LocalUpdate") as err:
        DriftClient(get_method("fedavg"), *_lookup_args())
    assert "\n" not in str(err.value)


KEYS_64 = {"proximal-mu": 0.3, "feddyn-alpha": 0.1, "sam-rho": 0.05}
CLIENTS = ("fedavg", "fedprox", "scaffold", "fedsam", "feddyn")


def _direction64(name, x, y, w_t, ctx):
    """The method's direction on logreg in float64, and the loss at w: g = the closed-form
    cross-entropy gradient, corrected as the method says (``ctx``: c and c_i, g_k)."""
    def direction(w, idx):
        xb, yb = x[idx], y[idx]
        g = list(softmax_regression_grad(xb, yb, *w))
        if name == "fedprox":
            g = [gi + KEYS_64["proximal-mu"] * (wi - w0) for gi, wi, w0 in zip(g, w, w_t)]
        if name == "scaffold":
            g = [gi + c - ci for gi, c, ci in zip(g, ctx["c"], ctx["ci"])]
        if name == "fedsam":
            scale = KEYS_64["sam-rho"] / (np.sqrt(sum((gi**2).sum() for gi in g)) + 1e-12)
            g = list(softmax_regression_grad(xb, yb, *[wi + scale * gi for wi, gi in zip(w, g)]))
        if name == "feddyn":
            alpha = KEYS_64["feddyn-alpha"]
            g = [gi - (gk + alpha * w0) + alpha * wi for gi, gk, w0, wi in zip(g, ctx["gk"], w_t, w)]
        return g, softmax_regression_loss(xb, yb, *w)
    return direction


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_client_two_rounds_equal_the_float64_round_by_hand(name):
    """Two rounds through ``fit`` (SGD with momentum and weight decay, 6 steps of batches 4, 4, 2),
    the client's state in ``context.state`` carried from round 1 to round 2, against the round
    written out in float64 on logreg: its weights, its reply (SCAFFOLD: weights, then delta c_i
    = c_i+ - c_i with c_i+ = c_i - c + (w_t - w) / (lr K_eff), K_eff = sum_s (1 - m^s)/(1 - m)),
    its stored state (c_i+; FedDyn's g_k <- g_k - alpha (w - w_t)) and its fit metrics."""
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(10, 60, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    lr, m, wd = 0.1, 0.9, 1e-3
    cfg = {"learning-rate": lr, "batch-size": 4, "local-epochs": 2, "momentum": m, "weight-decay": wd, **KEYS_64}
    client = make_client(client_class(name), cfg, x, y)
    sent = client.get_parameters({})
    c = [np.full_like(a, 0.01) for a in sent]
    ctx = {"c": [a.astype(np.float64) for a in c], "ci": [np.zeros(a.shape) for a in sent],
           "gk": [np.zeros(a.shape) for a in sent]}
    x64, y_np = x.double().numpy(), y.numpy()
    for server_round in (1, 2):
        order = client_batches(client, server_round)
        reply, n, metrics = client.fit([a.copy() for a in sent] + (c if name == "scaffold" else []),
                                       {"server-round": server_round})
        w_t = [a.astype(np.float64) for a in sent]
        w, loss, steps = sgd_round64(w_t, order, _direction64(name, x64, y_np, w_t, ctx), lr, m, wd)
        assert n == 10 and steps == metrics["num_steps"] == 6
        assert metrics["train_loss"] == pytest.approx(loss, rel=1e-5)
        for got, want in zip(reply[:2], w):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        if name == "scaffold":
            k_eff = sum((1 - m**s) / (1 - m) for s in range(1, steps + 1))
            ci_new = [ci - cc + (a - b) / (lr * k_eff) for ci, cc, a, b in zip(ctx["ci"], ctx["c"], w_t, w)]
            assert len(reply) == 4
            for got, want, old in zip(reply[2:], ci_new, ctx["ci"]):
                np.testing.assert_allclose(got, want - old, rtol=1e-4, atol=1e-5)
            for got, want in zip(client.load_state(scaffold.UPDATE.state["ci"].record), ci_new):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            assert metrics["ci_norm"] == pytest.approx(np.sqrt(sum((a**2).sum() for a in ci_new)), rel=1e-4)
            ctx["ci"] = ci_new
        else:
            assert len(reply) == 2
        if name == "feddyn":
            gk = [g - KEYS_64["feddyn-alpha"] * (a - b) for g, a, b in zip(ctx["gk"], w, w_t)]
            for got, want in zip(client.load_state(feddyn.UPDATE.state["grad"].record), gk):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
            assert metrics["feddyn_grad_norm"] == pytest.approx(np.sqrt(sum((a**2).sum() for a in gk)), rel=1e-4)
            ctx["gk"] = gk
        # round 2 from another global model, as a server's mean would be
        sent = [(a + 0.01).astype(np.float32) for a in reply[:2]]
    if name in ("scaffold", "feddyn"):  # round 2 really started from a non-zero state
        assert max(np.abs(a).max() for a in ctx["ci" if name == "scaffold" else "gk"]) > 1e-3


# ------------------------------------------------------------------------ (b), (c) cohorts
@pytest.mark.parametrize("name", COHORT_NAMES)
def test_cohort_of_three_equals_three_rounds(name):
    compare_cohort(name, "cnn-small", [12, 12, 12], 4, rel=1e-5)


@pytest.mark.parametrize("name", COHORT_NAMES)
def test_cohort_masks_clients_with_fewer_or_shorter_batches(name):
    # 14 samples: batches 4, 4, 4, 2 per epoch; 6: 4, 2; 12: 4, 4, 4 -> 8, 4 and 6 steps
    compare_cohort(name, "cnn-small", [14, 6, 12], 4, rel=1e-5)


@pytest.mark.parametrize("name", COHORT_NAMES)
def test_cohort_of_one_is_exact(name):
    compare_cohort(name, "cnn-small", [10], 4, rel=0)


def test_cohort_batchnorm_buffers_per_client():
    """Running statistics stay each client's own, masked like the weights (batches of >= 4:
    BN over 2 samples is too ill-conditioned to compare rounding-level differences)."""
    compare_cohort("fedavg", "cnn-bn", [16, 8, 12], 4, rel=1e-4)


def test_cohort_refuses_an_empty_client():
    skeleton, params, buffers, data, states, server = cohort_inputs("cnn-small", [4, 4])
    data[1] = (data[1][0][:0], data[1][1][:0])
    with pytest.raises(ValueError, match="sizes \\[4, 0\\]"):
        cohort_round(COHORT_UPDATES["fedavg"], skeleton, params, buffers, states, server, Hyper(lr=0.1), data, 4, 1,
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
    compare_cohort("fedavg", "lenet-bn", [17, 16, 24], 8, rel=1e-4, shape=InputShape(1, 28, 10))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_control_variate_update_after_no_step_keeps_c_i(momentum):
    """``control_variate_update`` after 0 local steps: K_eff = 0 (plain SGD and heavy ball alike),
    so option II's division is skipped and c_i+ = c_i exactly, finite, a new tensor (not the
    kept one, which the caller may go on writing)."""
    gen = torch.Generator().manual_seed(7)
    w_t, c, ci = ({"w": torch.randn(3, 2, generator=gen)} for _ in range(3))
    new = control_variates.control_variate_update(w_t, w_t, c, ci, 0, 0.05, momentum)
    assert torch.equal(new["w"], ci["w"]) and new["w"].data_ptr() != ci["w"].data_ptr()
    moved = control_variates.control_variate_update(w_t, {"w": w_t["w"] - 0.1}, c, ci, 1, 0.05, momentum)
    torch.testing.assert_close(moved["w"], ci["w"] - c["w"] + 0.1 / 0.05)  # one step: K_eff = 1


def test_scaffold_round_without_a_local_step_keeps_c_i():
    """A 1-sample client on lenet-bn takes no local step (its one batch of one is skipped:
    BatchNorm1d cannot train on it, tasks.train.min_train_batch). SCAFFOLD's option II divides
    by lr K_eff, which is 0 after no step: instead c_i+ = c_i, delta c_i = 0 and the weights stay
    w_t, on its own round and in a cohort beside a client that trains (momentum 0.9, so K_eff's
    momentum-corrected form is the one that would be 0)."""
    skeleton, params, buffers, data, states, server = cohort_inputs("lenet-bn", [1, 9], shape=InputShape(1, 28, 10))
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=COHORT_KEYS)
    update = COHORT_UPDATES["scaffold"]
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, 8, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(2)])
    alone = local_round(Round(update, skeleton, unstack_tree(params, 0), unstack_tree(buffers, 0), states[0], server, hp,
                        *data[0], 8, 2, torch.Generator().manual_seed(10)))
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
