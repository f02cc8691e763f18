"""``ServerSide``: a method's server side as one declaration, beside its client's ``LocalUpdate``
(``tasks.functional.update``); one Flower Strategy, ``DeclaredStrategy``, runs any of them.

The declaration says what the rest of the app reads of a server (its run-config ``keys``, its
``screening`` decision and why, its ``reply_sums``, the ``traffic`` family of
``protocol.traffic`` it speaks) and which parts it keeps beside the model (``parts``: the
declarations of ``strategies.parts`` or a method's own, each with what it sends and reads by
its traffic names). It is checked when it is made: every name a part sends or reads is the
family's, in the family's order, every summed group is one the clients send, a plain mean
over clients sums nothing, at most one part forms the model, and every key a part reads is one
of the declaration's; anything else raises at import, naming the method.

A round of ``DeclaredStrategy``, whatever the method:

1. ``configure_fit``: Flower's FedAvg samples the clients; N is read (``total_clients``), and
   the parts' ``down`` groups follow the weights in the family's order;
2. ``aggregate_fit``: each reply split into its weights and its ``up`` groups by name; the new
   model is Flower's FedAvg (the n_k-weighted mean) unless a part forms it (``AGGREGATES``:
   FedDyn's H, the plain mean plus H); then each part whose declaration says ``REVISES`` revises
   that model from the round's replies (``Part.revise``: CCVR retrains the head on the class
   statistics its clients sent, a step after the aggregation that neither the mean nor a part
   forming the model expresses); then every part's ``update`` and its metrics, in the declared
   order;
3. ``get_state`` / ``set_state``: the parts' checkpoint records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import Key
from protocol.traffic import FAMILIES, WEIGHTS_ONLY, Traffic, clients_in, split_groups
from strategies.arrays import send_with_extras, total_clients
from strategies.base import DriftFedAvg, configured_model
from strategies.parts import Part, Replies

NOT_A_MEAN = "its aggregation is not a mean of the client weights"


@dataclass(frozen=True)
class ServerSide:
    """One method's server side (module docstring). ``screening`` and ``reply_sums`` have no
    default: each is the method's decision (``strategies.base.FromConfig``)."""

    name: str
    screening: tuple[str, ...]
    reply_sums: tuple[str, ...] | None
    keys: Mapping[str, Key] = field(default_factory=dict)
    parts: Mapping[str, Any] = field(default_factory=dict)
    traffic: Traffic = WEIGHTS_ONLY
    screening_why: str = NOT_A_MEAN

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(f"the server declaration of {self.name}: {problem}")

    def problem(self) -> str:
        """Why the declaration is inconsistent ('' when it is not)."""
        if self.traffic not in FAMILIES:
            return f"traffic {self.traffic} is not one of protocol.traffic's families"
        down = tuple(n for spec in self.parts.values() for n in spec.SENDS)
        up = tuple(n for spec in self.parts.values() for n in spec.READS)
        if (down, up) != (self.traffic.down, self.traffic.up):
            return f"its parts send {list(down)} and read {list(up)}, its traffic is {self.traffic}"
        if self.reply_sums is not None and not set(self.reply_sums) <= set(up):
            return f"it sums {list(self.reply_sums)}, not groups its clients send ({list(up)})"
        if self.uniform_mean and self.reply_sums is not None:
            return "a plain mean over clients cannot read summed replies (reply_sums must be None)"
        if sum(spec.AGGREGATES for spec in self.parts.values()) > 1:
            return "more than one part forms the model"
        unknown = [k for spec in self.parts.values() for k in spec.keys_read() if k not in self.keys]
        return f"its parts read keys it does not declare: {unknown}" if unknown else ""

    @property
    def model_part(self) -> str:
        """The part that forms the new model ('' for Flower's FedAvg, the n_k-weighted mean)."""
        return next((name for name, spec in self.parts.items() if spec.AGGREGATES), "")

    @property
    def uniform_mean(self) -> bool:
        """The model is the plain mean over clients (a part that forms it: FedDyn's Algorithm 1)."""
        return bool(self.model_part)

    def build(self, cfg: dict) -> dict[str, Part]:
        """The live parts for the run config ``cfg``, from one model of its shapes."""
        model = configured_model(cfg)
        return {name: spec.build(cfg, model) for name, spec in self.parts.items()}


class DeclaredStrategy(DriftFedAvg):
    """The one Strategy that runs a ``ServerSide`` (module docstring). A method's class sets
    ``SERVER``; the facts the app reads of a strategy class (``CONFIG_KEYS``, ``SCREENING``,
    ``SCREENING_WHY``, ``REPLY_SUMS``, ``UNIFORM_MEAN``, ``TRAFFIC``) are the declaration's,
    set on that class itself. Each live part is an attribute by its declared name."""

    SERVER: ClassVar[ServerSide]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        server = vars(cls).get("SERVER")
        if not isinstance(server, ServerSide):
            raise TypeError(f"{cls.__name__} declares no SERVER = ServerSide(...)")
        cls.CONFIG_KEYS = dict(server.keys)
        cls.SCREENING, cls.SCREENING_WHY = server.screening, server.screening_why
        cls.REPLY_SUMS, cls.UNIFORM_MEAN, cls.TRAFFIC = server.reply_sums, server.uniform_mean, server.traffic

    def __init__(self, *, parts: Mapping[str, Part], num_state: int, **kwargs):
        """``parts``: the live parts by their declared names; ``num_state``: the model's state
        arrays (what precedes the groups in every message); ``kwargs``: Flower's FedAvg's."""
        super().__init__(**kwargs)
        if set(parts) != set(self.SERVER.parts):
            raise ValueError(f"{type(self).__name__} has parts {sorted(self.SERVER.parts)}, got {sorted(parts)}")
        self.parts = {name: parts[name] for name in self.SERVER.parts}
        for name, part in self.parts.items():
            setattr(self, name, part)
        self.num_state = num_state
        self.num_clients: int | None = None
        """N, read when the round's clients are sampled (``total_clients``)."""

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        """Each part's refusals of the config (an optimiser control variates cannot use, say)."""
        for spec in cls.SERVER.parts.values():
            spec.check(cfg)
        return super().resolve_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(parts=cls.SERVER.build(cfg), num_state=len(configured_model(cfg).state_dict()), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.parts.values()))})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints (``fl_app/server/checkpoint.py``): the parts' records."""
        return {key: arrays for part in self.parts.values() for key, arrays in part.records().items()}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        for part in self.parts.values():
            part.restore(state)

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.num_clients = total_clients(client_manager)  # after sampling: the partitions are learnt
        if not self.TRAFFIC.down:
            return instructions
        groups = {name: arrays for part in self.parts.values() for name, arrays in part.down().items()}
        return send_with_extras(instructions, parameters, groups, self.TRAFFIC.down, self.num_state)

    def aggregate_fit(self, server_round, results, failures):
        weight_results, replies = self.split(results, server_round)
        if not results or (failures and not self.accept_failures):
            return None, {}
        model = self.SERVER.model_part
        if model:
            parameters, metrics = ndarrays_to_parameters(self.parts[model].aggregate(replies)), {}
        else:
            parameters, metrics = super().aggregate_fit(server_round, weight_results, failures)
        revising = [self.parts[name] for name, spec in self.SERVER.parts.items() if getattr(spec, "REVISES", False)]
        if revising and parameters is not None:
            weights = parameters_to_ndarrays(parameters)
            for part in revising:
                weights = part.revise(weights, replies)
            parameters = ndarrays_to_parameters(weights)
        for part in self.parts.values():
            part.update(replies)
            metrics = {**(metrics or {}), **part.metrics()}
        return parameters, metrics

    def split(self, results, server_round: int = 0) -> tuple[list, Replies]:
        """(each result as a FitRes of its weights alone, the round's ``Replies``)."""
        sizes = {name: n for part in self.parts.values() for name, n in part.up_sizes().items()}
        sizes = {name: sizes[name] for name in self.TRAFFIC.up}
        weight_results, weights, up = [], [], []
        for client, res in results:
            arrays = parameters_to_ndarrays(res.parameters)
            if not sizes:  # the weights alone: the reply as it came
                weight_results.append((client, res))
                weights.append(arrays)
                up.append({})
                continue
            own, groups = split_groups(arrays, self.num_state, sizes, f"a {type(self).__name__} reply")
            weight_results.append((client, FitRes(res.status, ndarrays_to_parameters(own), res.num_examples,
                                                   res.metrics)))
            weights.append(own)
            up.append(groups)
        clients = sum(clients_in(res.metrics) for _, res in results)
        examples = [res.num_examples for _, res in results]
        return weight_results, Replies(weights, up, clients, self.num_clients, self.global_weights, examples,
                                       server_round)
