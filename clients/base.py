"""``DriftClient``: one client's local training, the method's ``LocalUpdate`` run on its partition.

A method's client names its local update in ``LOCAL_UPDATE`` (a ``tasks.functional``
``LocalUpdate``: ``begin`` / ``direction`` / ``end``, pure functions of tensors); ``fit`` runs the
round through ``tasks.functional.local_round`` and nothing else trains a client. A client that
declares none is refused in one line (``local_update_for``) before it trains. The class adds
only what the functions cannot see: ``receive`` / ``reply`` (extra arrays travelling with the
weights, SCAFFOLD's c and delta c) and ``functional_inputs`` / ``functional_outputs`` (its state
between ``context.state`` and the update). ``fit`` is ``prepare_functional`` (everything before
the loop), ``local_round``, ``finish_functional`` (everything after it): a cohort node runs the
two halves per virtual client around one ``cohort_round`` for all of them, so everything but
the loop is this one code.

Per-client state that must survive rounds lives in ``context.state`` (``load_state`` /
``save_state``), which Flower persists per node in simulation and deployment alike.

``fit`` is the method's local training and nothing else. What a node does around it (fault
injection, the on-disk state mirror, start-up warm-up, timing, the ``state_arrays_in``
metric) is the ClientApp's: ``fl_app.node.node_client.NodeClient`` wraps every method client.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.client import NumPyClient

from tasks.augment import Augment
from tasks.datasets import input_shape
from tasks.functional import Hyper, LocalUpdate, RoundResult, local_round, module_state
from tasks.local_files import load_local_file
from tasks.models import cached_model, default_device, get_weights, set_weights
from tasks.partitioning import PartitionSpec, load_client_split, load_partition, split_tensors
from tasks.train import evaluate


@functools.lru_cache(maxsize=256)
def partition_on_device(
    spec: PartitionSpec, partition_id: int, device: torch.device, test_fraction: float = 0.0
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
    """(train, local test) of partition ``partition_id`` on ``device``, copied there once per
    process; the local test split is None when ``test_fraction`` is 0 (the client trains on
    the whole partition).

    Flower builds a new client object for every message, so without this a GPU actor would
    copy the partition host-to-device again in every round. On CPU ``.to`` returns the decoded
    tensors themselves (no copy, no extra memory). Callers must not write into the tensors:
    batches are taken by indexing (a copy), augmentation returns new tensors.
    """
    if test_fraction > 0:
        train, test = load_client_split(spec, partition_id, test_fraction)
        return tuple(t.to(device) for t in train), tuple(t.to(device) for t in test)
    x, y = load_partition(spec, partition_id)
    return (x.to(device), y.to(device)), None


@dataclass
class FunctionalRound:
    """A ``LOCAL_UPDATE`` round prepared by ``DriftClient.prepare_functional``: what
    ``tasks.functional.local_round`` takes, in its order (``cohort_round`` takes the same per
    client, stacked). ``model`` is the client's model, used as a skeleton only."""

    update: LocalUpdate
    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    state: dict
    server: dict
    hp: Hyper
    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    epochs: int
    generator: torch.Generator
    augment: Augment

    def local_round_args(self) -> tuple:
        """The positional arguments of ``local_round`` for this round."""
        return (self.update, self.model, self.params, self.buffers, self.state, self.server, self.hp,
                self.x, self.y, self.batch_size, self.epochs, self.generator, self.augment)


class DriftClient(NumPyClient):
    """A method's client: ``fit`` trains its ``LOCAL_UPDATE`` (module docstring).

    ``self.cfg`` is the validated run config (the same for every round and node);
    ``self.fit_config`` is the config the server sent with this round's fit instruction
    (``server-round`` and method values such as FedProx's ``proximal_mu``).
    """

    # A local step's cost relative to one SGD step, one forward-backward pass a step, plain SGD; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 1.0
    # The method's local update as functions (module docstring); every method's client names one.
    LOCAL_UPDATE: LocalUpdate | None = None

    @classmethod
    def mods(cls, cfg: dict) -> tuple:
        """The Flower client mods this method's runs of ``cfg`` need around each message (the
        ClientApp applies them, ``fl_app/client_app.py``). Default: none."""
        return ()

    def __init__(self, cfg: dict, context: Context, partition_id: int, num_partitions: int):
        self.cfg = cfg
        self.context = context
        self.partition_id = partition_id
        self.num_partitions = num_partitions
        # A deployed SuperNode may bring its own data instead of a partition (node_config).
        self.data_path = str(context.node_config.get("data-path", "") or "")
        self.device = default_device()
        self.model = cached_model(cfg["model"], input_shape(cfg["dataset"]), self.device)
        self._data: tuple[torch.Tensor, torch.Tensor] | None = None
        self._test_data: tuple[torch.Tensor, torch.Tensor] | None = None

    # ----------------------------------------------------------------- data and state
    @property
    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The data this client trains on, on the device, loaded lazily: its partition (or its
        node's ``data-path``), less its local test split when ``client-test-fraction`` > 0."""
        if self._data is None:
            self._load()
        return self._data

    @property
    def test_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's local test split (``client-test-fraction`` > 0), else its training data."""
        if self._data is None:
            self._load()
        return self._test_data if self._test_data is not None else self._data

    def _load(self) -> None:
        fraction = self.cfg["client-test-fraction"]
        if self.data_path:
            x, y = load_local_file(self.data_path, self.cfg["dataset"])
            train, test = split_tensors(x, y, fraction, self.cfg["seed"]) if fraction > 0 else ((x, y), None)
        else:
            spec = PartitionSpec.from_config(self.cfg, self.num_partitions)
            train, test = partition_on_device(spec, self.partition_id, self.device, fraction)
        self._data = tuple(t.to(self.device) for t in train)
        self._test_data = tuple(t.to(self.device) for t in test) if test is not None else None

    def load_state(self, name: str) -> list[np.ndarray] | None:
        """Arrays saved under ``name`` in an earlier round on this node, or None."""
        if name not in self.context.state:
            return None
        return self.context.state[name].to_numpy_ndarrays()

    def save_state(self, name: str, arrays: list[np.ndarray]) -> None:
        self.context.state[name] = ArrayRecord(numpy_ndarrays=[np.asarray(a) for a in arrays])

    # --------------------------------------------------------------- NumPyClient API
    def get_properties(self, config: dict) -> dict:
        """Lets the server map node ids to partitions, for reproducible client sampling."""
        if self.data_path:
            return {"data-path": self.data_path}
        return {"partition-id": self.partition_id, "num-partitions": self.num_partitions}

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return get_weights(self.model)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """One round of the method's local training from the received global model w_t: the
        round as ``tasks.functional.local_round`` (``prepare_functional``, the loop,
        ``finish_functional``). A cohort node (``fl_app.node.cohort_client``) runs the same two
        halves around one ``cohort_round`` for many clients instead of the loop."""
        job = self.prepare_functional(parameters, config)
        return self.finish_functional(job, local_round(*job.local_round_args()))

    def _begin_fit(self, parameters: list[np.ndarray], config: dict) -> int:
        """Keep the fit config, load w_t (``receive``), note the round's learning rate. Returns
        the server round."""
        server_round = int(config.get("server-round", 1))
        self.fit_config = config
        set_weights(self.model, self.receive(parameters))
        self.lr = self.cfg["learning-rate"] * self.cfg["lr-decay"] ** (server_round - 1)
        return server_round

    def round_generator(self, server_round: int) -> torch.Generator:
        """The client's batch-order generator for ``server_round``, seeded from (seed, partition, round)."""
        return torch.Generator().manual_seed(hash((self.cfg["seed"], self.partition_id, server_round)) & 0x7FFFFFFF)

    @classmethod
    def local_update_for(cls, cfg: dict) -> LocalUpdate:
        """The ``LocalUpdate`` a run of this class with run config ``cfg`` trains through: its
        ``LOCAL_UPDATE`` (a subclass inherits its parent's unless it names its own). A method
        whose update depends on the run config overrides this (FedPGVC). The one answer the
        per-client fit, the cohort node and the server's checks read; a class that names none
        is refused here, in one line, before it trains."""
        update = cls.LOCAL_UPDATE
        if not isinstance(update, LocalUpdate):
            raise TypeError(f"client class {cls.__name__} names no LOCAL_UPDATE (got {update!r}): every method's client"
                            " trains through a tasks.functional LocalUpdate (docs/contributing.md)")
        return update

    def local_update(self) -> LocalUpdate:
        """This client's update (``local_update_for`` its run config)."""
        return self.local_update_for(self.cfg)

    def prepare_functional(self, parameters: list[np.ndarray], config: dict) -> FunctionalRound:
        """Everything before the training loop of a ``LOCAL_UPDATE`` round: w_t loaded (through
        ``receive``), the round's learning rate, the client's data, batch-order generator and
        augmentation, and the method's inputs (``functional_inputs``) as ``local_round`` takes them."""
        update = self.local_update()
        server_round = self._begin_fit(parameters, config)
        x, y = self.data
        generator = self.round_generator(server_round)
        augment = Augment.for_round(self.cfg, self.device, self.partition_id, server_round)
        params, buffers = module_state(self.model)
        state, server = self.functional_inputs()
        return FunctionalRound(update, self.model, params, buffers, state, server,
                               Hyper.from_config(self.cfg, self.lr, update.keys), x, y,
                               self.cfg["batch-size"], self.cfg["local-epochs"], generator, augment)

    def finish_functional(self, job: FunctionalRound, result: RoundResult) -> tuple[list[np.ndarray], int, dict]:
        """Everything after the loop: the result's weights and buffers loaded into ``self.model``,
        the method's state kept and extras noted (``functional_outputs``), then the reply
        (``reply``), the number of training examples and the fit metrics."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(result.params[name])
            for name, b in self.model.named_buffers():
                b.copy_(result.buffers[name])
        metrics = dict(result.metrics)
        metrics.update(self.functional_outputs(result) or {})
        return self.reply(), len(job.x), metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Loss and accuracy of the received model on this client's local test split (its
        training data when ``client-test-fraction`` is 0)."""
        set_weights(self.model, self.receive(parameters))
        x, y = self.test_data
        loss, acc = evaluate(self.model, x, y)
        return loss, len(x), {"accuracy": acc}

    # ------------------------------------------------- what the functions cannot see
    def receive(self, parameters: list[np.ndarray]) -> list[np.ndarray]:
        """Split what the server sent into model weights (returned) and method extras."""
        return parameters

    def reply(self) -> list[np.ndarray]:
        """What goes back to the server: the local weights (plus method extras)."""
        return get_weights(self.model)

    def functional_inputs(self) -> tuple[dict, dict]:
        """(the client's state, what the server sent besides the weights) for ``LOCAL_UPDATE``,
        as ``tasks.functional`` takes them (default: none)."""
        return {}, {}

    def functional_outputs(self, result: RoundResult) -> dict[str, Any] | None:
        """Keep ``result.state`` in ``context.state`` and ``result.reply`` for ``reply``; may
        return extra fit metrics (default: nothing to keep)."""
        return None
