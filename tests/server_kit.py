"""Server-side builders shared by the server, node and runner tests: ``make_strategy`` (a FedAvg
``DriftServer`` on a two-array model, stepped one call at a time through ``RoundByRound``),
``Proxy`` (a client proxy that reports its partition out of ``CLIENTS``), and update screening's
fixtures: the global model ``W_T`` with ``client`` building a reply from it, and the screening
probe (``probe_config``, ``depends_only_on_the_mean``: does a strategy's new model depend on the
replies only through their mean?). A successful reply, ``fit_res``, is in tests/helpers_baselines.py.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Code, GetPropertiesRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.config import ConfigError
from fl_app.registry import METHODS, validate_config
from strategies.base import DriftFedAvg, fedavg_kwargs
from tests.conftest import FakeManager
from tests.helpers_baselines import fit_res
from tests.helpers_inprocess import RoundByRound

CLIENTS = 10  # the partitions a Proxy reports


def make_strategy(tmp_path, rounds=2, **overrides):
    cfg = validate_config({"fraction-fit": 1.0, "num-server-rounds": rounds, **overrides})
    w0 = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]

    def evaluate_fn(rnd, arrays, config):
        return float(np.abs(arrays[0]).sum()), {"accuracy": 0.5 + 0.1 * rnd}

    inner = DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    return RoundByRound(inner, cfg, tmp_path / "run", rounds), w0


class Proxy:
    def __init__(self, cid, pid):
        self.cid, self.pid = cid, pid

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.pid, "num-partitions": CLIENTS})


# ------------------------------------------------------------------------------ screening
# w_t: a float matrix, a float vector, an integer buffer (BN's num_batches_tracked)
W_T = [np.array([[1.0, 1.0], [1.0, 1.0]], np.float32), np.array([0.0, 0.0], np.float32), np.array(5, np.int64)]


def client(d_matrix, d_vector, count=6, extra=None):
    """w_t + the given update; the integer buffer as the client counted it."""
    arrays = [W_T[0] + np.float32(d_matrix), W_T[1] + np.asarray(d_vector, np.float32), np.array(count, np.int64)]
    return arrays + ([np.asarray(extra, np.float32)] if extra is not None else [])


class Everyone(FakeManager):
    """A client manager that hands out every proxy, whatever number is asked for."""

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return list(self.proxies)


PROBE_SIZES = [10, 20, 30]
# Moving the three replies by (d, -2d, d) keeps both their n_k-weighted mean (10 - 40 + 30 = 0)
# and their plain mean: a server that is a mean of the weights cannot tell the two sets apart.
PROBE_SHIFT = [1.0, -2.0, 1.0]
PROBE_STEPS = [3, 5, 9]


def probe_config(cls) -> dict:
    """A config the strategy accepts: logistic regression on synthetic data, else a model with
    batch norm (a server such as FedBN's refuses a model without it)."""
    name = next(n for n, m in METHODS.items() if m.strategy is cls)
    for setting in ({"dataset": "synthetic", "model": "logreg"}, {"dataset": "mnist", "model": "cnn-bn"}):
        cfg = validate_config({"strategy": name, "fraction-fit": 1.0, "min-fit-clients": 3,
                               "min-available-clients": 3, **setting})
        try:
            cls.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters([]), None))
        except ConfigError:
            continue
        return cfg
    raise AssertionError(f"no probe config for {cls.__name__}")


def aggregate_once(cls, cfg, w_t, replies):
    strategy = cls.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w_t), None))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w_t), Everyone(len(replies)))
    results = [(proxy, fit_res(r, n, num_steps=k, train_loss=1.0))  # unequal step counts too
               for (proxy, _), r, n, k in zip(instructions, replies, PROBE_SIZES, PROBE_STEPS)]
    params, _ = strategy.aggregate_fit(1, results, [])
    return parameters_to_ndarrays(params)


def depends_only_on_the_mean(cls, cfg) -> bool:
    """Does the strategy's new model depend on the replies only through their mean? Two reply
    sets with the same weighted and plain means must give the same model."""
    from strategies.base import configured_model
    from tasks.models import get_weights

    w_t = get_weights(configured_model(cfg))
    rng = np.random.default_rng(0)
    replies = [[w + rng.normal(0, 0.1, w.shape).astype(w.dtype) if np.issubdtype(w.dtype, np.floating) else w
                for w in w_t] for _ in PROBE_SIZES]
    shift = [rng.normal(0, 0.5, w.shape).astype(w.dtype) if np.issubdtype(w.dtype, np.floating) else 0 * w
             for w in w_t]
    moved = [[r + np.asarray(c * s, r.dtype) for r, s in zip(reply, shift)] for reply, c in zip(replies, PROBE_SHIFT)]
    a, b = aggregate_once(cls, cfg, w_t, replies), aggregate_once(cls, cfg, w_t, moved)
    return all(np.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(a, b))
