"""Server optimisers (FedAvgM, FedAdam, FedYogi, FedAdagrad): each server step is Flower's
strategy's step on the same hand-made replies, the run-config keys reach it, and its state
survives a checkpoint so a resumed run steps as an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

from fl_app.registry import get_method, validate_config
from fl_app.server.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tests.kit import fit_res

# Non-default values, so a key that did not reach Flower's constructor changes the result.
CFG = {"server-lr": 0.7, "server-momentum": 0.6, "fedopt-eta": 0.05, "fedopt-beta-1": 0.8,
       "fedopt-beta-2": 0.95, "fedopt-tau": 0.02, "learning-rate": 0.03}

# method -> (Flower's class, its keyword arguments for CFG)
FLOWER = {
    "fedavgm": (FedAvgM, {"server_learning_rate": 0.7, "server_momentum": 0.6}),
    "fedadam": (FedAdam, {"eta": 0.05, "eta_l": 0.03, "beta_1": 0.8, "beta_2": 0.95, "tau": 0.02}),
    "fedyogi": (FedYogi, {"eta": 0.05, "eta_l": 0.03, "beta_1": 0.8, "beta_2": 0.95, "tau": 0.02}),
    "fedadagrad": (FedAdagrad, {"eta": 0.05, "eta_l": 0.03, "tau": 0.02}),
}
METHODS = tuple(FLOWER)


def _w0() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]


def _replies(w_t: list[np.ndarray], server_round: int) -> list:
    """Three clients with different n_k and updates that change every round."""
    rng = np.random.default_rng(100 + server_round)
    return [(None, fit_res([a + 0.1 * k * rng.standard_normal(a.shape).astype(np.float32) for a in w_t], n))
            for k, n in ((1, 10), (2, 30), (3, 5))]


def _ours(method: str, weights: list[np.ndarray]):
    cfg = validate_config({"strategy": method, **CFG})
    return get_method(method).strategy.from_config(
        cfg, initial_parameters=ndarrays_to_parameters(weights), min_fit_clients=1, min_available_clients=1)


def _step(strategy, server_round: int, w_t: list[np.ndarray]) -> list[np.ndarray]:
    """One round as the server runs it: configure_fit with w_t, then aggregate the replies."""
    strategy.configure_fit(server_round, ndarrays_to_parameters(w_t), _NoClients())
    params, _ = strategy.aggregate_fit(server_round, _replies(w_t, server_round), [])
    return parameters_to_ndarrays(params)


class _NoClients:
    """A client manager with nobody to sample (configure_fit's sampling is not under test)."""

    def num_available(self):
        return 0

    def sample(self, *args, **kwargs):
        return []


@pytest.mark.parametrize("method", METHODS)
def test_server_step_equals_flowers_strategy(method):
    """Three rounds: every aggregate is bit-for-bit Flower's on the same replies (the same
    numpy operations in the same order, so no tolerance)."""
    flower_cls, kwargs = FLOWER[method]
    ours = _ours(method, _w0())
    flower = flower_cls(initial_parameters=ndarrays_to_parameters(_w0()), **kwargs)
    w_ours = w_flower = _w0()
    for server_round in (1, 2, 3):
        w_ours = _step(ours, server_round, w_ours)
        params, _ = flower.aggregate_fit(server_round, _replies(w_flower, server_round), [])
        w_flower = parameters_to_ndarrays(params)
        for a, b in zip(w_ours, w_flower, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(w_ours, _w0()))  # it did move


@pytest.mark.parametrize("method", METHODS)
def test_state_through_a_checkpoint_resumes_the_same_optimiser(method, tmp_path):
    """Rounds 1-2, checkpoint (weights + get_state through the npz file), a fresh strategy
    built from the checkpoint's weights as the ServerApp builds it, round 3: equal to round 3
    of an uninterrupted run. Without the state FedAvgM would assert and the others differ."""
    full = _ours(method, _w0())
    w = _w0()
    for server_round in (1, 2):
        w = _step(full, server_round, w)
    save_checkpoint(tmp_path, Checkpoint(2, w, full.get_state()))
    want = _step(full, 3, w)

    ckpt = load_checkpoint(tmp_path)
    resumed = _ours(method, ckpt.weights)
    resumed.set_state(ckpt.strategy_state)
    got = _step(resumed, 3, ckpt.weights)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", METHODS)
def test_steps_from_the_model_the_server_sent(method):
    """When the server keeps w_t instead of an aggregate (a non-finite one is discarded), the
    next step starts from the w_t it sends, not from the optimiser's own copy of the rejected
    aggregate: equal to a strategy that never saw the discarded round's result."""
    w0 = _w0()
    discarded = _ours(method, w0)
    _step(discarded, 1, w0)  # its result is thrown away; the server sends w0 again
    for name in discarded.STATE:  # only the weights are under test here: the same fresh state
        setattr(discarded, name, None)
    clean = _ours(method, w0)
    for a, b in zip(_step(discarded, 1, w0), _step(clean, 1, w0), strict=True):
        np.testing.assert_array_equal(a, b)


def test_fedadagrad_takes_no_beta_keys():
    """Flower's FedAdagrad has no beta_1 / beta_2 to set: those keys are not its keys."""
    from fl_app.registry import config_keys

    assert set(config_keys(get_method("fedadagrad"))) == {"fedopt-eta", "fedopt-tau"}
    assert {"fedopt-beta-1", "fedopt-beta-2"} <= set(config_keys(get_method("fedadam")))


@pytest.mark.parametrize("method", METHODS)
def test_builds_without_a_model_for_the_config_check(method):
    """run_simulation.py builds every method once with no model, to check its config early."""
    from strategies.base import fedavg_kwargs

    cfg = validate_config({"strategy": method})
    get_method(method).strategy.from_config(cfg, **fedavg_kwargs(cfg, None, None))
