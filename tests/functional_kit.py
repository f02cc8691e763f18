"""A cohort of K clients in one ``cohort_round`` against K separate ``local_round`` calls, shared
by tests/training/test_functional.py and tests/data/test_niid_bench.py: ``cohort_inputs`` (K
models' stacked parameters, data and non-zero client and server state) and ``compare_cohort``
(every client of the cohort equals its own round within ``rel``), over the updates ``UPDATES``
of ``NAMES`` with the hyperparameters ``KEYS`` on the small input ``SHAPE``.
"""

from __future__ import annotations

import torch

from fl_app.registry import get_method
from tasks.catalogue import InputShape
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import build_model
from tests.kit import assert_cohort_client_equals

SHAPE = InputShape(1, 8, 10)  # MNIST-like, one channel (a channels-last quirk: keep_layout), small for speed

KEYS = {"proximal-mu": 0.3, "sam-rho": 0.05, "feddyn-alpha": 0.1}

# The updates tests/training/test_functional.py checks (its module loop writes out their corrections), looked up
# through the one registry of methods, each as its client trains it.
NAMES = ("fedavg", "feddyn", "fedprox", "fedsam", "scaffold")

UPDATES = {name: get_method(name).update for name in NAMES}


def cohort_inputs(model_name, sizes, seed=5, shape=SHAPE):
    gen = torch.Generator().manual_seed(seed)
    models = [build_model(model_name, shape, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}  # the layout vmap batches
    data = [(torch.randn(n, shape.channels, shape.size, shape.size, generator=gen),
             torch.randint(0, shape.classes, (n,), generator=gen)) for n in sizes]
    states = []
    for k in range(len(sizes)):  # non-zero client state, different per client
        p_k = unstack_tree(params, k)
        states.append({"ci": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()},
                       "grad": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()}})
    server = {"c": {n: torch.randn(v.shape[1:], generator=gen) * 0.1 for n, v in params.items()}}
    return build_model(model_name, shape).to("meta"), params, buffers, data, states, server


def compare_cohort(name, model_name, sizes, batch_size, rel, shape=SHAPE):
    skeleton, params, buffers, data, states, server = cohort_inputs(model_name, sizes, shape=shape)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    update, k_all = UPDATES[name], len(sizes)
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, batch_size, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(Round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k], server,
                            hp, *data[k], batch_size, 2, torch.Generator().manual_seed(10 + k)))
        assert_cohort_client_equals(together, k, alone, rel)
