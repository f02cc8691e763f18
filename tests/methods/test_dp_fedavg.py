"""DP-FedAvg: with zero noise the aggregate's update respects the clipping bound (both modes);
the opt-in seeded noise is reproducible per (seed, round)."""

import math

import numpy as np
import pytest
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.common import (
    Code,
    FitIns,
    GetPropertiesIns,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.task_identity import TaskIdentity

import fl_app.client_app as client_app
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from strategies.dp_fedavg import (
    DPClientSideClipping,
    DPFedAvgStrategy,
    DPServerSideClipping,
    rdp_epsilon,
)
from tests.kit import fake_context, fit_res


def _cfg(**over):
    return validate_config({"strategy": "dp-fedavg", "dataset": "synthetic", "model": "logreg", **over})


def _updates(rng, w_t, scales):
    return [[(a + s * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t] for s in scales]


def _norm(arrays):
    return math.sqrt(sum(float((np.asarray(a, dtype=np.float64) ** 2).sum()) for a in arrays))


def test_server_side_zero_noise_respects_clipping_bound():
    C = 1.0
    strategy = DPFedAvgStrategy.from_config(_cfg(**{"dp-mode": "server", "dp-noise-multiplier": 0.0, "dp-clipping-norm": C}))
    assert isinstance(strategy, DPServerSideClipping)
    rng = np.random.default_rng(0)
    w_t = [rng.standard_normal((10, 60)).astype(np.float32), rng.standard_normal(10).astype(np.float32)]
    clients = _updates(rng, w_t, (5.0, 0.001, 3.0))  # two far outside the bound, one inside
    strategy.current_round_params = [a.copy() for a in w_t]
    strategy.num_sampled_clients = 3
    params, metrics = strategy.aggregate_fit(1, [(None, fit_res(c, n)) for c, n in zip(clients, (5, 50, 500))], [])
    new = parameters_to_ndarrays(params)
    update = [a - b for a, b in zip(new, w_t)]
    assert _norm(update) <= C + 1e-5
    # hand: uniform mean of the clipped updates (n_k ignored)
    clipped = []
    for c in clients:
        u = [a.astype(np.float64) - b for a, b in zip(c, w_t)]
        s = min(1.0, C / _norm(u))
        clipped.append([s * v for v in u])
    for i in range(2):
        np.testing.assert_allclose(update[i], np.mean([c[i] for c in clipped], axis=0), atol=1e-5)
    assert metrics["dp_noise_std"] == 0.0 and "dp_epsilon" not in metrics


def test_client_mode_mod_clips_and_wrapper_sends_norm(monkeypatch):
    for attr in ("_run_id", "_node_id", "_task_id"):  # Message() reads the process's task identity
        monkeypatch.setattr(TaskIdentity, attr, 0)
    C = 0.5
    cfg = _cfg(**{"dp-clipping-norm": C, "dp-noise-multiplier": 0.0})
    strategy = DPFedAvgStrategy.from_config(cfg)
    assert isinstance(strategy, DPClientSideClipping)
    rng = np.random.default_rng(1)
    w_t = [rng.standard_normal(20).astype(np.float32)]
    big = [(w_t[0] + 10 * rng.standard_normal(20)).astype(np.float32)]
    ins = FitIns(ndarrays_to_parameters(w_t), {"clipping_norm": C, "server-round": 1})
    msg = Message(content=compat.fitins_to_recorddict(ins, keep_input=True), dst_node_id=0,
                  message_type=MessageType.TRAIN)

    def call_next(m, ctx):  # the "client": returns a far-away model
        return Message(content=compat.fitres_to_recorddict(fit_res(big, 7), keep_input=True), reply_to=m)

    out = client_app.method_mods(msg, fake_context({"strategy": "dp-fedavg", "dp-mode": "client"}), call_next)
    sent = parameters_to_ndarrays(compat.recorddict_to_fitres(out.content, keep_input=True).parameters)
    assert abs(_norm([sent[0] - w_t[0]]) - C) < 1e-4  # clipped onto the bound
    # other runs pass through untouched
    for rc in ({"strategy": "dp-fedavg", "dp-mode": "server"}, {"strategy": "fedavg"}):
        out = client_app.method_mods(msg, fake_context(rc), call_next)
        sent = parameters_to_ndarrays(compat.recorddict_to_fitres(out.content, keep_input=True).parameters)
        np.testing.assert_array_equal(sent[0], big[0])
    # the server side aggregates the (clipped) results with zero noise: update norm <= C
    strategy.num_sampled_clients = 2
    clipped = [w_t[0] + C * (big[0] - w_t[0]) / np.linalg.norm(big[0] - w_t[0])]
    other = [w_t[0] - C * (big[0] - w_t[0]) / np.linalg.norm(big[0] - w_t[0]) / 2]
    params, _ = strategy.aggregate_fit(1, [(None, fit_res(clipped, 1)), (None, fit_res(other, 99))], [])
    new = parameters_to_ndarrays(params)
    np.testing.assert_allclose(new[0] - w_t[0], (clipped[0] + other[0]) / 2 - w_t[0], atol=1e-5)
    assert _norm([new[0] - w_t[0]]) <= C


def test_client_mode_answers_the_servers_partition_question(monkeypatch):
    """The server asks each node for its partition id (get_properties) to sample by seed; with
    the clipping mod on every message that came back as an error (0 ArrayRecords), the nodes
    were sampled by random node id and two runs of one seed trained different clients."""
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 0)
    question = Message(content=compat.getpropertiesins_to_recorddict(GetPropertiesIns(config={})), dst_node_id=0,
                       message_type=MessageType.QUERY)
    answer = GetPropertiesRes(Status(Code.OK, ""), {"partition-id": 3, "num-partitions": 4})

    def call_next(m, ctx):
        return Message(content=compat.getpropertiesres_to_recorddict(answer), reply_to=m)

    out = client_app.method_mods(question, fake_context({"strategy": "dp-fedavg", "dp-mode": "client"}), call_next)
    assert not out.has_error(), out.error
    assert compat.recorddict_to_getpropertiesres(out.content).properties == answer.properties


def test_rdp_epsilon_full_participation_closed_form():
    # q = 1: RDP of the Gaussian mechanism is a / (2 z^2); eps = min_a T a/(2z^2) + log(1/delta)/(a-1)
    z, T, delta = 2.0, 10, 1e-5
    expected = min(T * a / (2 * z**2) + math.log(1 / delta) / (a - 1) for a in range(2, 257))
    assert math.isclose(rdp_epsilon(1.0, z, T, delta), expected)
    assert rdp_epsilon(0.1, z, T, delta) < expected  # subsampling amplifies privacy
    assert rdp_epsilon(0.1, 0.0, T, delta) == math.inf


def test_models_with_integer_buffers_are_rejected():
    with pytest.raises(ConfigError, match="cnn-bn"):
        DPFedAvgStrategy.from_config(_cfg(dataset="mnist", model="cnn-bn"))


def test_refusal_lists_every_model_without_integer_buffers():
    """The valid choices are derived from the model list, so every model dp-fedavg accepts is
    named (resnet18 and vgg11 included) and no BN model is."""
    with pytest.raises(ConfigError) as err:
        DPFedAvgStrategy.from_config(_cfg(dataset="mnist", model="resnet18-bn"))
    choices = str(err.value).split("valid choices: ")[1].split(", ")
    assert choices == ["cnn", "cnn-small", "lenet", "simple-cnn", "resnet18", "vgg11", "mlp", "logreg"]
    DPFedAvgStrategy.from_config(_cfg(dataset="mnist", model="vgg11"))  # accepted, as listed


def _noisy_round(seed_key: bool, seed: int, server_round: int = 3):
    """One server-side DP round of fixed client updates; returns the released model."""
    cfg = _cfg(**{"dp-mode": "server", "dp-noise-multiplier": 1.0, "dp-noise-seeded": seed_key, "seed": seed})
    strategy = DPFedAvgStrategy.from_config(cfg)
    rng = np.random.default_rng(7)
    w_t = [rng.standard_normal((10, 60)).astype(np.float32)]
    clients = _updates(rng, w_t, (0.1, 0.2))
    strategy.current_round_params = [a.copy() for a in w_t]
    strategy.num_sampled_clients = 2
    params, _ = strategy.aggregate_fit(server_round, [(None, fit_res(c, 1)) for c in clients], [])
    return parameters_to_ndarrays(params)[0]


def test_seeded_noise_gives_one_model_per_seed_and_round_and_leaves_numpy_alone():
    """dp-noise-seeded: the same (seed, round) releases the same model whatever NumPy's global
    generator holds (so a resumed run draws what an uninterrupted one would); another seed or
    round other noise; the global generator is as it was. Off (the default): Flower's draw from
    the global generator, as before."""
    np.random.seed(123)
    first = _noisy_round(True, seed=0)
    after = np.random.get_state()[1].copy()
    np.random.seed(999)  # a different global state must not matter
    again = _noisy_round(True, seed=0)
    np.testing.assert_array_equal(first, again)
    np.random.seed(123)  # the seeded round left the global generator where seed 123 put it
    np.testing.assert_array_equal(after, np.random.get_state()[1])
    assert not np.array_equal(first, _noisy_round(True, seed=1))
    assert not np.array_equal(first, _noisy_round(True, seed=0, server_round=4))
    np.random.seed(5)
    unseeded = _noisy_round(False, seed=0)
    np.random.seed(5)
    np.testing.assert_array_equal(unseeded, _noisy_round(False, seed=0))  # Flower's global draw
    assert not np.array_equal(unseeded, first)
