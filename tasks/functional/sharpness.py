"""The sharpness-aware local updates as ``LocalUpdate``s: FedASAM, FedGAM, FedGAM-CV, FedSOL and
FedSMOO, the methods that take their gradient at perturbed weights (FedSAM's is in
``tasks.functional.methods``). The contract is in ``tasks.functional``'s docstring; each
method's reading of its paper is in its client module's docstring (clients/<method>.py).

Every perturbed point w + eps is a copy of the weights (``perturbed_copy``): w itself never
moves, so nothing has to be restored (moving w in place and subtracting eps again would not
give w back in floating point), and the buffers a direction returns are those of its first,
unperturbed pass (BatchNorm statistics count that pass only). Each formula uses the same tensor
operations, in the same order, as the module-based training the clients ran before their
conversion, so they give the same numbers as before (bit for bit on CPU; scripts/same_metrics.py;
tests/test_functional_sharpness.py keeps that training as its reference).

Per-step quantities that outlive a step (FedSOL's proximal-loss sum, FedSMOO's dual mu_i and
last perturbation) ride in the buffers under names no model's buffer has (``PROX_SUM``,
``SMOO_MU``/``SMOO_SHAT`` + a parameter's name): the buffers are the protocol's one tensor state
carried from step to step per client and masked per client in a cohort, and ``end`` does not see
them, so the client reads them from the round's result (``fedsol_metrics``, ``smoo_outputs``).
The client starts them in its prepared round (``fedsol_buffers``, ``smoo_buffers``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vjp

from tasks.functional.core import NORM_EPS, Hyper, Tree, grad_and_loss, keep_layout, sam_eps, tree_norm
from tasks.functional.methods import LocalUpdate, control_variate_begin, control_variate_end, feddyn_begin, feddyn_end


def perturbed_copy(params: Tree, eps: Tree) -> Tree:
    """w + eps as new tensors, each in the memory layout of its weight (``keep_layout``);
    a parameter without an entry in ``eps`` is passed through unchanged."""
    return {n: keep_layout(p + eps[n], p) if n in eps else p for n, p in params.items()}


# ------------------------------------------------------------------------------ FedASAM
def asam_scaled(names: Iterable[str]) -> dict[str, bool]:
    """Which tensors ASAM rescales: those named ``weight`` (the official ASAM code's rule),
    not biases."""
    return {n: n.rsplit(".", 1)[-1] == "weight" for n in names}


def asam_eps(params: Tree, grads: Tree, rho: float, eta: float, scaled: dict[str, bool]) -> Tree:
    """Adaptive SAM's ascent step (Kwon et al. 2021): eps = rho T^2 g / (||T g|| + NORM_EPS),
    T = |w| + eta elementwise where ``scaled[name]``, T = 1 elsewhere; the norm over all of
    ``grads``. Plain tensor ops, so vmap batches it."""
    t = {n: params[n].abs().add(eta) for n in grads if scaled[n]}
    tg = {n: t[n] * g if n in t else g for n, g in grads.items()}
    scale = rho / (tree_norm(tg.values()) + NORM_EPS)
    return {n: (v * t[n] if n in t else v) * scale for n, v in tg.items()}


def asam_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """g = grad f(w); eps = ``asam_eps``; d = grad f(w + eps), applied at w."""
    grads, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)
    eps = asam_eps(params, grads, hp.keys["asam-rho"], hp.keys["asam-eta"], asam_scaled(params))
    sharp, _, _ = grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)
    return sharp, new_buffers, loss


FEDASAM = LocalUpdate("fedasam", asam_direction, keys=("asam-rho", "asam-eta"))


# ---------------------------------------------------------------------- FedGAM, FedGAM-CV
GAM_KEYS = ("gam-rho", "gam-variant", "gam-norm-rho", "gam-beta1", "gam-beta2", "gam-beta3", "gam-gamma")


def _sam_step(grads: Tree, rho: float) -> Tree:
    """``core.sam_eps`` on a tree: rho g / (||g|| + NORM_EPS)."""
    return dict(zip(grads, sam_eps(grads.values(), rho)))


def gam_gradient(model, params, buffers, x, y, hp, alpha: float) -> tuple[Tree, Tree, torch.Tensor]:
    """(G, the buffers after the first pass, the loss at w) of FedGAM's ``gam-variant``:

    - ``paper`` (Eq. 19): g = grad f(w), G = g + alpha rho grad f(w + rho g/||g||);
    - ``reference`` (GAM's optimiser step, Zhang et al. 2023; ``alpha`` unused):
      g0 = grad f(w), g1 = grad f(w + r1 g0/||g0||), w2 = w + r2 (g1 - g0)/||g1 - g0||,
      g2 = grad f(w2), g3 = grad f(w2 + r1 g2/||g2||), u = b1 g1 + b3 g3, m = g0 + |b2| g2,
      G = u - gamma (m - (<m, u>/||u||^2) u), the inner product through the cosine as GAM
      computes it.

    Every norm in a denominator has NORM_EPS added; each perturbed point is a copy of w."""
    keys = hp.keys
    g0, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)

    def grad_at(eps: Tree) -> Tree:
        return grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)[0]

    r1 = keys["gam-rho"]
    g1 = grad_at(_sam_step(g0, r1))
    if keys["gam-variant"] == "paper":
        return {n: g.add(g1[n], alpha=alpha * r1) for n, g in g0.items()}, new_buffers, loss
    b1, b2, b3, gamma = keys["gam-beta1"], keys["gam-beta2"], keys["gam-beta3"], keys["gam-gamma"]
    e2 = _sam_step({n: g1[n] - g for n, g in g0.items()}, keys["gam-norm-rho"])
    g2 = grad_at(e2)
    e3 = {n: e + e_g2 for (n, e), e_g2 in zip(e2.items(), _sam_step(g2, r1).values())}  # from w
    g3 = grad_at(e3)
    u = {n: b1 * g1[n] + b3 * g3[n] for n in g0}
    m = {n: g0[n] + abs(b2) * g2[n] for n in g0}
    u_norm, m_norm = tree_norm(u.values()), tree_norm(m.values())
    cosine = sum((m[n] * u[n]).sum() for n in g0) / (u_norm * m_norm + NORM_EPS)
    along = cosine * m_norm / (u_norm + NORM_EPS)
    return {n: a - gamma * (m[n] - along * a) for n, a in u.items()}, new_buffers, loss


def gam_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = G (``gam_gradient`` with alpha = ``gam-alpha``)."""
    return gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-alpha"])


def gam_cv_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = G - c_i + c (G with alpha = ``gam-cv-alpha``) on the parameters with control
    variates, G elsewhere (the correction of ``methods.control_variate_direction``)."""
    grads, new_buffers, loss = gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-cv-alpha"])
    corr = ctx["corr"]
    return {n: g.add(corr[n]) if n in corr else g for n, g in grads.items()}, new_buffers, loss


FEDGAM = LocalUpdate("fedgam", gam_direction, keys=(*GAM_KEYS, "gam-alpha"))
# c and c_i, c_i+ and delta c_i: SCAFFOLD's begin and end (option II, momentum-corrected K_eff)
FEDGAM_CV = LocalUpdate("fedgam-cv", gam_cv_direction, control_variate_begin, control_variate_end,
                        keys=(*GAM_KEYS, "gam-cv-alpha"))


# ------------------------------------------------------------------------------- FedSOL
RADII = ("layer", "axis")
# The round's running sum of the proximal loss L_p (the fit metric ``prox_loss`` is its mean):
# carried from step to step in the buffers under this key, not a name of any model's buffer
# (the buffers are the protocol's one per-step, per-client channel, masked by ``cohort_round``
# like the BN statistics; ``functional_call`` never sees the key). A cohort must start its
# buffers with it (``fedsol_buffers``: a masked step keeps each client's old entry, so it must
# exist); ``local_round`` may leave it out (then it starts at the first step's L_p).
PROX_SUM = "<fedsol prox_sum>"
FEDSOL_KEYS = ("fedsol-rho", "fedsol-temperature", "fedsol-perturb", "fedsol-adaptive", "fedsol-radius")


def fedsol_eps(weights: Tree, global_weights: Tree, prox_grads: Tree, rho: float, adaptive: bool = True,
               radius: str = "layer") -> Tree:
    """eps = rho Lambda (.) g_p / (||g_p|| + NORM_EPS) on the tensors of ``prox_grads``, ||g_p||
    over all of them.

    Lambda (``adaptive``; else 1) from d = |w - w_g|: ``radius = "layer"`` d / (||d|| + NORM_EPS)
    per tensor (Eq. 7 of the paper's text); ``"axis"`` F.normalize(d, dim=0), d / max(||d||,
    NORM_EPS) with the norm over dim 0 (every column of a Linear weight, every (in, kh, kw)
    fibre of a conv weight; a bias as a whole), as the authors' code computes it. Lambda = 0
    where w = w_g, so the round's first step is plain SGD.
    """
    if radius not in RADII:
        raise ValueError(f"fedsol radius {radius!r} is invalid; valid choices: {', '.join(RADII)}")
    scale = rho / (tree_norm(prox_grads.values()) + NORM_EPS)
    out = {}
    for n, g in prox_grads.items():
        e = g * scale
        if adaptive:
            diff = (weights[n] - global_weights[n]).abs()
            if radius == "axis":
                e = e * F.normalize(diff, p=2.0, dim=0, eps=NORM_EPS)
            else:
                e = e * (diff / (torch.linalg.vector_norm(diff) + NORM_EPS))
        out[n] = e
    return out


def proximal_kl(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """L_p = KL(p_global || p_local) of the softened probabilities, averaged over the batch:
    ``F.kl_div(log p_local, p_global, reduction="batchmean")`` written out as ATen computes it
    (xlogy(p, p) - p log q, summed, over B), since vmap has no batching rule for ``kl_div``."""
    log_local = F.log_softmax(local_logits / temperature, dim=1)
    p_global = F.softmax(global_logits / temperature, dim=1)
    return (torch.xlogy(p_global, p_global) - p_global * log_local).sum() / log_local.size(0)


def proximal_logit_grad(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """dL_p/dlogits in closed form, (p_local - p_global) / (T B): exactly zero where the two
    models' logits agree, so no rounding noise gets normalised into a rho-sized perturbation
    (as autograd through ``kl_div`` would give at w = w_g)."""
    diff = F.softmax(local_logits / temperature, dim=1) - F.softmax(global_logits / temperature, dim=1)
    return diff / (temperature * len(local_logits))


def fedsol_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers (``server["buffers"]``, those received with w_t; none for a
    model without buffers): its eval-mode forward at w_t gives the global logits."""
    return {"global_buffers": dict(server.get("buffers", {}))}


def fedsol_buffers(buffers: Tree, device: torch.device | str) -> Tree:
    """``buffers`` with the round's proximal-loss sum started at zero on ``device`` (``PROX_SUM``)."""
    return {**buffers, PROX_SUM: torch.zeros((), device=device)}


def _within(tree: Tree, prefix: str) -> Tree:
    """The entries of ``tree`` under submodule ``prefix``, named relative to it."""
    return {n[len(prefix):]: t for n, t in tree.items() if n.startswith(prefix)}


def eval_logits(model, params: Tree, buffers: Tree, x: torch.Tensor) -> torch.Tensor:
    """The logits of ``model`` in eval mode (BatchNorm on its running statistics) at (params,
    buffers), without a graph; the skeleton's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return functional_call(model, (params, buffers), (x,), strict=True)
    finally:
        model.train(was_training)


def _head_pass(model, params, buffers, x, y, eps_of):
    """(logits at w, d, new buffers) with only the head perturbed: one body pass, its vjp fed the
    gradient of CE(head(w_head + eps; features)) with respect to the features."""
    def body(p: Tree) -> tuple[torch.Tensor, Tree]:
        new = {n: b.clone() for n, b in _within(buffers, "body.").items()}
        return functional_call(model.body, (p, new), (x,)), new

    def head(p: Tree, features: torch.Tensor) -> torch.Tensor:
        return functional_call(model.head, p, (features,))

    features, body_vjp, body_buffers = vjp(body, _within(params, "body."), has_aux=True)
    head_params = _within(params, "head.")
    logits, head_vjp = vjp(lambda p: head(p, features), head_params)
    eps = eps_of(logits, {f"head.{n}": p for n, p in head_params.items()},
                 lambda d: ({f"head.{n}": g for n, g in head_vjp(d)[0].items()},))
    perturbed_head = _within(perturbed_copy(params, eps), "head.")
    g_head, g_features = grad(lambda p, f: F.cross_entropy(head(p, f), y), argnums=(0, 1))(perturbed_head, features)
    (g_body,) = body_vjp(g_features)
    sharp = {**{f"body.{n}": g for n, g in g_body.items()}, **{f"head.{n}": g for n, g in g_head.items()}}
    return logits, {n: sharp[n] for n in params}, {**buffers, **{f"body.{n}": b for n, b in body_buffers.items()}}


def _full_pass(model, params, buffers, x, y, hp, eps_of):
    """(logits at w, d, new buffers) with every parameter perturbed."""
    def forward(p: Tree) -> tuple[torch.Tensor, Tree]:
        new = {n: b.clone() for n, b in buffers.items()}
        return functional_call(model, (p, new), (x,)), new

    logits, forward_vjp, new_buffers = vjp(forward, params, has_aux=True)
    eps = eps_of(logits, params, forward_vjp)
    sharp, _, _ = grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)
    return logits, sharp, new_buffers


def fedsol_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """FedSOL's step (Eqs. 6-8): g_p = dL_p/dw on the perturbed set (the head, ``fedsol-perturb =
    "head"``, or every parameter), eps = ``fedsol_eps``, d = grad CE(w + eps) for every parameter,
    applied at w; the loss returned is the CE at w, L_p is added to ``PROX_SUM``.

    With the head perturbed, the body's forward pass is shared by both passes (the body does not
    depend on the head): its gradient comes back through the features, as in a module's ``backward()``.
    Gradients through ``torch.func.vjp`` / ``grad``, so vmap batches them; the global logits come
    from ``model`` in eval mode at (w_t, the global buffers)."""
    keys = hp.keys
    temperature = keys["fedsol-temperature"]
    model_buffers = {n: b for n, b in buffers.items() if n != PROX_SUM}
    global_logits = eval_logits(model, w_t, ctx["global_buffers"], x)

    def eps_of(logits: torch.Tensor, targets: Tree, vjp_fn) -> Tree:
        (g_p,) = vjp_fn(proximal_logit_grad(logits, global_logits, temperature))
        g_p = {n: g_p[n] for n in targets}
        return fedsol_eps(targets, w_t, g_p, keys["fedsol-rho"], keys["fedsol-adaptive"], keys["fedsol-radius"])

    if keys["fedsol-perturb"] == "head":
        logits, sharp, new_buffers = _head_pass(model, params, model_buffers, x, y, eps_of)
    else:
        logits, sharp, new_buffers = _full_pass(model, params, model_buffers, x, y, hp, eps_of)
    prox = proximal_kl(logits, global_logits, temperature)
    new_buffers[PROX_SUM] = prox if PROX_SUM not in buffers else buffers[PROX_SUM] + prox
    return sharp, new_buffers, F.cross_entropy(logits, y).detach()


def fedsol_metrics(buffers: Tree, steps: int) -> dict[str, float]:
    """The fit metric ``prox_loss``: the round's mean L_p (0 after no step)."""
    prox_sum = buffers.get(PROX_SUM)
    return {"prox_loss": (prox_sum.item() if prox_sum is not None else 0.0) / max(steps, 1)}


FEDSOL = LocalUpdate("fedsol", fedsol_direction, fedsol_begin, keys=FEDSOL_KEYS)


# ------------------------------------------------------------------------------ FedSMOO
# The dual mu_i and the last step's perturbation shat change at every step and make the reply
# (``smoo_outputs``): carried in the buffers under these prefixes and a parameter's name, like
# FedSOL's PROX_SUM (a round starts them with ``smoo_buffers``; the direction requires them).
SMOO_MU, SMOO_SHAT = "<smoo mu>", "<smoo shat>"
SMOO_KEYS = ("smoo-rho", "smoo-alpha", "smoo-s", "smoo-clip-norm")
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def _feddyn_hp(hp: Hyper) -> Hyper:
    """``hp`` as FedDyn's functions read it: alpha = ``smoo-alpha``."""
    return dataclasses.replace(hp, keys={"feddyn-alpha": hp.keys["smoo-alpha"]})


def smoo_buffers(buffers: Tree, mu: Tree) -> Tree:
    """``buffers`` with the round's starting dual mu_i (zeros where none is kept) and a zero shat."""
    return {**buffers, **{SMOO_MU + n: m for n, m in mu.items()},
            **{SMOO_SHAT + n: torch.zeros_like(m) for n, m in mu.items()}}


def smoo_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """FedDyn's g_k and offset g_k + alpha w_t (``state["grad"]`` = -alpha h_i) and s
    (``server["s"]``, zeros when absent)."""
    ctx = feddyn_begin(w_t, state, server, _feddyn_hp(hp))
    zeros = {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}
    return {**ctx, "s": server.get("s") or zeros}


def smoo_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """g = grad f(w); v = g - mu_i - s; shat = rho v/(||v|| + NORM_EPS); mu_i <- mu_i + shat - s
    (``smoo-s = "none"``: shat = SAM's eps of g, mu_i stays 0); gtil = grad f(w + shat);
    d = gtil - (g_k + alpha w_t) (= gtil + alpha (h_i - w_t)), clipped to norm ``smoo-clip-norm``
    as ``clip_grad_norm_`` does when > 0, then + alpha w (nothing added at alpha = 0)."""
    keys = hp.keys
    rho, alpha, clip = keys["smoo-rho"], keys["smoo-alpha"], keys["smoo-clip-norm"]
    model_buffers = {n: b for n, b in buffers.items() if not n.startswith((SMOO_MU, SMOO_SHAT))}
    grads, loss, new_buffers = grad_and_loss(model, params, model_buffers, x, y, hp)
    mu = _within(buffers, SMOO_MU)
    if keys["smoo-s"] == "none":
        shat = _sam_step(grads, rho)
    else:
        s = ctx["s"]
        shat = _sam_step({n: g - mu[n] - s[n] for n, g in grads.items()}, rho)
        mu = {n: m + shat[n] - s[n] for n, m in mu.items()}
    d, _, _ = grad_and_loss(model, perturbed_copy(params, shat), new_buffers, x, y, hp)
    if alpha != 0:
        d = {n: g.sub(ctx["offset"][n]) for n, g in d.items()}
    if clip > 0:
        coef = torch.clamp(clip / (tree_norm(d.values()) + CLIP_EPS), max=1.0)
        d = {n: g * coef for n, g in d.items()}
    if alpha != 0:
        d = {n: g.add(params[n], alpha=alpha) for n, g in d.items()}
    carried = {**{SMOO_MU + n: m for n, m in mu.items()}, **{SMOO_SHAT + n: e for n, e in shat.items()}}
    return d, {**new_buffers, **carried}, loss


def smoo_end(w_t, params, steps, ctx, state, hp):
    """FedDyn's: g_k <- g_k - alpha (w_K - w_t), i.e. h_i <- h_i + (w_K - w_t); ``feddyn_grad_norm``."""
    return feddyn_end(w_t, params, steps, ctx, state, _feddyn_hp(hp))


def smoo_outputs(buffers: Tree, mode: str) -> tuple[Tree, Tree, dict[str, torch.Tensor]]:
    """(mu_i to keep, the reply, the metric ``smoo_mu_norm``) from the round's final buffers:
    ``paper`` replies stil_i = mu_i - shat_last, ``code`` mu_i, ``none`` zeros."""
    mu, shat = _within(buffers, SMOO_MU), _within(buffers, SMOO_SHAT)
    if mode == "paper":
        reply = {n: m - shat[n] for n, m in mu.items()}
    elif mode == "code":
        reply = mu
    else:
        reply = {n: torch.zeros_like(m) for n, m in mu.items()}
    return mu, reply, {"smoo_mu_norm": tree_norm(mu.values())}


FEDSMOO = LocalUpdate("fedsmoo", smoo_direction, smoo_begin, smoo_end, keys=SMOO_KEYS)
