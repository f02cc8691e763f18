"""Driving a method without Flower's transport: a ``ClientProxy`` that hands each fit
instruction to a ``NumPyClient`` in this process.

Used where a run is driven in one process, with no Ray and no SuperLink: the tests of
strategies and of every method's two rounds, and ``scripts/security_table.py`` (whose clients
it registers with ``DriftServer``'s client manager before the server's ``fit``). It
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

