"""Which round of each client the method last counted, told to the client with its next
instruction, so that a client whose reply was left out goes back to the state it had before
that round (``fl_app.node.client_state.RevertibleStore``).

Why: a stateful client (SCAFFOLD's c_i, FedDyn's gradient, FedInit's last model, ...) moves its
state when it trains, whatever the server does with its reply. When screening drops the reply
(``reject``, ``krum``, ``multi-krum``, a reply that failed its check), the server's own state
(SCAFFOLD's c = c + (1/N) sum of the counted delta c_i) never takes that move, and the two drift
apart for the rest of the run: c is no longer the mean of the clients' c_i. The client cannot
know; the server tells it, at its next sampling, the last round whose reply was counted, and a
client whose kept state is from a later round restores the copy it kept from before that round.

On only with screening (``state-rollback`` in every fit instruction): the client then keeps a
second copy of its state, which without screening no reply needs. A clipped reply is counted
(the server took part of it, the client its whole move: not undone). A client's name is stable
across a resume: its partition (``partition-<p>``), its data path's digest, else its node id.
The map is part of the checkpoint; a checkpoint written without it (an older run) resumes with
rollback off, since every client's last counted round is then unknown.
"""

from __future__ import annotations

import hashlib
import logging

from flwr.server.client_proxy import ClientProxy

from protocol.counted import COUNTED, ROLLBACK

log = logging.getLogger("flwr.fl_drift")


def client_name(manager, client: ClientProxy) -> str:
    """The stable name of ``client``: the one its state mirror has (``partition-<p>``, or
    ``data-<digest>`` for a node with its own data), else its node id (a cohort's virtual client's
    id is already ``partition-<p>``)."""
    partition = getattr(manager, "partition_of", {}).get(client.cid)
    if partition is not None:
        return f"partition-{partition}"
    data_path = getattr(manager, "data_path_of", {}).get(client.cid)
    if data_path:
        return "data-" + hashlib.sha1(data_path.encode()).hexdigest()[:12]
    return client.cid


class CountedRounds:
    """Per client, the last round whose reply the method aggregated (module docstring).
    ``rounds`` is a resumed run's map from its checkpoint (None: unknown, rollback off)."""

    def __init__(self, cfg: dict, resumed: bool = False, rounds: dict[str, int] | None = None):
        self.active = cfg["screening"] != "none" and (not resumed or rounds is not None)
        self.rounds: dict[str, int] = dict(rounds or {})
        if cfg["screening"] != "none" and resumed and rounds is None:
            log.warning("fl-drift: the checkpoint does not say which round of each client was last counted"
                        " (written by an older fl-drift): a client whose reply screening drops keeps its moved"
                        " state in this resumed run")

    def instruction(self, manager, client: ClientProxy) -> dict:
        """What a client's fit instruction carries: ``state-rollback`` and its last counted
        round (0: none yet); nothing when off."""
        if not self.active:
            return {}
        return {ROLLBACK: True, COUNTED: self.rounds.get(client_name(manager, client), 0)}

    def count(self, server_round: int, manager, accepted: list) -> None:
        """The replies the method aggregates this round (after checks and screening) are counted."""
        if self.active:
            for client, _ in accepted:
                self.rounds[client_name(manager, client)] = server_round

    def state(self) -> dict[str, int] | None:
        """For the checkpoint (None when off without a known map)."""
        return dict(self.rounds) if self.active else None
