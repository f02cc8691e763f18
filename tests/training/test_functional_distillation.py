"""FedNTD and MOON as functional local updates (clients/fedntd.py, clients/moon.py).

(a) Hand computations: one round of each on a tiny Linear model against the formula written
    out here in float64 (explicit not-true gather, KL as sum p (log p - log q); MOON's cosine
    similarities by hand). And each client through ``fit`` equals the module-based training it
    ran before it became functions (written here as the reference: ``torch.optim`` on a module,
    frozen eval-mode copies) bit for bit over two rounds, on a BatchNorm CNN.
(b) A cohort of K = 3 clients of different sizes (one vmap) equals three ``local_round`` calls
    within 1e-5 relative (float32; vmap's batched kernels sum in another order; 1e-4 with
    BatchNorm, whose gradient over small batches is ill-conditioned, as tests/training/test_functional.py),
    and a cohort of one equals it exactly.
(c) MOON's state: round 1 (no previous model) is plain cross-entropy, exactly FedAvg's round;
    round 2 uses the model round 1 ended with; a cohort mixes clients with and without one.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clients import fedavg, fedntd, moon
from clients.fedntd import not_true, ntd_loss
from tasks.catalogue import InputShape
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import Classifier, build_model, set_weights
from tests.kit import assert_cohort_client_equals, make_client
from tests.kit_training import client_batches, frozen, module_fit

SHAPE = InputShape(1, 8, 10)
KEYS = {"ntd-beta": 1.5, "ntd-tau": 2.0, "moon-mu": 2.0, "moon-temperature": 0.5}
FEDAVG, FEDNTD, MOON = fedavg.UPDATE, fedntd.UPDATE, moon.UPDATE
UPDATES = {"fedntd": FEDNTD, "moon": MOON}
MOON_RECORD = MOON.state["prev"].record  # the previous local model's record in context.state


# ------------------------------------------------------------------ (a) by hand, float64
def tiny_linear(seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(nn.Flatten(), nn.Linear(5, 4))


def test_not_true_equals_dropping_the_true_column():
    logits = torch.arange(12.0).view(3, 4)
    y = torch.tensor([0, 2, 3])
    assert torch.equal(not_true(logits, y), torch.tensor([[1.0, 2, 3], [4, 5, 7], [8, 9, 10]]))


def test_fedntd_round_by_hand():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 5, generator=gen), torch.tensor([0, 1, 2, 3, 0, 1])
    model = tiny_linear()
    params, buffers = module_state(model)
    lr, beta, tau = 0.4, KEYS["ntd-beta"], KEYS["ntd-tau"]
    hp = Hyper(lr=lr, keys=KEYS)
    result = local_round(Round(FEDNTD, model, params, buffers, {}, {}, hp, x, y, 6, 2, torch.Generator().manual_seed(1)))
    # by hand: z = x W^T + b; drop column y; KL(q_g || q_l) = sum q_g (log q_g - log q_l)
    W0, b0 = params["head.weight"].double(), params["head.bias"].double()
    W, b = W0.clone(), b0.clone()
    xd = x.double()
    other = [[c for c in range(4) if c != t] for t in y.tolist()]
    losses = []
    for _ in range(2):  # two full-batch steps (the batch order does not matter)
        W.requires_grad_(), b.requires_grad_()
        z, zg = xd @ W.T + b, xd @ W0.T + b0
        kl = 0.0
        for i, cols in enumerate(other):
            ql = torch.softmax(z[i, cols] / tau, 0)
            qg = torch.softmax(zg[i, cols] / tau, 0)
            kl = kl + (qg * (qg.log() - ql.log())).sum()
        ce = -torch.log_softmax(z, 1)[torch.arange(6), y].mean()
        loss = ce + beta * tau**2 * kl / 6
        gW, gb = torch.autograd.grad(loss, (W, b))
        losses.append(loss.item())
        W, b = (W - lr * gW).detach(), (b - lr * gb).detach()
    np.testing.assert_allclose(result.params["head.weight"], W.float(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(result.params["head.bias"], b.float(), rtol=0, atol=1e-6)
    assert result.metrics["train_loss"] == pytest.approx(sum(losses) / 2, rel=1e-6)
    assert result.state == {} and result.reply == {}
    # the distillation term acts: plain cross-entropy steps end elsewhere
    plain = local_round(Round(FEDAVG, model, params, buffers, {}, {}, hp, x, y, 6, 2, torch.Generator().manual_seed(1)))
    assert (plain.params["head.weight"] - result.params["head.weight"]).abs().max() > 1e-3


def mlp(seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(nn.Sequential(nn.Linear(5, 3), nn.ReLU()), nn.Linear(3, 4))


def test_moon_rounds_by_hand_and_state():
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 5, generator=gen), torch.tensor([0, 1, 2, 3, 0, 1])
    model = mlp()
    params, buffers = module_state(model)
    lr, mu, T = 0.3, KEYS["moon-mu"], KEYS["moon-temperature"]
    hp = Hyper(lr=lr, keys=KEYS)

    # (c) round 1, no previous model: exactly FedAvg's round; the state is the final weights
    r1 = local_round(Round(MOON, model, params, buffers, {}, {}, hp, x, y, 3, 1, torch.Generator().manual_seed(3)))
    plain = local_round(Round(FEDAVG, model, params, buffers, {}, {}, hp, x, y, 3, 1, torch.Generator().manual_seed(3)))
    assert r1.metrics == plain.metrics
    for n in params:
        assert torch.equal(r1.params[n], plain.params[n]) and torch.equal(r1.state["prev"][n], r1.params[n])

    # round 2 from another w_t, the previous model r1's: one full-batch step, by hand in float64
    w_t = {n: p + 0.1 * torch.randn(p.shape, generator=gen) for n, p in r1.params.items()}
    r2 = local_round(Round(MOON, model, w_t, buffers, r1.state, {}, hp, x, y, 6, 1, torch.Generator()))
    w = {n: p.double().requires_grad_() for n, p in w_t.items()}
    g = {n: p.double() for n, p in w_t.items()}
    prev = {n: p.double() for n, p in r1.params.items()}

    def body(p):
        return torch.relu(x.double() @ p["body.0.weight"].T + p["body.0.bias"])

    def cos(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    z, zg, zp = body(w), body(g), body(prev)
    logits = z @ w["head.weight"].T + w["head.bias"]
    ce = -torch.log_softmax(logits, 1)[torch.arange(6), y].mean()
    pos, neg = cos(z, zg) / T, cos(z, zp) / T
    con = -(pos - torch.log(torch.exp(pos) + torch.exp(neg))).mean()
    loss = ce + mu * con
    grads = torch.autograd.grad(loss, list(w.values()))
    for (n, p), gr in zip(w.items(), grads):
        np.testing.assert_allclose(r2.params[n], (p - lr * gr).detach().float(), rtol=0, atol=1e-6, err_msg=n)
    assert r2.metrics["train_loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert con.item() > 0.1 and mu * con.item() > 0.1 * ce.item()  # the contrastive term matters here
    assert all(torch.equal(r2.state["prev"][n], r2.params[n]) for n in params)
    assert set(r2.state["prev"]) == set(params) | set(buffers)  # weights and buffers: the whole model


# ------------------- (a) the clients against the module-based training they replace
def module_fedntd_step(global_model, cfg):
    """FedNTD's module-based step: the global model a frozen eval-mode copy of w_t, the
    not-true columns by a boolean mask, CE + beta tau^2 KL backpropagated."""
    def step(model, x, y):
        logits = model(x)
        with torch.no_grad():
            global_logits = global_model(x)
        keep = torch.ones_like(logits, dtype=torch.bool)
        keep[torch.arange(len(y)), y] = False
        c = logits.shape[1] - 1
        tau = cfg["ntd-tau"]
        log_q_local = F.log_softmax(logits[keep].view(len(y), c) / tau, dim=1)
        q_global = F.softmax(global_logits[keep].view(len(y), c) / tau, dim=1)
        ntd = F.kl_div(log_q_local, q_global, reduction="batchmean") * tau**2
        loss = F.cross_entropy(logits, y) + cfg["ntd-beta"] * ntd
        loss.backward()
        return loss.detach()
    return step


def module_moon_step(global_model, prev_model, cfg):
    """MOON's module-based step: eval-mode frozen copies of w_t and of the previous local model
    (none in a client's first round: plain cross-entropy)."""
    def step(model, x, y):
        z = model.body(x)
        loss = F.cross_entropy(model.head(z), y)
        if prev_model is not None:
            with torch.no_grad():
                z_glob, z_prev = global_model.body(x), prev_model.body(x)
            pos = F.cosine_similarity(z, z_glob, dim=1)
            neg = F.cosine_similarity(z, z_prev, dim=1)
            logits = torch.stack([pos, neg], dim=1) / cfg["moon-temperature"]
            loss = loss + cfg["moon-mu"] * F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long))
        loss.backward()
        return loss.detach()
    return step


@pytest.mark.parametrize("name", ["fedntd", "moon"])
def test_client_equals_the_module_based_training(name):
    """Two rounds on ``lenet-bn`` (channels-last convolutions, BatchNorm) through ``fit``, bit for
    bit against the module-based training written above: round 2 starts from other weights and
    BN statistics than round 1 ended with, so the global model's buffers (sent) and MOON's
    previous model's (kept, from round 1's final model) are both read, in eval mode."""
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(10, 1, 28, 28, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    cfg = {"dataset": "mnist", "model": "lenet-bn", "learning-rate": 0.05, "batch-size": 4, "local-epochs": 1,
           "momentum": 0.9, "weight-decay": 1e-3, **KEYS}
    client = make_client(UPDATES[name], cfg, x, y)
    assert client.update is UPDATES[name]
    reference = copy.deepcopy(client.model)
    weights, prev = client.get_parameters({}), None
    for server_round in (1, 2):
        order = client_batches(client, server_round)
        set_weights(reference, weights)
        global_model = frozen(reference)
        step = (module_fedntd_step(global_model, client.cfg) if name == "fedntd"
                else module_moon_step(global_model, prev, client.cfg))
        want, m_want = module_fit(reference, weights, x, y, order, client.cfg, cfg["learning-rate"], step)
        got, n, m_got = client.fit([w.copy() for w in weights], {"server-round": server_round})
        assert n == 10 and m_got == m_want
        assert all(np.array_equal(u, v) for u, v in zip(got, want))
        if name == "moon":
            assert all(np.array_equal(u, v) for u, v in zip(client.load_state(MOON_RECORD), want))
            prev = frozen(reference)
        # the next round's w_t: other weights and BN statistics (a server's mean would be)
        weights = [(u + 0.01 * np.random.default_rng(server_round).standard_normal(u.shape)).astype(u.dtype)
                   if u.dtype.kind == "f" else u for u in got]


def test_frozen_model_without_its_buffers_is_refused():
    """A BN model's global model needs the buffers it was sent: strict, never the skeleton's."""
    model = build_model("cnn-bn", SHAPE, seed=0)
    params, buffers = module_state(model)
    x, y = torch.randn(4, 1, 8, 8), torch.arange(4)
    with pytest.raises(RuntimeError, match="[Mm]issing key"):
        local_round(Round(FEDNTD, model, params, buffers, {}, {}, Hyper(lr=0.1, keys=KEYS), x, y, 4, 1, torch.Generator()))


def _ntd_by_hand(local: np.ndarray, glob: np.ndarray, y: np.ndarray, tau: float) -> tuple[float, np.ndarray]:
    """FedNTD's distillation term in float64 from its formula (METHODS.md, clients/fedntd.py),
    tau^2 KL(q_g || q_l) averaged over the batch, q = softmax(z_nt / tau) over the not-true
    logits (each sample's true-class column deleted), and its gradient with respect to the local
    logits: tau (q_l - q_g) / B on the not-true columns, 0 on the true one."""
    loss, grad = 0.0, np.zeros_like(local)
    for i, t in enumerate(y):
        others = [c for c in range(local.shape[1]) if c != t]
        q_l, q_g = (np.exp(z[i, others] / tau) / np.exp(z[i, others] / tau).sum() for z in (local, glob))
        loss += tau**2 * (q_g * (np.log(q_g) - np.log(q_l))).sum() / len(y)
        grad[i, others] = tau * (q_l - q_g) / len(y)
    return loss, grad


def _ntd_by_kl_div(local: torch.Tensor, glob: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """The same term through torch's own ``F.kl_div``, on the not-true logits selected by a
    boolean mask (the module-based client's selection, not ``not_true``'s gather):
    tau^2 KL(q_g || q_l) with ``reduction="batchmean"``."""
    keep = torch.ones_like(local, dtype=torch.bool)
    keep[torch.arange(len(y)), y] = False
    c = local.shape[1] - 1
    log_q_local = F.log_softmax(local[keep].view(len(y), c) / tau, dim=1)
    q_global = F.softmax(glob[keep].view(len(y), c) / tau, dim=1)
    return F.kl_div(log_q_local, q_global, reduction="batchmean") * tau**2


def test_ntd_loss_vmaps():
    """``ntd_loss`` under vmap over K = 3 clients (``not_true`` is a gather, so it batches; the
    old boolean mask could not), value and gradient, equals FedNTD's loss computed per client
    two independent ways in float64: by hand from its formula (``_ntd_by_hand``) and through
    ``F.kl_div`` on boolean-masked not-true softmaxes (``_ntd_by_kl_div``, its gradient by
    autograd)."""
    gen = torch.Generator().manual_seed(6)
    local, glob = (torch.randn(3, 5, 4, generator=gen, dtype=torch.float64) * 2 for _ in range(2))
    y = torch.randint(0, 4, (3, 5), generator=gen)
    tau = 2.0
    batched = torch.vmap(lambda a, b, t: ntd_loss(a, b, t, tau))(local, glob, y)
    grads = torch.vmap(torch.func.grad(lambda a, b, t: ntd_loss(a, b, t, tau)))(local, glob, y)
    for k in range(3):
        want, want_grad = _ntd_by_hand(local[k].numpy(), glob[k].numpy(), y[k].numpy(), tau)
        assert want > 0.05  # the distributions differ: a real KL, not a rounding-level one
        assert math.isclose(batched[k].item(), want, rel_tol=1e-12)
        np.testing.assert_allclose(grads[k].numpy(), want_grad, rtol=1e-10, atol=1e-14)
        leaf = local[k].clone().requires_grad_()
        kl = _ntd_by_kl_div(leaf, glob[k], y[k], tau)
        (kl_grad,) = torch.autograd.grad(kl, leaf)
        assert math.isclose(batched[k].item(), kl.item(), rel_tol=1e-12)
        np.testing.assert_allclose(grads[k].numpy(), kl_grad.numpy(), rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------ (b), (c) cohorts
def _inputs(model_name, sizes, moon_prev, seed=5):
    """K clients from different weights; each sent its own w_t's buffers; MOON clients in
    ``moon_prev`` have a previous model (other weights and buffers), the rest none."""
    gen = torch.Generator().manual_seed(seed)
    models = [build_model(model_name, SHAPE, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}
    data = [(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)) for n in sizes]
    states = []
    for k in range(len(sizes)):
        p_k, b_k = unstack_tree(params, k), unstack_tree(buffers, k)
        prev = {"prev": {**{n: v + 0.1 * torch.randn(v.shape, generator=gen) for n, v in p_k.items()},
                         **{n: v + 0.1 * torch.rand(v.shape, generator=gen) if v.is_floating_point() else v
                            for n, v in b_k.items()}}}
        states.append(prev if k in moon_prev else {})
    return build_model(model_name, SHAPE).to("meta"), params, buffers, data, states


def _compare(name, model_name, sizes, rel, moon_prev=(0, 2)):
    skeleton, params, buffers, data, states = _inputs(model_name, sizes, moon_prev)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    update, k_all = UPDATES[name], len(sizes)
    # what the server sent besides the weights, the same for all: the global buffers (other than
    # any client's own, so a mix-up would show)
    server = {"buffers": {n: v + 0.5 if v.is_floating_point() else v for n, v in unstack_tree(buffers, 0).items()}}
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, 4, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(Round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k],
                            server, hp, *data[k], 4, 2, torch.Generator().manual_seed(10 + k)))
        assert_cohort_client_equals(together, k, alone, rel)


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cohort_of_three_equals_three_rounds(name):
    # 14 samples: batches 4, 4, 4, 2 per epoch; 6: 4, 2; 12: 4, 4, 4 -> 8, 4 and 6 steps (masking)
    _compare(name, "cnn-small", [14, 6, 12], rel=1e-5)


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cohort_of_one_is_exact(name):
    _compare(name, "cnn-small", [10], rel=0, moon_prev=(0,))


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cohort_batchnorm_frozen_models(name):
    """The frozen models' eval-mode BN statistics (sent / kept) are per client in a cohort."""
    _compare(name, "cnn-bn", [8, 4, 12], rel=1e-4)
