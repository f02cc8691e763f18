"""Driving a method without Flower's transport: a ``ClientProxy`` that hands each fit
instruction to a ``NumPyClient`` in this process.

Used where a run is driven round by round in one process, with no Ray and no SuperLink: the
tests of strategies and of every method's two rounds, and ``scripts/security_table.py``. It
converts parameters exactly as Flower's transport does on each side (``Parameters`` <->
NumPy arrays), so the strategy and the client see what they would see in a simulation; what
it leaves out is the serialisation, the actors and the ClientApp's mods.
"""

from __future__ import annotations

from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy


class InProcessProxy(ClientProxy):
    """Hands the FitIns to a real NumPyClient (a method client, or one inside ``NodeClient``)."""

    def __init__(self, cid: str, client):
        super().__init__(cid)
        self.client = client

    def fit(self, ins, timeout, group_id):
        arrays, n, metrics = self.client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)

    def get_properties(self, ins, timeout, group_id):
        raise NotImplementedError

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class RoundByRound:
    """``DriftServer``'s steps (``fl_app/server/server.py``) driven one call at a time by a test
    or script that hands in each round's replies itself (in process, in the order it chooses),
    under the names of the Flower strategy calls those scripts were written against:

    - ``configure_fit(t, parameters, manager)``: the server's ``configure`` step;
    - ``aggregate_fit(t, results, failures)``: ``screen`` then ``aggregate``; returns the new
      global parameters and the method's metrics, or (None, {}) when the previous model stays;
    - ``evaluate(0, parameters)``: the initial model's evaluation; ``evaluate(t, parameters)``
      for t >= 1 ends round t as the server's loop does: ``evaluate``, ``record``,
      ``checkpoint``, the summary after the last round, an injected crash.

    Each call is the step it names; nothing is inferred from the order of the calls."""

    def __init__(self, inner, cfg: dict, run_dir, num_rounds: int, resume_from=None, previous_rows=None,
                 method_class: type | None = None):
        from flwr.server.client_manager import SimpleClientManager

        from fl_app.server.server import DriftServer

        self.server = DriftServer(client_manager=SimpleClientManager(), strategy=inner,
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
        return self.server._client_manager

    @client_manager.setter
    def client_manager(self, manager) -> None:
        self.server._client_manager = manager

    def write_summary(self, stopped: str | None = None) -> None:
        self.server.record.write_summary(self.server._client_manager, stopped=stopped)

    # the steps
    @property
    def run_dir(self):
        return self.server.run_dir

    def initialize_parameters(self, manager):
        self.server._client_manager = manager
        self.server.parameters = self.inner.initialize_parameters(manager)
        return self.server.parameters

    def configure_fit(self, server_round: int, parameters, manager) -> list:
        self.server._client_manager, self.server.parameters = manager, parameters
        return self.server.configure(server_round)

    def aggregate_fit(self, server_round: int, results: list, failures: list):
        from flwr.server.history import History

        accepted = self.server.screen(server_round, results, failures)
        return self.server.aggregate(server_round, accepted, failures, History())

    def evaluate(self, server_round: int, parameters):
        """The server's evaluation of round ``server_round`` (its loss and metrics, as Flower's
        history gets them; None when not evaluated); for t >= 1 also the rest of the round."""
        from flwr.server.history import History

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
