"""``DriftServer``: fl-drift's Flower ``Server`` (the legacy API). Its ``fit`` is the whole run,
written down in order: the start-up before round 1, then every round

    configure -> send -> collect -> screen -> aggregate -> evaluate -> record -> checkpoint

each step a method of its own below, calling the small parts that do the work:
``Participation`` (drop-outs, too few successes), ``check_reply`` and ``Screening`` (which
replies the method sees, and how), ``round_drift`` (the drift columns), ``RunRecorder``
(metrics.csv, summary.json), ``RunTracker`` (per-class file, trackers) and the checkpoint
functions. The method's own ``Strategy`` is called for what a Flower strategy does
(``configure_fit``, ``aggregate_fit``, ``evaluate``, ``configure_evaluate``,
``aggregate_evaluate``) and for nothing else, so it stays a plain Flower ``Strategy`` that also
runs under Flower's own ``Server``. Sending and collecting use Flower's public
``flwr.server.server.fit_clients`` / ``evaluate_clients``, the functions its own ``Server``
uses (a thread per client, each reply or failure as it comes back); on the cohort path
(``execution``, ``fl_app/common/execution_path.py``) one bundle goes to each cohort node
instead (``fl_app/server/cohort_routing.py``) and its reply is split back into one reply or
failure per virtual client, so every later step sees what a per-client run would. With summed
replies (``cohort-replies``, ``fl_app.common.execution_checks.summed_replies``) each node replies
one n_k-weighted mean and sums for its clients instead; the method's strategy aggregates the
nodes' replies (each standing for its clients, ``protocol.traffic.clients_in``), and the
clients' metrics, counts and drift columns come from the clients' own records in them
(``screen_sums``, ``drift_from_sums``).

The rules the steps apply, whatever the method:
- a reply whose arrays contain NaN/Inf, or whose count or shapes differ from what was sent,
  is rejected before screening (``num_rejected``); an aggregate that is not finite is
  discarded and the previous global model kept;
- failed clients (raised, timed out) are counted (``num_failures``); ``drop-rate`` drops
  clients (``num_dropped``) and the run stops with ``RunAborted`` when fewer than
  ``min-fit-fraction`` of the sampled clients succeed;
- ``inject-faults``' omniscient attacks (``alie``, ``ipm``, ``mimic``) replace the attacking
  partitions' accepted replies by vectors crafted from the honest ones
  (``fl_app/server/omniscient.py``), a simulation-only stand-in for colluding attackers; then
- ``screening`` clips, rejects or robustly replaces the accepted updates before the method
  aggregates them (``num_clipped``, ``screen_bound``); in a run that screens, each client's next
  instruction says which of its rounds was last counted, so a client whose reply was left out
  goes back to its state from before that round (``fl_app/server/counted.py``);
- every ``checkpoint-every`` rounds a checkpoint is written; a resumed run starts at the
  round after its checkpoint's;
- ``inject-faults = "crash-after:<round>"`` crashes the server after that round.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import numpy as np
from flwr.common import FitIns, Parameters, parameters_to_ndarrays
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.history import History
from flwr.server.server import evaluate_clients, fit_clients
from flwr.server.strategy import Strategy

from fl_app.common.execution_checks import PER_CLIENT, summed_replies
from fl_app.common.execution_path import Execution
from fl_app.common.files import STATE_NOT_KEPT, StateNotKept
from fl_app.server.checkpoint import Checkpoint, checkpoint_due, drop_checkpoint, save_checkpoint
from fl_app.server.cohort_routing import fit_cohort, fit_cohort_summed
from fl_app.server.counted import CountedRounds
from fl_app.server.crash import crash_if_injected
from fl_app.server.drift import drift_from_sums, layout, round_drift
from fl_app.server.omniscient import OmniscientAttacks
from fl_app.server.participation import Participation, RunAborted
from fl_app.server.placement import keep_rounds, record_ray_nodes
from fl_app.server.preflight import loud
from fl_app.server.recording import (
    RunRecorder,
    array_views,
    check_reply,
    client_accuracy_stats,
    evaluated_round,
    in_node_order,
    message_nbytes,
    summarise_client_metrics,
)
from fl_app.server.screening import Screening
from fl_app.server.tracking import RunTracker
from protocol.cohort import SumSpec
from protocol.layout import all_finite
from protocol.traffic import WEIGHTS_ONLY
from strategies.arrays import total_clients
from tasks.datasets import DataUnavailableError, PartitionError
from tasks.partition_figure import write_run_split

log = logging.getLogger("flwr.fl_drift")


class DriftServer(Server):
    """Runs one fl-drift run: ``fit`` is the loop; ``start_up`` and one method per step.

    The strategy is given to the server at its construction (``strategy=``) or later by
    Flower's own ``set_strategy``, which wires it in. ``method_class`` is the strategy class the
    method registers, whose declared facts the drift columns read (``UNIFORM_MEAN``,
    ``local_entries``); it is not always the strategy's own class (a method's ``from_config``
    may return one of Flower's wrappers), so the ServerApp passes it down; by default the class
    of the strategy set. ``startup`` (``fl_app.server.startup.ServerStartup``, begun) completes
    the start-up once the nodes are known: the test split, which ``start_up`` loads into
    ``evaluation`` (the strategy's central evaluation), and the check of the data and the
    partitioning. ``resume_from`` is the checkpoint a
    resumed run continues (its rows: ``previous_rows``); the strategy's own state is restored
    from it when the strategy is set. ``execution`` is the path (``fl_app.common.execution_path.Execution``:
    per-client or cohort, and why), logged once and recorded in summary.json; by default
    per-client."""

    def __init__(self, *, client_manager: ClientManager, cfg: dict, run_dir: Path, strategy: Strategy | None = None,
                 method_class: type | None = None, unbatched: bool = False, startup=None, evaluation=None,
                 resume_from: Checkpoint | None = None,
                 previous_rows: list[dict] | None = None, execution: Execution | None = None):
        super().__init__(client_manager=client_manager, strategy=strategy)
        self.method_class = method_class
        self.unbatched = unbatched  # the method's update trains alone on a cohort node (summed_replies)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.num_rounds = cfg["num-server-rounds"]  # of the whole run, resumed or not
        self.record = RunRecorder(cfg, run_dir)
        self.tracker = RunTracker(self.run_dir, cfg)
        self.screening = Screening(cfg)
        self.attacks = OmniscientAttacks(cfg)  # inject-faults' alie, ipm, mimic (simulation only)
        self.participation = Participation(cfg)
        self.counted = CountedRounds(cfg, resume_from is not None,
                                     resume_from.counted_rounds if resume_from is not None else None)
        self.startup, self.evaluation = startup, evaluation
        self.resume_from = resume_from
        self.done = resume_from.round if resume_from is not None else 0  # rounds before this process
        self.last_checkpoint = self.done
        self.initial_evaluation: tuple[dict, list | None] | None = None  # round 0, for the trackers
        self.sent_weights: list[np.ndarray] | None = None  # w_t, for the drift columns
        self.sent_shapes: list[tuple] | None = None  # what every reply must match
        self.round_started = 0.0
        self.execution = execution or Execution(PER_CLIENT, "one node per client")
        self.sum_spec: SumSpec | None = None  # the cohort nodes reply one sum each (``reply_sums``)
        self.round_sums: list | None = None  # this round's accepted node sums, for the drift columns
        self.record.facts["execution"] = self.execution.record()
        if resume_from is not None:
            self.record.resume(resume_from, previous_rows or [])
            keep_rounds(self.record.run_dir, resume_from.round)  # the rounds after it run again
        if strategy is not None:
            self.set_strategy(strategy)

    def set_strategy(self, strategy: Strategy) -> None:
        """Run the method's ``strategy``: the entries it keeps out of screening
        (``screen_skip``), and on resume its state from the checkpoint."""
        super().set_strategy(strategy)
        self.method_class = self.method_class or type(strategy)
        self.screening.skip = frozenset(getattr(strategy, "screen_skip", ()))
        self.attacks.skip = self.screening.skip
        self.sum_spec = self.reply_sums()
        if self.resume_from is not None and hasattr(strategy, "set_state"):
            strategy.set_state(self.resume_from.strategy_state)

    def reply_sums(self) -> SumSpec | None:
        """What a cohort node sums (``protocol.cohort.SumSpec``: the model's arrays averaged, the
        drift columns' entries), or None when every client replies its own arrays: the
        per-client path, ``cohort-replies = "full"``, or a method or setting that cannot
        (``summed_replies``)."""
        if not self.execution.cohort or not summed_replies(self.cfg, self.method_class, self.unbatched):
            return None
        num_state, head, body = layout(self.cfg["model"], self.cfg["dataset"], self.method_class)
        return SumSpec(num_state, head, body)

    # ------------------------------------------------------------------ the run
    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        """The run: start-up, then rounds ``done + 1`` .. ``num-server-rounds`` (``num_rounds``,
        Flower's count for this process, is the same number of rounds)."""
        history = History()
        if not self.start_up():
            return history, 0.0
        for server_round in range(self.done + 1, self.num_rounds + 1):
            instructions = self.configure(server_round)
            if instructions:
                results, failures = self.send(instructions, timeout, server_round)
                replied = time.monotonic()
                accepted = self.screen(server_round, results, failures)
                self.aggregate(server_round, accepted, failures, history)
                self.record.row["aggregate_seconds"] = time.monotonic() - replied  # checks, screening, aggregation
            evaluating = time.monotonic()
            per_class = self.evaluate(server_round, timeout, history)
            self.record.row["evaluate_seconds"] = time.monotonic() - evaluating  # 0 in a round that does not
            self.record_and_checkpoint(server_round, per_class)
        return history, self.record.elapsed()

    def record_and_checkpoint(self, server_round: int, per_class) -> None:
        """The end of every round, in this order: the metrics row, the checkpoint, summary.json
        after the last round, then an injected crash (``crash-after:<round>``) if one is due."""
        self.record_round(server_round, per_class)
        self.checkpoint(server_round)
        if server_round == self.num_rounds:
            self.finish()
        crash_if_injected(self.cfg, server_round)

    # ------------------------------------------------------------------ start-up
    def start_up(self) -> bool:
        """Before round 1, in this order: the initial parameters, the nodes' partitions and the
        test split (``startup``, ``fl_app/server/startup.py``, loaded into ``evaluation``), the
        initial model's evaluation (round 0; not on resume: the
        checkpoint's model is already recorded), then the data fingerprint, the run folder's
        first file (``RunRecorder.folder``: a run refused by its start-up, for no data or a
        partitioning that cannot be cut, leaves no folder behind), and round 0 to the trackers.
        False when a resumed run has no round left (its summary is then written). A run that
        does not resume first removes client state an earlier run of its folder left (``drop_client_state``)."""
        log.info("fl-drift: execution %s (%s)", self.execution.path, self.execution.reason)
        if self.done >= self.num_rounds:
            self.finish()
            return False
        if self.resume_from is None:
            self.drop_client_state()  # an earlier, interrupted run's, never this one's
        self.parameters = self.strategy.initialize_parameters(client_manager=self.client_manager())
        with loud(DataUnavailableError, PartitionError):  # one fl-drift: line, Flower's traceback at debug only
            if self.startup is not None:  # start-up step 2: the nodes' partitions, the test split loaded
                self.evaluation.load(*self.startup.test_split())
            if self.resume_from is None:
                self.evaluate_initial()
            if self.startup is not None:  # step 3: the partitioning checked, before round 1
                self.startup.ready()
        manager = self.client_manager()
        self.record.data_fingerprint(manager)  # the nodes have reported their partitions
        write_run_split(self.run_dir, self.cfg, None if getattr(manager, "data_path_of", None)
                        else total_clients(manager))  # partitions.png, client_label_counts.csv
        if self.initial_evaluation is not None:  # round 0 to the trackers, now that the start-up passed
            self.tracker.log_initial(*self.initial_evaluation)
        return True

    def evaluate_initial(self) -> tuple | None:
        """Round 0: the initial model's test accuracy and loss (round 0 of the plots); its
        loss and metrics less the per-class accuracies (None without an evaluation)."""
        result = self.strategy.evaluate(0, self.parameters)
        if result is None:
            return None
        loss, metrics = result[0], {k: v for k, v in result[1].items() if k != "per_class_accuracy"}
        self.record.initial = {"initial_accuracy": float(metrics.get("accuracy", float("nan"))),
                               "initial_loss": float(loss)}
        as_rows = {"test_accuracy": self.record.initial["initial_accuracy"], "test_loss": float(loss),
                   **{k: v for k, v in metrics.items() if k != "accuracy"}}  # the names metrics.csv uses
        self.initial_evaluation = (as_rows, result[1].get("per_class_accuracy"))
        log.info("initial model: test accuracy %.4f, loss %.4f", self.record.initial["initial_accuracy"], loss)
        return loss, metrics

    # ------------------------------------------------------------------ the steps of a round
    def send(self, instructions: list[tuple], timeout: float | None, server_round: int) -> tuple[list, list]:
        """Send the instructions, then collect the replies and failures: one message per client
        (Flower's ``fit_clients``), or on the cohort path one bundle per cohort node, split back
        into one reply or failure per virtual client (``fl_app.server.cohort_routing.fit_cohort``)."""
        if self.sum_spec is not None:
            return fit_cohort_summed(instructions, self.sum_spec, max_workers=self.max_workers, timeout=timeout,
                                     group_id=server_round)
        send = fit_cohort if self.execution.cohort else fit_clients
        return send(instructions, max_workers=self.max_workers, timeout=timeout, group_id=server_round)

    def configure(self, server_round: int) -> list[tuple]:
        """The method samples and instructs its clients; ``drop-rate`` drops some; every
        instruction carries where the run keeps its files and its last checkpoint."""
        self.round_started = time.monotonic()
        row = self.record.begin_round(server_round)
        instructions = self.strategy.configure_fit(server_round, self.parameters, self.client_manager())
        sent = self.model_sent(instructions)
        self.sent_weights = array_views(sent)
        self.screening.begin_round(sent)  # w_t: the model the clients receive
        instructions, row["num_dropped"] = self.participation.select(server_round, instructions)
        row["bytes_down_per_client"] = message_nbytes([ins.parameters for _, ins in instructions])
        if instructions:
            self.sent_shapes = self.reply_shapes(instructions)
        extra = {"run-dir": str(self.run_dir.resolve()), "checkpoint-round": self.last_checkpoint,
                 "checkpoint-every": self.cfg["checkpoint-every"]}
        manager = self.client_manager()
        return [(c, FitIns(ins.parameters, {**ins.config, **extra, **self.counted.instruction(manager, c)}))
                for c, ins in instructions]

    def reply_shapes(self, instructions: list[tuple]) -> list[tuple]:
        """The shapes every reply must have: what the first instruction carried (the weights and
        the groups after them, which a client's ``up`` groups mirror), or the weights alone for a
        traffic family that sends groups down and none up (``protocol.traffic``: FedCM's Δ)."""
        traffic = getattr(self.strategy, "TRAFFIC", WEIGHTS_ONLY)
        arrays = parameters_to_ndarrays(instructions[0][1].parameters)
        if traffic.down and not traffic.up:
            arrays = arrays[: len(self.parameters.tensors)]
        return [a.shape for a in arrays]

    @property
    def replies_carry_more(self) -> bool:
        """The replies carry groups that answer nothing sent (a family with ``up`` groups and no
        ``down``: CCVR's class statistics), checked after the arrays sent by the strategy's split."""
        traffic = getattr(self.strategy, "TRAFFIC", WEIGHTS_ONLY)
        return bool(traffic.up) and not traffic.down

    def model_sent(self, instructions: list[tuple]) -> Parameters:
        """w_t, the model the round's clients start from, that the drift columns and screening
        measure each update from: the model arrays of the first instruction (every instruction
        carries the same), which a method may make another point than its global model (FedACG
        sends a look-ahead), without the extra arrays after them; the global model when none."""
        if not instructions:
            return self.parameters
        sent = instructions[0][1].parameters
        return Parameters(tensors=sent.tensors[: len(self.parameters.tensors)], tensor_type=sent.tensor_type)

    def screen(self, server_round: int, results: list, failures: list) -> list:
        """The replies the method will see, in node order: those that pass ``check_reply``,
        then ``screening``; counts them into the row with the clients' metrics, and stops the
        run (``RunAborted``) when too few sampled clients succeeded."""
        self.stop_if_state_not_kept(server_round, failures)
        row = self.record.row
        row["fit_phase_seconds"] = time.monotonic() - self.round_started  # sampling to the last reply
        if self.sum_spec is not None:
            return self.screen_sums(server_round, results, failures)
        row["bytes_up_per_client"] = message_nbytes([res.parameters for _, res in results])
        accepted = []
        for client, res in in_node_order(results, self.client_manager()):
            problem = check_reply(res, self.sent_shapes, self.replies_carry_more)
            if problem:
                log.warning("round %d: rejected the update of node %s: %s", server_round, client.cid, problem)
            else:
                accepted.append((client, res))
        accepted = self.attacks.apply(server_round, accepted, self.sent_weights)
        accepted = self.screening.apply(server_round, accepted, row)
        self.counted.count(server_round, self.client_manager(), accepted)  # what the method aggregates
        row.update(num_clients=len(accepted), num_failures=len(failures), num_rejected=len(results) - len(accepted))
        for failure in failures:
            log.warning("round %d: a client failed: %r", server_round, failure)
        row.update(summarise_client_metrics([(r.num_examples, r.metrics) for _, r in accepted]))
        row.update(record_ray_nodes(self.record.folder(), server_round,
                                    [(client.cid, res.metrics) for client, res in accepted]))
        self.stop_if_short(server_round, len(accepted), len(results), len(failures))
        return accepted

    def screen_sums(self, server_round: int, results: list, failures: list) -> list:
        """``screen`` for summed replies (``results``: (node proxy, ``protocol.cohort.NodeSum``)):
        the clients each node rejected (its check is the server's, ``reply_problem``) or whose
        sum is not usable are counted as rejected; the clients' own records give the metrics and
        counts; the nodes' replies, each standing for its clients, are what the method aggregates.
        ``bytes_up_per_client`` is the nodes' reply bytes over the clients in them."""
        row = self.record.row
        accepted, clients, rejected = [], [], 0
        for host, node in results:
            for partition, reason in node.rejected:
                log.warning("round %d: rejected the update of partition-%d: %s", server_round, partition, reason)
            rejected += len(node.rejected)
            if not node.clients:
                continue
            problem = check_reply(node.reply, self.sent_shapes, self.replies_carry_more)
            if problem:
                log.warning("round %d: rejected the summed update of node %s (%d clients): %s", server_round,
                            host.cid, len(node.clients), problem)
                rejected += len(node.clients)
                continue
            accepted.append((host, node))
            clients += node.clients
        replied = sum(len(node.clients) + len(node.rejected) for _, node in results)
        if replied:  # every array the nodes sent: the mean and sums, and the drift columns' sums
            sent = sum(message_nbytes([node.reply.parameters]) or 0.0 for _, node in results)
            sent += sum(int(a.nbytes) for _, node in results for a in node.weighted_step + node.directions)
            row["bytes_up_per_client"] = sent / replied
        row.update(num_clients=len(clients), num_failures=len(failures), num_rejected=rejected)
        for failure in failures:
            log.warning("round %d: a client failed: %r", server_round, failure)
        row.update(summarise_client_metrics([(c.num_examples, c.metrics) for c in clients]))
        row.update(record_ray_nodes(self.record.folder(), server_round,
                                    [(f"partition-{c.partition}", c.metrics) for c in clients]))
        self.stop_if_short(server_round, len(clients), len(clients) + rejected, len(failures))
        self.round_sums = [node for _, node in accepted]
        return [(host, node.reply) for host, node in accepted]

    def stop_if_state_not_kept(self, server_round: int, failures: list) -> None:
        """Stop the run (``StateNotKept``) when a client could not write the state it keeps
        between rounds (a full disk, say: ``fl_app.common.files``), before anything of the round
        is aggregated or recorded. No summary is written: the run is unfinished, and a resume
        continues it from its last checkpoint, redoing this round, once the disk has room."""
        for failure in failures:
            text = repr(failure)  # an exception, a (proxy, FitRes) pair, or Flower's error with the client's text
            if STATE_NOT_KEPT in text:
                said = text[text.index(STATE_NOT_KEPT):].splitlines()[0].split("'>")[0].rstrip("'\")")
                raise StateNotKept(f"round {server_round}: {said}. Stopping the run before round {server_round} is"
                                   f" recorded; its last checkpoint (round {self.last_checkpoint}) is kept: resume"
                                   " the run once the disk has room")

    def stop_if_short(self, server_round: int, accepted: int, replied: int, failed: int) -> None:
        """Stop the run (``RunAborted``) when too few sampled clients succeeded."""
        reason = self.participation.shortfall(server_round, accepted, replied, failed)
        if reason:  # the rounds so far are a result: the summary says why and where the run stopped
            self.record.write_summary(self.client_manager(), stopped=reason)
            raise RunAborted(f"{reason}. Stopping the run; the summary and the last checkpoint are kept.")

    def aggregate(self, server_round: int, accepted: list, failures: list, history: History) -> tuple:
        """The drift columns, then the method's aggregation into the new global model; a
        round without accepted replies, or a non-finite aggregate, keeps the previous one.
        The new parameters and the method's metrics, or (None, {}) when the model stays."""
        if not accepted:
            return None, {}
        if self.sum_spec is not None:
            self.record.row.update(drift_from_sums(self.cfg, self.method_class, self.round_sums or []))
        else:
            replies = [(r.num_examples, array_views(r.parameters)) for _, r in accepted]
            self.record.row.update(round_drift(self.cfg, self.method_class, self.sent_weights, replies))
        parameters, metrics = self.strategy.aggregate_fit(server_round, accepted, failures)
        if parameters is not None and not all_finite(parameters_to_ndarrays(parameters)):
            log.error("round %d: the aggregate is not finite; keeping the previous global model", server_round)
            return None, {}
        self.record.row.update({k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float))})
        history.add_metrics_distributed_fit(server_round=server_round, metrics=metrics or {})
        if parameters is not None:
            self.parameters = parameters
        return parameters, metrics

    def evaluate(self, server_round: int, timeout: float | None, history: History) -> list | None:
        """The server's evaluation of the new global model in the rounds that evaluate
        (``evaluate-every``, always the last), then, with ``client-test-fraction`` > 0, the
        clients' on their own test splits; the per-class accuracies (None when not evaluated)."""
        if not evaluated_round(server_round, self.cfg["evaluate-every"], self.num_rounds):
            return None
        result = self.strategy.evaluate(server_round, self.parameters)
        if result is None:
            return None
        loss, metrics = result[0], dict(result[1])
        per_class = metrics.pop("per_class_accuracy", None)  # to per_class_accuracy.csv, not the history
        self.record.row.update(test_loss=float(loss), test_accuracy=float(metrics.get("accuracy", float("nan"))))
        if "min_class_accuracy" in metrics:
            self.record.row["min_class_accuracy"] = float(metrics["min_class_accuracy"])
        history.add_loss_centralized(server_round=server_round, loss=loss)
        history.add_metrics_centralized(server_round=server_round, metrics=metrics)
        if self.cfg["client-test-fraction"] > 0:
            self.evaluate_on_clients(server_round, timeout)
        return per_class

    def evaluate_on_clients(self, server_round: int, timeout: float | None) -> None:
        """The clients' accuracies of the global model on their local test splits, into the row."""
        instructions = self.strategy.configure_evaluate(server_round, self.parameters, self.client_manager())
        if not instructions:
            return
        results, failures = evaluate_clients(instructions, max_workers=self.max_workers, timeout=timeout,
                                             group_id=server_round)
        self.strategy.aggregate_evaluate(server_round, results, failures)
        accuracies = [float(r.metrics["accuracy"]) for _, r in results
                      if isinstance(r.metrics.get("accuracy"), (int, float))]
        self.record.row.update(client_accuracy_stats(accuracies))
        for failure in failures:
            log.warning("round %d: a client failed to evaluate: %r", server_round, failure)

    def record_round(self, server_round: int, per_class) -> None:
        """The round's row to metrics.csv (accuracy and loss empty when not evaluated), the
        per-class file and trackers, and one log line."""
        row = self.record.row
        row["round_seconds"] = time.monotonic() - self.round_started
        self.record.write_row(row)
        self.tracker.log_round(row, per_class)
        if "test_accuracy" in row:
            tested = f"test accuracy {row['test_accuracy']:.4f}, test loss {row['test_loss']:.4f}"
        else:
            tested = f"test accuracy not evaluated (evaluate-every {self.cfg['evaluate-every']})"
        log.info("round %d/%d: %s, clients %d, failures %d, %.1fs", server_round, self.num_rounds, tested,
                 row.get("num_clients", 0), row.get("num_failures", 0), row["round_seconds"])

    def checkpoint(self, server_round: int) -> None:
        """A checkpoint when one is due (``checkpoint-every``, and the last round), carrying the
        data fingerprint so a resume can refuse other data."""
        if not checkpoint_due(self.cfg["checkpoint-every"], server_round, self.num_rounds):
            return
        state = self.strategy.get_state() if hasattr(self.strategy, "get_state") else {}
        manager = self.client_manager()
        save_checkpoint(self.run_dir, Checkpoint(server_round, parameters_to_ndarrays(self.parameters), state,
                                                 getattr(manager, "draws", 0), self.record.elapsed(),
                                                 self.cfg["model"], self.record.data_fingerprint(manager),
                                                 self.counted.state()))
        self.last_checkpoint = server_round

    def finish(self) -> None:
        """Summary file; client-state mirrors and cohort nodes' row journals are only needed to
        resume, so remove them, and the checkpoint too with ``keep-checkpoint = false`` (after
        the summary: a crash before it leaves a run that resume finishes)."""
        self.record.write_summary(self.client_manager())
        self.tracker.close()
        self.drop_client_state()
        if not self.cfg["keep-checkpoint"]:
            drop_checkpoint(self.run_dir)

    def drop_client_state(self) -> None:
        """Remove the clients' state mirrors and the cohort nodes' row journals from the run folder
        (``fl_app.node.client_state``): once the run has finished, and before round 1 of a run
        that does not resume (a run started anew in a folder whose earlier run was interrupted:
        its clients would otherwise read that run's files as their own state, a client first
        sampled after round 1 its mirror of the earlier run's round)."""
        for kept in ("client-state", "client-rows"):
            shutil.rmtree(self.run_dir / kept, ignore_errors=True)
