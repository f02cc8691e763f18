"""``RoundByRound``: ``DriftServer``'s steps driven one call at a time by a test that hands in
each round's replies itself (in process, in the order it chooses), under the names of the
Flower strategy calls those tests were written against. Test code only: the product runs the
server through its own ``fit`` (``scripts/security_table.py`` included)."""

from __future__ import annotations

from flwr.server.client_manager import SimpleClientManager
from flwr.server.history import History

from fl_app.server.server import DriftServer


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
