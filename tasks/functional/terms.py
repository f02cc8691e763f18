"""The terms a method adds to its local step, each written once with an explicit coefficient,
and each declaring its place in the step.

One local step (``tasks.functional.rounds.make_step``), in this order:

```
d  = direction(w)                     the method's own gradient (its loss, SAM's perturbed point, ...)
d += Σ GRADIENT terms                 e.g. μ (w − w_t), c − c_i, −(g_k + α w_t)
d  = clip(d)                          the method's clip key, then local-clip-norm (clip_grad_norm_)
d += Σ DECAY terms                    e.g. FedDyn's α w
w', opt = optimiser step(w, d)        weight decay, momentum (tasks.functional.optim)
w' −= η Σ POST_STEP terms             e.g. SCAFFOLD's c − c_i as NIID-Bench and Flower's niid_bench apply it
```

The place is the authors' code's: a term their code puts in the loss is a ``GRADIENT`` term
(clipped with the gradient); a term their code adds through SGD's ``weight_decay`` after
``clip_grad_norm_`` is a ``DECAY`` term (FedDyn's α w in alpemreacar/FedDyn and
FL-Simulator's FedDyn, FedSMOO and FedSpeed: ``SGD(weight_decay=alpha + wd)``). Without a clip
the two places give the same step; with a binding clip they do not (one round differed from
the authors' by 69-79% of its change when α w was clipped too). A ``POST_STEP`` term moves the
weights after the optimiser's step, by −η times it, outside the momentum buffer and the clip
(NIID-Bench's and Flower's niid_bench SCAFFOLD: ``w ← w − lr (c − c_i)`` after
``optimizer.step()``).

A term is ``coef(hp) * value(params, w_t, ctx)`` on the entries ``value`` returns (entries it
leaves out get nothing: FedPVR's correction covers the last layers only), added as
``d.add(value, alpha=coef)``. A zero coefficient adds nothing at all (the step is then
exactly the one without the term).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tasks.functional.core import Hyper, Tree, keep_layout

GRADIENT = "gradient"  # added before the clip, as a term of the loss
DECAY = "decay"  # added after the clip, as SGD's weight_decay adds it
POST_STEP = "post-step"  # w' -= lr * term after the optimiser's step
PLACES = (GRADIENT, DECAY, POST_STEP)

Value = Callable[[Tree, Tree, dict], Tree]


@dataclass(frozen=True)
class Term:
    """``coef(hp) * value(params, w_t, ctx)`` added to the step's direction at ``place``;
    ``formula`` is how the method's docs write it."""

    formula: str
    coef: Callable[[Hyper], float]
    value: Value
    place: str = GRADIENT

    def __post_init__(self):
        if self.place not in PLACES:
            raise ValueError(f"term {self.formula!r}: place {self.place!r} is invalid; valid: {', '.join(PLACES)}")


def key(name: str) -> Callable[[Hyper], float]:
    """The coefficient read from run-config key ``name``."""
    return lambda hp: hp.keys[name]


def one(hp: Hyper) -> float:
    return 1.0


def minus_one(hp: Hyper) -> float:
    return -1.0


def proximal(coef_key: str, anchor: str | None = None) -> Term:
    """μ (w − a): the gradient of (μ/2) ‖w − a‖², a = w_t (FedProx, FedACG) or the round
    constant ``ctx[anchor]`` (FedDC's θ − h_i), μ = the key ``coef_key``."""
    def value(params, w_t, ctx):
        a = w_t if anchor is None else ctx[anchor]
        return {n: params[n] - a[n] for n in a}
    return Term(f"{coef_key} (w - {anchor or 'w_t'})", key(coef_key), value)


def constant(entry: str, sign: float = 1.0) -> Term:
    """± ``ctx[entry]``, a tree fixed for the round: the gradient of the linear term ±⟨v, w⟩
    (SCAFFOLD's c − c_i; FedDyn's −(g_k + α w_t))."""
    return Term(f"{'+' if sign > 0 else '-'} {entry}", one if sign > 0 else minus_one,
                lambda params, w_t, ctx: ctx[entry])


def decay(coef_key: str) -> Term:
    """α w, added after the clip as SGD's ``weight_decay`` adds it (FedDyn's α w), α = the key
    ``coef_key``."""
    return Term(f"{coef_key} w", key(coef_key), lambda params, w_t, ctx: params, DECAY)


def add_terms(d: Tree, terms: Sequence[Term], place: str, params: Tree, w_t: Tree, ctx: dict, hp: Hyper,
              scale: float = 1.0) -> Tree:
    """``d`` with ``scale`` times every term of ``terms`` placed at ``place`` added, in their
    declared order (``scale`` −η for ``POST_STEP`` terms, which ``d``, the new weights, takes: they
    keep each weight's memory layout, ``core.keep_layout``, as the optimiser's step does; a
    direction's layout does not matter, so the terms before the optimiser add nothing for it)."""
    layout = keep_layout if place == POST_STEP else (lambda new, like: new)
    for term in terms:
        if term.place != place:
            continue
        coef = term.coef(hp) * scale
        if coef == 0:
            continue
        value = term.value(params, w_t, ctx)
        d = {n: layout(g.add(value[n], alpha=coef), g) if n in value else g for n, g in d.items()}
    return d
