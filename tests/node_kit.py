"""The node side of the cohort wire shared by the node and training tests: ``reply_as_fitres``
(what Flower's NumPyClient wrapper makes of a node's fit return value) and ``cohort_fit`` (a
``CohortClient``'s fit on the bundle the server would send for ``N`` partitions, split back into
one reply per partition).
"""

from __future__ import annotations

import numpy as np
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.node.cohort_client import CohortClient
from protocol.cohort import bundle_instructions, split_replies

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
