"""``LocalUpdate``: the client side of a method, whole, as one declaration.

A method's client is this object and nothing else: one generic ``NumPyClient``
(``fl_app.node.drift_client.DriftClient``) runs any ``LocalUpdate`` for one client, and a cohort node
(``fl_app.node.cohort_client``) runs the same declaration for many clients in one vmap. The
declaration says, besides the three step functions of ``tasks.functional``'s contract
(``begin`` / ``direction`` / ``end``):

- ``keys``: the run-config keys only the client reads, with defaults and checks (a key the
  server reads too is declared on the method's Strategy); ``reads``: keys declared there that
  the update reads as well. ``Hyper.keys`` holds both.
- ``state``: the arrays a client keeps across rounds (SCAFFOLD's c_i, FedDyn's g_k): which model
  entries each covers and the ``context.state`` record it is kept under. Absent the first
  time a client trains; ``begin`` supplies the initial value (zeros, for every method here).
  ``end`` returns the new values; an entry ``end`` leaves out is not stored.
- ``receives`` / ``sends``: the arrays travelling after the weights, server to client (SCAFFOLD's
  c) and client to server (Δc_i), keyed and ordered by the names ``protocol.traffic`` gives the
  method's family (the server splits and packs by the same names). A missing ``receives`` (the server
  sent only the weights) reaches ``begin`` as an absent entry.
- ``personal``: model entries each client keeps as its own (FedBN's BatchNorm layers): its
  stored values replace the received ones before training and evaluation, and are stored
  after training.
- ``carry``: the initial value of a per-step carried tree (FedSOL's proximal-loss sum, FedSMOO's
  dual and last perturbation), passed to and returned by every ``direction`` and read by
  ``end``; masked per client in a cohort like the weights.
- ``prepare``: run on the prepared ``Round`` before the loop (RI-FedAvg measures its roughness
  index); ``finish``: run on the round's result after it (FedPGVC's authors' rescale).
- ``terms``: what the method adds to its own gradient, each term once with its coefficient and
  its place in the step (``tasks.functional.terms``: before the clip, or after it as weight
  decay); ``clip_key``: the method's own clip-norm key, applied where ``local-clip-norm`` is.
- ``lr_schedule``: the learning rate within the round (FedSWA's linear decay), as
  ``lr_schedule(K, hp)``, the factors s_1..s_K on the round's rate for a client whose round has K
  local steps, or None for a constant rate (the default, and what a schedule returns when it is
  flat, so a flat schedule runs the constant-rate loop exactly). Step t then moves the weights
  by s_t times the optimiser's step at the round's rate (``tasks.functional.rounds.make_step``),
  which is the optimiser's step at rate s_t η: SGD (with momentum), Adam and AdamW all move
  linearly in their rate. The factors reach ``ctx`` under ``LR_FACTORS`` (``end`` reads them
  there: FedMoSWA's c_i⁺ divides by their sum).
- ``unbatched``: a cohort trains this update's clients one at a time (each a cohort of one,
  exactly its per-client round), for an update too ill-conditioned for batched kernels' other
  summation order (FedDecorr).
- ``step_cost`` (a step's cost relative to one SGD step, for the run-time estimate),
  ``client_mods`` (Flower client mods the method's messages need, DP-FedAvg's clipping) and
  ``module`` (the module whose docstring documents the method: its listing, README row and
  docs/methods.md section are generated from it).

The step functions' signatures:

- ``begin(w_t, state, server, hp) -> ctx``;
- ``direction(model, params, buffers, x, y, w_t, ctx, carry, hp) -> (d, buffers', carry', loss)``,
  the method's own gradient before its ``terms`` are added;
- ``end(w_t, params, buffers, carry, steps, ctx, state, hp) -> (state', sends, metrics)``.

``server`` holds the declared ``receives`` and, always, ``"buffers"``: the global model's buffers
as received (the frozen global model of FedSOL, FedNTD and MOON runs on them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tasks.functional.core import Hyper, Tree
from tasks.functional.terms import Term

Begin = Callable[[Tree, dict, dict, Hyper], dict]
Direction = Callable[..., tuple[Tree, Tree, Tree, torch.Tensor]]
End = Callable[..., tuple[dict, dict, dict]]
Names = Callable[[nn.Module, Mapping], Sequence[str]]
Schedule = Callable[[int, Hyper], "Sequence[float] | None"]

LR_FACTORS = "lr-factors"
"""The ``ctx`` entry of an update with an ``lr_schedule``: the client's factors s_1..s_K on the
round's learning rate (a 1-d tensor; the loop adds it after ``begin``, only when the schedule is
not flat)."""


def no_context(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """``begin`` of an update with no round constants."""
    return {}


def no_state(w_t, params, buffers, carry, steps, ctx, state, hp):
    """``end`` of an update that keeps nothing, sends nothing and reports no metric of its own."""
    return {}, {}, {}


def no_mods(cfg: Mapping) -> tuple:
    """``client_mods`` of an update whose messages need no Flower client mod."""
    return ()


@dataclass(frozen=True)
class Arrays:
    """A set of arrays a method keeps or sends, one per model entry: ``names(model, cfg)``, the
    entries' names in the model's state_dict order (the order they travel and are stored in);
    ``record``, the ``context.state`` record it is kept under (state and personal entries only:
    the names runs checkpointed before kept, so they resume)."""

    names: Names
    record: str = ""
    # The arrays are weights the model runs on (MOON's previous model): kept in the memory layout
    # of the model's own entries (channels-last convolutions), so its forward passes run the same
    # kernels as on the model's weights. Otherwise contiguous (every other state is added to or
    # subtracted from gradients and weights).
    as_weights: bool = False


@dataclass
class Round:
    """One client's round, prepared: what ``local_round`` takes (``cohort_round`` takes the same
    per client, stacked), and who the client is (``seed``, ``partition``,
    ``server_round``: what a ``prepare`` step seeds its own draws with). ``model`` is the
    client's model, used as a skeleton only; ``params`` / ``buffers`` are w_t as received (less
    ``personal`` entries, which are the client's own); ``server`` is what arrived besides them."""

    update: LocalUpdate
    model: nn.Module
    params: Tree
    buffers: Tree
    state: dict
    server: dict
    hp: Hyper
    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    epochs: int
    generator: torch.Generator
    augment: Any = None
    seed: int = 0
    partition: int = 0
    server_round: int = 1


@dataclass(frozen=True)
class LocalUpdate:
    """One method's client side (module docstring)."""

    name: str
    direction: Direction
    begin: Begin = no_context
    end: End = no_state
    keys: Mapping[str, Any] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    state: Mapping[str, Arrays] = field(default_factory=dict)
    receives: Mapping[str, Arrays] = field(default_factory=dict)
    sends: Mapping[str, Arrays] = field(default_factory=dict)
    personal: Arrays | None = None
    carry: Callable[[Tree, dict, Hyper], Tree] | None = None
    prepare: Callable[[Round], Round] | None = None
    finish: Callable[[Round, Any], Any] | None = None
    step_cost: float = 1.0
    client_mods: Callable[[Mapping], tuple] = no_mods
    module: str = ""
    terms: tuple[Term, ...] = ()
    clip_key: str = ""
    lr_schedule: Schedule | None = None
    # True for an update whose float32 rounds amplify a one-ulp difference into a different
    # round (FedDecorr's 1/sqrt(var) of near-dead features): a cohort trains its clients one at a
    # time, each exactly as its per-client round, instead of batched in one vmap.
    unbatched: bool = False

    def key_names(self) -> tuple[str, ...]:
        """Every run-config key the update reads (``Hyper.keys``): its own, then ``reads``."""
        return (*self.keys, *(k for k in self.reads if k not in self.keys))

    def clips(self, hp: Hyper) -> tuple[float, ...]:
        """The norms the step clips its direction to, in order: the method's own clip key
        (``clip_key``, FedDC's, FedSMOO's, FedSpeed's), then the run-wide ``local-clip-norm``;
        0 = off."""
        own = hp.keys[self.clip_key] if self.clip_key else 0.0
        return tuple(c for c in (own, hp.clip_norm) if c > 0)

    def initial_carry(self, w_t: Tree, ctx: dict, hp: Hyper) -> Tree:
        """The carry a round starts with ({} for an update that declares none)."""
        return self.carry(w_t, ctx, hp) if self.carry is not None else {}
