"""The kit of the tests that drive the server and the cohort node one call at a time, in process:

- ``RoundByRound``: ``DriftServer``'s steps, each call a step a test names, with the replies the
  test hands in (in the order it chooses), under the names of the Flower strategy calls those
  tests were written against; ``make_strategy`` builds one for FedAvg on a two-array model.
  Test code only: the product runs the server through its own ``fit``
  (``scripts/security_table.py`` included);
- update screening's probe: the global model ``W_T`` with ``client`` building a reply from it,
  ``Everyone`` (a manager that samples every proxy), and ``probe_config`` with
  ``depends_only_on_the_mean`` (does a strategy's new model depend on the replies only through
  their mean?);
- the node side of the cohort wire: ``reply_as_fitres`` (what Flower's NumPyClient wrapper makes
  of a node's fit return value) and ``cohort_fit`` (a ``CohortClient``'s fit on the bundle the
  server would send for ``N`` partitions, split back into one reply per partition).

A successful reply (``fit_res``), the client proxy (``Proxy``) and a whole run in process
(``serve_in_process``) are in tests/kit.py.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from flwr.server.history import History

from fl_app.config import ConfigError
from fl_app.node.cohort_client import CohortClient
from fl_app.registry import METHODS, validate_config
from fl_app.server.server import DriftServer
from protocol.cohort import bundle_instructions, split_replies
from strategies.base import DriftFedAvg, fedavg_kwargs
from tests.kit import FakeManager, fit_res


# ------------------------------------------------------------------------ the server, step by step
class CallersManager:
    """The client manager the server is built with: it answers as the manager the latest call
    handed in (a test hands one to each call, as to a Flower strategy; ``current``), so the
    server is driven through its public constructor alone."""

    def __init__(self):
        self.current = SimpleClientManager()

    def __getattr__(self, name: str):
        return getattr(self.current, name)


class RoundByRound:
    """The server's steps, each call the step it names (nothing is inferred from their order):

    - ``configure_fit(t, parameters, manager)``: the server's ``configure`` step;
    - ``aggregate_fit(t, results, failures)``: ``screen`` then ``aggregate``; returns the new
      global parameters and the method's metrics, or (None, {}) when the previous model stays;
    - ``evaluate(0, parameters)``: the initial model's evaluation; ``evaluate(t, parameters)``
      for t >= 1 ends round t as the server's loop does: ``evaluate``, ``record``,
      ``checkpoint``, the summary after the last round, an injected crash."""

    def __init__(self, inner, cfg: dict, run_dir, num_rounds: int, resume_from=None, previous_rows=None,
                 method_class: type | None = None):
        self.manager = CallersManager()
        self.server = DriftServer(client_manager=self.manager, strategy=inner,
                                  cfg={**cfg, "num-server-rounds": num_rounds}, run_dir=run_dir,
                                  method_class=method_class, resume_from=resume_from,
                                  previous_rows=previous_rows)
        self.inner = inner

    # what tests read and set
    @property
    def row(self) -> dict:
        return self.server.record.row

    @row.setter
    def row(self, value: dict) -> None:
        self.server.record.row = value

    @property
    def rows(self) -> list[dict]:
        return self.server.record.rows

    @property
    def initial(self) -> dict:
        return self.server.record.initial

    @property
    def screening(self):
        return self.server.screening

    @property
    def participation(self):
        return self.server.participation

    @property
    def round_started(self) -> float:
        return self.server.round_started

    @round_started.setter
    def round_started(self, value: float) -> None:
        self.server.round_started = value

    @property
    def client_manager(self):
        return self.manager.current

    @client_manager.setter
    def client_manager(self, manager) -> None:
        self.manager.current = manager

    def write_summary(self, stopped: str | None = None) -> None:
        self.server.record.write_summary(self.manager.current, stopped=stopped)

    @property
    def run_dir(self):
        return self.server.run_dir

    # the steps
    def initialize_parameters(self, manager):
        self.manager.current = manager
        self.server.parameters = self.inner.initialize_parameters(manager)
        return self.server.parameters

    def configure_fit(self, server_round: int, parameters, manager) -> list:
        self.manager.current, self.server.parameters = manager, parameters
        return self.server.configure(server_round)

    def aggregate_fit(self, server_round: int, results: list, failures: list):
        accepted = self.server.screen(server_round, results, failures)
        return self.server.aggregate(server_round, accepted, failures, History())

    def evaluate(self, server_round: int, parameters):
        """The server's evaluation of round ``server_round`` (its loss and metrics, as Flower's
        history gets them; None when not evaluated); for t >= 1 also the rest of the round."""
        server = self.server
        server.parameters = parameters
        if server_round == 0:
            return server.evaluate_initial()
        history = History()
        per_class = server.evaluate(server_round, None, history)
        server.record_and_checkpoint(server_round, per_class)
        if not history.losses_centralized:
            return None
        metrics = {name: values[-1][1] for name, values in history.metrics_centralized.items()}
        return history.losses_centralized[-1][1], metrics


def make_strategy(tmp_path, rounds=2, **overrides):
    """A FedAvg ``DriftServer`` of ``rounds`` rounds (every client sampled, the run config
    ``overrides``) on a two-array model at zero, writing its run folder under ``tmp_path / "run"``,
    and evaluating the global model as loss sum(|w[0]|) and accuracy 0.5 + 0.1 t; stepped one
    call at a time (``RoundByRound``). Returns (the stepped server, the initial arrays)."""
    cfg = validate_config({"fraction-fit": 1.0, "num-server-rounds": rounds, **overrides})
    w0 = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]

    def evaluate_fn(rnd, arrays, config):
        return float(np.abs(arrays[0]).sum()), {"accuracy": 0.5 + 0.1 * rnd}

    inner = DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    return RoundByRound(inner, cfg, tmp_path / "run", rounds), w0


# --------------------------------------------------------------------------------------- screening
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
    """The global model strategy ``cls`` (on ``cfg``) makes of ``replies`` to ``w_t`` in round 1,
    the replies of ``PROBE_SIZES`` examples and ``PROBE_STEPS`` steps each."""
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


# ---------------------------------------------------------------- the node side of the cohort wire
N = 5  # partitions of the run's data


def reply_as_fitres(ret) -> FitRes:
    """What Flower's NumPyClient wrapper makes of the node's fit return value."""
    reply, num_examples, metrics = ret
    return FitRes(status=Status(code=Code.OK, message="Success"), parameters=ndarrays_to_parameters(reply),
                  num_examples=num_examples, metrics=metrics)


def cohort_fit(node: CohortClient, arrays: list[np.ndarray], partitions: list[int], config: dict):
    """The node's fit on the bundle the server would send (through the wire), split back."""
    ins = FitIns(ndarrays_to_parameters(arrays), {**config, "num-partitions": N})
    bundle = bundle_instructions([(p, ins) for p in partitions])
    ret = node.fit(parameters_to_ndarrays(bundle.parameters), dict(bundle.config))
    return dict(split_replies(reply_as_fitres(ret)))
