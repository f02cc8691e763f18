"""``DriftClient``: the one ``NumPyClient`` of every method; it runs the method's ``LocalUpdate``
(``tasks.functional.update``) on its partition.

``fit`` is ``prepare_round`` (everything before the loop), ``tasks.functional.local_round``, then
``finish_round`` (everything after it). A cohort node (``fl_app.node.cohort_client``) runs the
same two halves per virtual client around one ``cohort_round`` for all of them, so everything
but the loop is this one code, for every method. What the halves do is read from the update's
declaration, never from a method's name:

- the weights are converted once each way: the received arrays straight into the round's
  parameter and buffer tensors (in the model's memory layout), the trained tensors straight
  into the reply's arrays; the model module is a skeleton for ``torch.func.functional_call``
  (only ``evaluate``, and a ``prepare`` step that needs a module, load weights into it);
- the arrays after the weights are split into the declared ``receives``; the declared ``state``
  is read from and written to ``context.state`` (which Flower persists per node, in simulation
  and deployment alike), each under its record name; ``personal`` entries replace the received
  ones before training and evaluation and are kept after training; the declared ``sends`` follow
  the weights in the reply.

``fit`` is the method's local training and nothing else. What a node does around it (fault
injection, the on-disk state mirror, start-up warm-up, timing, the ``state_arrays_in`` metric)
is the ClientApp's: ``fl_app.node.node_client.NodeClient`` wraps it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.client import NumPyClient
from torch import nn

from protocol.layout import all_finite
from protocol.traffic import append_groups, split_groups
from tasks.augment import Augment
from tasks.datasets import input_shape
from tasks.functional import Hyper, RoundResult, local_round
from tasks.functional.update import Arrays, LocalUpdate, Round
from tasks.local_files import load_local_file
from tasks.models import cached_model, default_device, set_weights
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


# ------------------------------------------------------------------ arrays <-> tensors
def weights_to_tensors(model: nn.Module, arrays: list[np.ndarray]) -> tuple[dict, dict]:
    """(parameters, buffers) from the model's state arrays (state_dict order), each a new
    tensor in the memory layout, dtype and device of the model's own entry (a channels-last
    weight stays channels-last, so the convolutions run the kernels the module would); the
    count and every shape checked first. One copy per array."""
    state = model.state_dict()
    if len(arrays) != len(state):
        raise ValueError(f"got {len(arrays)} arrays for a model with {len(state)} state entries")
    tensors = {}
    for (name, ref), arr in zip(state.items(), arrays):
        if tuple(np.shape(arr)) != tuple(ref.shape):
            raise ValueError(f"array for {name!r} has shape {np.shape(arr)}, expected {tuple(ref.shape)}")
        tensors[name] = torch.empty_like(ref).copy_(torch.as_tensor(np.asarray(arr)))
    params = {n: tensors[n] for n, _ in model.named_parameters()}
    buffers = {n: tensors[n] if n in tensors else b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


def tensors_to_arrays(tensors: Mapping[str, torch.Tensor], names: list[str]) -> list[np.ndarray]:
    """``tensors[name]`` for each of ``names`` as a contiguous CPU numpy copy (never aliasing a
    tensor that trains again in this process)."""
    return [tensors[n].detach().to("cpu", copy=True, memory_format=torch.contiguous_format).numpy() for n in names]


def arrays_to_tree(arrays: list[np.ndarray], names: list[str], model: nn.Module, what: str,
                   as_weights: bool = False) -> dict:
    """{name: tensor} of ``arrays`` over the model entries ``names``, each in its entry's dtype
    and device, contiguous (or in the entry's own memory layout, ``as_weights``); a wrong count
    or shape refused in one line naming ``what``."""
    entries = model.state_dict()
    if len(arrays) != len(names):
        raise ValueError(f"{what}: {len(arrays)} arrays for {len(names)} model entries")
    tree = {}
    for name, arr in zip(names, arrays):
        ref = entries[name]
        if tuple(np.shape(arr)) != tuple(ref.shape):
            raise ValueError(f"{what} for {name!r} has shape {np.shape(arr)}, expected {tuple(ref.shape)}")
        if as_weights:
            tree[name] = torch.empty_like(ref).copy_(torch.as_tensor(np.asarray(arr)))
        else:
            tree[name] = torch.as_tensor(np.asarray(arr), dtype=ref.dtype, device=ref.device).clone()
    return tree


class DriftClient(NumPyClient):
    """Any method's client: ``fit`` trains ``update`` (module docstring).

    ``self.cfg`` is the validated run config (the same for every round and node);
    ``self.fit_config`` is the config the server sent with this round's fit instruction.
    """

    def __init__(self, update: LocalUpdate, cfg: dict, context: Context, partition_id: int, num_partitions: int):
        if not isinstance(update, LocalUpdate):
            raise TypeError(f"a client runs a tasks.functional LocalUpdate, got {update!r} (docs/contributing.md)")
        self.update = update
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

    def use_data(self, train: tuple[torch.Tensor, torch.Tensor],
                 test: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Train on ``train`` (and test on ``test``; else on ``train``) instead of loading the
        partition: data already in memory (a test's, or a caller that loaded it itself)."""
        self._data = tuple(t.to(self.device) for t in train)
        self._test_data = tuple(t.to(self.device) for t in test) if test is not None else None

    def _load(self) -> None:
        fraction = self.cfg["client-test-fraction"]
        if self.data_path:
            x, y = load_local_file(self.data_path, self.cfg["dataset"])
            train, test = split_tensors(x, y, fraction, self.cfg["seed"]) if fraction > 0 else ((x, y), None)
        else:
            spec = PartitionSpec.from_config(self.cfg, self.num_partitions)
            train, test = partition_on_device(spec, self.partition_id, self.device, fraction)
        self.use_data(train, test)

    def load_state(self, name: str) -> list[np.ndarray] | None:
        """Arrays saved under record ``name`` in an earlier round on this node, or None."""
        if name not in self.context.state:
            return None
        return self.context.state[name].to_numpy_ndarrays()

    def save_state(self, name: str, arrays: list[np.ndarray]) -> None:
        self.context.state[name] = ArrayRecord(numpy_ndarrays=[np.asarray(a) for a in arrays])

    def names(self, arrays: Arrays) -> list[str]:
        """The model entries a declared set of arrays covers, in state_dict order."""
        return list(arrays.names(self.model, self.cfg))

    def kept_state(self) -> dict:
        """The declared state this client kept in earlier rounds (an entry it never kept is
        absent: ``begin`` supplies its initial value)."""
        state = {}
        for key, arrays in self.update.state.items():
            stored = self.load_state(arrays.record)
            if stored is not None:
                state[key] = arrays_to_tree(stored, self.names(arrays), self.model, f"stored {arrays.record!r}",
                                            arrays.as_weights)
        return state

    # -------------------------------------------------------------------- the wire
    def split_received(self, parameters: list[np.ndarray]) -> tuple[list[np.ndarray], dict]:
        """(the model's state arrays, with the client's ``personal`` entries in place of the
        received ones; {name: tree} of the declared ``receives`` that arrived after them)."""
        n_state = len(self.model.state_dict())
        weights, extra = list(parameters[:n_state]), list(parameters[n_state:])
        personal = self.update.personal
        kept = self.load_state(personal.record) if personal is not None else None
        if kept is not None:
            index = {n: i for i, n in enumerate(self.model.state_dict())}
            for name, arr in zip(self.names(personal), kept):
                weights[index[name]] = arr
        return weights, self.received_extras(extra)

    def received_extras(self, extra: list[np.ndarray]) -> dict:
        """The arrays after the weights, split into the declared ``receives`` in order ({} when
        the server sent only the weights); any other count refused in one line."""
        if not extra:
            return {}
        names = {key: self.names(arrays) for key, arrays in self.update.receives.items()}
        _, groups = split_groups(extra, 0, {key: len(n) for key, n in names.items()},
                                 f"{self.update.name}: the server's message")
        return {key: arrays_to_tree(groups[key], names[key], self.model, key) for key in names}

    # --------------------------------------------------------------- NumPyClient API
    def get_properties(self, config: dict) -> dict:
        """Lets the server map node ids to partitions, for reproducible client sampling."""
        if self.data_path:
            return {"data-path": self.data_path}
        return {"partition-id": self.partition_id, "num-partitions": self.num_partitions}

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        state = self.model.state_dict()
        return tensors_to_arrays(state, list(state))

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """One round of the method's local training from the received global model w_t:
        ``prepare_round``, ``tasks.functional.local_round``, ``finish_round``."""
        job = self.prepare_round(parameters, config)
        return self.finish_round(job, local_round(job))

    def round_generator(self, server_round: int) -> torch.Generator:
        """The client's batch-order generator for ``server_round``, seeded from (seed, partition, round)."""
        return torch.Generator().manual_seed(hash((self.cfg["seed"], self.partition_id, server_round)) & 0x7FFFFFFF)

    def prepare_round(self, parameters: list[np.ndarray], config: dict) -> Round:
        """Everything before the training loop: w_t as tensors (``split_received``), the round's
        learning rate, the client's data, batch-order generator and augmentation, its kept
        state and what the server sent, then the update's ``prepare`` step."""
        server_round = int(config.get("server-round", 1))
        self.fit_config = config
        lr = self.cfg["learning-rate"] * self.cfg["lr-decay"] ** (server_round - 1)
        weights, received = self.split_received(parameters)
        params, buffers = weights_to_tensors(self.model, weights)
        x, y = self.data
        job = Round(self.update, self.model, params, buffers, self.kept_state(), {"buffers": buffers, **received},
                    Hyper.from_config(self.cfg, lr, self.update.key_names()), x, y, self.cfg["batch-size"],
                    self.cfg["local-epochs"], self.round_generator(server_round),
                    Augment.for_round(self.cfg, self.device, self.partition_id, server_round,
                                      None if self.data_path else self.num_partitions),
                    self.cfg["seed"], self.partition_id, server_round)
        return self.update.prepare(job) if self.update.prepare is not None else job

    def finish_round(self, job: Round, result: RoundResult) -> tuple[list[np.ndarray], int, dict]:
        """Everything after the loop: the update's ``finish`` step, the declared state and
        ``personal`` entries kept in ``context.state``, then the reply (the trained weights, then
        the declared ``sends``), the number of training examples and the fit metrics. The state is
        kept only when the reply and the state are finite: a reply with NaN or Inf is left out by
        the server, and the client's state then stays that of its last counted round."""
        update = self.update
        if update.finish is not None:
            result = update.finish(job, result)
        kept = {arrays.record: tensors_to_arrays(result.state[key], self.names(arrays))
                for key, arrays in update.state.items() if key in result.state}
        trained = {**result.params, **result.buffers}
        if update.personal is not None:
            kept[update.personal.record] = tensors_to_arrays(trained, self.names(update.personal))
        reply = append_groups(tensors_to_arrays(trained, list(self.model.state_dict())),
                              {key: tensors_to_arrays(result.reply[key], self.names(arrays))
                               for key, arrays in update.sends.items()}, tuple(update.sends))
        if all_finite(reply) and all(all_finite(a) for a in kept.values()):
            for name, arrays in kept.items():
                self.save_state(name, arrays)
        # else: the server leaves this reply out (``fl_app.server.recording.check_reply``), so the
        # client keeps the state it had: a c_i or h_i moved by an update the server never counted
        # would be out of step with the server's c or h from then on (and a non-finite one would
        # poison every later round of this client).
        return reply, len(job.x), dict(result.metrics)

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Loss and accuracy of the received model (with the client's ``personal`` entries) on
        this client's local test split (its training data when ``client-test-fraction`` is 0)."""
        weights, _ = self.split_received(parameters)
        set_weights(self.model, weights)
        x, y = self.test_data
        loss, acc = evaluate(self.model, x, y)
        return loss, len(x), {"accuracy": acc}
