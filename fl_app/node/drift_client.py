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
  is read from and kept in the client's ``ClientStateStore`` (``fl_app.node.client_state``: by
  default its ``context.state``, which Flower persists per node, in simulation and deployment
  alike), each under its record name; ``personal`` entries replace the received ones before
  training and evaluation and are kept after training; the declared ``sends`` follow the
  weights in the reply.

``fit`` is the method's local training and nothing else. What a node does around it (fault
injection, where the state lives between rounds, start-up warm-up, timing, the
``state_arrays_in`` metric) is the ClientApp's: ``fl_app.node.node_client.NodeClient`` wraps it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Context
from flwr.client import NumPyClient
from torch import nn

from fl_app.node.attacks import attacked_labels
from fl_app.node.client_state import ClientStateStore, ContextStore, Load
from protocol.layout import FLOAT32_MAX, all_finite
from protocol.traffic import append_groups, split_groups
from tasks.augment import Augment
from tasks.datasets import input_shape
from tasks.functional import Hyper, RoundResult, local_round
from tasks.functional.update import Arrays, LocalUpdate, Round
from tasks.local_files import load_local_file
from tasks.models import cached_model, default_device, set_weights
from tasks.partitioning import PartitionSpec, load_client_split, load_partition, partition_on_split, split_tensors
from tasks.train import evaluate


@functools.lru_cache(maxsize=256)
def partition_on_device(
    spec: PartitionSpec, partition_id: int, device: torch.device, test_fraction: float = 0.0
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
    """(train, local test) of partition ``partition_id`` on ``device``, copied there once per
    process; the local test split is None when ``test_fraction`` is 0 (the client trains on
    the whole partition).

    Flower builds a new client object for every message, so without this a GPU actor would
    copy the partition host-to-device again in every round. On CUDA a partition of local
    decoded data is gathered there from the training split, copied to the GPU once per process
    (``tasks.partitioning.partition_on_split``: the same tensors), not from the host. On CPU
    ``.to`` returns the decoded tensors themselves (no copy, no extra memory). Callers must not write into the tensors:
    batches are taken by indexing (a copy), augmentation returns new tensors.
    """
    if test_fraction > 0:
        train, test = load_client_split(spec, partition_id, test_fraction)
        return tuple(t.to(device) for t in train), tuple(t.to(device) for t in test)
    if device.type == "cuda":  # gathered and normalised on the GPU from the split held there
        on_split = partition_on_split(spec, partition_id, device)
        if on_split is not None:
            return on_split, None
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
    return [tensor_to_array(tensors[n]) for n in names]


def tensor_to_array(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a contiguous CPU numpy copy (never aliasing a tensor that trains again)."""
    return tensor.detach().to("cpu", copy=True, memory_format=torch.contiguous_format).numpy()


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


def round_generator(seed: int, partition_id: int, server_round: int) -> torch.Generator:
    """A client's batch-order generator for ``server_round``, seeded from (seed, partition, round)."""
    return torch.Generator().manual_seed(hash((seed, partition_id, server_round)) & 0x7FFFFFFF)


def prepared_round(update: LocalUpdate, model: nn.Module, cfg: dict, device: torch.device, partition_id: int,
                   num_partitions: int | None, server_round: int, params: dict, buffers: dict, state: dict,
                   received: dict, x: torch.Tensor, y: torch.Tensor) -> Round:
    """One client's round, prepared: w_t (``params``, ``buffers``), its kept ``state`` and what
    the server sent besides the weights (``received``), the round's learning rate, the client's
    data (its labels flipped by an injected ``label-flip``, ``fl_app.node.attacks.attacked_labels``),
    batch-order generator and augmentation (``num_partitions`` None for a node with its own
    data), then the update's ``prepare`` step. The one preparation of the per-client path
    (``DriftClient.prepare_round``) and of a cohort node's clients (``fl_app.node.cohort_client``);
    the tensors given are only read (a cohort's clients may share w_t's)."""
    lr = cfg["learning-rate"] * cfg["lr-decay"] ** (server_round - 1)
    y = attacked_labels(cfg, partition_id, server_round, y, input_shape(cfg["dataset"]).classes)  # label-flip
    job = Round(update, model, params, buffers, state, {"buffers": buffers, **received},
                Hyper.from_config(cfg, lr, update.key_names()), x, y, cfg["batch-size"], cfg["local-epochs"],
                round_generator(cfg["seed"], partition_id, server_round),
                Augment.for_round(cfg, device, partition_id, server_round, num_partitions),
                cfg["seed"], partition_id, server_round)
    return update.prepare(job) if update.prepare is not None else job


def finished_round(job: Round, result: RoundResult, cfg: dict,
                   on_host: bool = True) -> tuple[list, dict | None, int, dict]:
    """Everything after one client's loop: the update's ``finish`` step, then (the reply: the
    trained weights, then the declared ``sends``, as numpy copies, or with ``on_host`` False the
    tensors themselves, on their device, for a cohort node that sums them there; the declared
    state and ``personal`` entries to keep, {record: arrays}, or None when the reply or the state
    is not finite; the number of training examples; the fit metrics).

    None: a reply with NaN or Inf is left out by the server (``fl_app.server.recording.check_reply``),
    so the client keeps the state it had: a c_i or h_i moved by an update the server never counted
    would be out of step with the server's c or h from then on (and a non-finite one would poison
    every later round of this client)."""
    update, model = job.update, job.model
    if update.finish is not None:
        result = update.finish(job, result)
    kept = {arrays.record: tensors_to_arrays(result.state[key], list(arrays.names(model, cfg)))
            for key, arrays in update.state.items() if key in result.state}
    trained = {**result.params, **result.buffers}
    if update.personal is not None:
        kept[update.personal.record] = tensors_to_arrays(trained, list(update.personal.names(model, cfg)))
    reply = append_groups([trained[n].detach() for n in model.state_dict()],
                          {key: [result.reply[key][n].detach() for n in arrays.names(model, cfg)]
                           for key, arrays in update.sends.items()}, tuple(update.sends))
    if on_host:
        reply = [tensor_to_array(t) for t in reply]
    finite = (all_finite(reply) if on_host else tensors_finite(reply)) and all(all_finite(a) for a in kept.values())
    return reply, kept if finite else None, len(job.x), dict(result.metrics)


def tensors_squared_norm(tensors: list[torch.Tensor]) -> float:
    """``protocol.layout.squared_norm`` for tensors on any device (each cast to float64 before
    it is squared; one host sync for the list)."""
    norms = [torch.linalg.vector_norm(t, dtype=torch.float64) for t in tensors if t.is_floating_point()]
    return float(torch.stack(norms).square().sum()) if norms else 0.0


def tensors_finite(tensors: list[torch.Tensor]) -> bool:
    """``protocol.layout.all_finite`` for tensors on any device: no NaN or Inf, and a float32
    norm that is finite too."""
    return tensors_squared_norm(tensors) <= FLOAT32_MAX


def kept_state(update: LocalUpdate, model: nn.Module, cfg: dict, load: Load) -> dict:
    """{state key: tree} of the declared state a client kept in earlier rounds, read through
    ``load`` (its ``context.state``, or a cohort node's rows); an entry it never kept is absent
    (``begin`` supplies its initial value)."""
    state = {}
    for key, arrays in update.state.items():
        stored = load(arrays.record)
        if stored is not None:
            state[key] = arrays_to_tree(stored, list(arrays.names(model, cfg)), model, f"stored {arrays.record!r}",
                                        arrays.as_weights)
    return state


def split_received(update: LocalUpdate, model: nn.Module, cfg: dict, parameters: list[np.ndarray],
                   load: Load) -> tuple[list[np.ndarray], dict]:
    """(the model's state arrays, with the client's kept ``personal`` entries (read through
    ``load``) in place of the received ones; {name: tree} of the declared ``receives`` that
    arrived after them: ``received_extras``)."""
    n_state = len(model.state_dict())
    weights, extra = list(parameters[:n_state]), list(parameters[n_state:])
    personal = update.personal
    kept = load(personal.record) if personal is not None else None
    if kept is not None:
        index = {n: i for i, n in enumerate(model.state_dict())}
        for name, arr in zip(personal.names(model, cfg), kept):
            weights[index[name]] = arr
    return weights, received_extras(update, model, cfg, extra)


def received_extras(update: LocalUpdate, model: nn.Module, cfg: dict, extra: list[np.ndarray]) -> dict:
    """The arrays after the weights, split into the declared ``receives`` in order ({} when
    the server sent only the weights); any other count refused in one line."""
    if not extra:
        return {}
    names = {key: list(arrays.names(model, cfg)) for key, arrays in update.receives.items()}
    _, groups = split_groups(extra, 0, {key: len(n) for key, n in names.items()},
                             f"{update.name}: the server's message")
    return {key: arrays_to_tree(groups[key], names[key], model, key) for key in names}


class DriftClient(NumPyClient):
    """Any method's client: ``fit`` trains ``update`` (module docstring).

    ``self.cfg`` is the validated run config (the same for every round and node);
    ``self.fit_config`` is the config the server sent with this round's fit instruction;
    ``self.store`` where the client's kept state is read and kept (its ``context.state`` unless
    a node gives it another store: ``fl_app.node.client_state.choose_store``).
    """

    def __init__(self, update: LocalUpdate, cfg: dict, context: Context, partition_id: int, num_partitions: int,
                 store: ClientStateStore | None = None):
        if not isinstance(update, LocalUpdate):
            raise TypeError(f"a client runs a tasks.functional LocalUpdate, got {update!r} (docs/contributing.md)")
        self.update = update
        self.cfg = cfg
        self.context = context
        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self.store = store if store is not None else ContextStore(context.state)
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
        """Arrays kept under record ``name`` in an earlier round, or None."""
        return self.store.loader(self.partition_id)(name)

    def save_state(self, name: str, arrays: list[np.ndarray]) -> None:
        self.store.keep(self.partition_id, {name: arrays})

    def names(self, arrays: Arrays) -> list[str]:
        """The model entries a declared set of arrays covers, in state_dict order."""
        return list(arrays.names(self.model, self.cfg))

    def kept_state(self) -> dict:
        """The declared state this client kept in earlier rounds (``kept_state``)."""
        return kept_state(self.update, self.model, self.cfg, self.load_state)

    # -------------------------------------------------------------------- the wire
    def split_received(self, parameters: list[np.ndarray]) -> tuple[list[np.ndarray], dict]:
        """``split_received`` of the arrays the server sent, with this client's kept state."""
        return split_received(self.update, self.model, self.cfg, parameters, self.load_state)

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
        """The client's batch-order generator for ``server_round`` (``round_generator``)."""
        return round_generator(self.cfg["seed"], self.partition_id, server_round)

    def prepare_round(self, parameters: list[np.ndarray], config: dict) -> Round:
        """Everything before the training loop: w_t as tensors (``split_received``), then
        ``prepared_round`` on the client's data and its kept state."""
        server_round = int(config.get("server-round", 1))
        self.fit_config = config
        weights, received = self.split_received(parameters)
        params, buffers = weights_to_tensors(self.model, weights)
        x, y = self.data
        return prepared_round(self.update, self.model, self.cfg, self.device, self.partition_id,
                              None if self.data_path else self.num_partitions, server_round, params, buffers,
                              self.kept_state(), received, x, y)

    def finish_round(self, job: Round, result: RoundResult) -> tuple[list[np.ndarray], int, dict]:
        """Everything after the loop (``finished_round``), the kept state put in the client's
        store when it and the reply are finite."""
        reply, kept, num_examples, metrics = finished_round(job, result, self.cfg)
        self.store.keep(self.partition_id, kept or {})
        return reply, num_examples, metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Loss and accuracy of the received model (with the client's ``personal`` entries) on
        this client's local test split (its training data when ``client-test-fraction`` is 0)."""
        weights, _ = self.split_received(parameters)
        set_weights(self.model, weights)
        x, y = self.test_data
        loss, acc = evaluate(self.model, x, y)
        return loss, len(x), {"accuracy": acc}
