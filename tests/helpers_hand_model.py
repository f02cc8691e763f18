"""What the tests of the methods-v2 methods (FedACG, FedExP, FedDC, FedSpeed) share: the
one-weight-matrix model of their research notes' hand computations, the cohort-against-
per-client check, a client on in-memory data, and a crash-and-resume run in process.

The hand-computation model is ``nn.Linear(1, 2, bias=False)`` in float64 on the one example
x = [1], y = 0: its logits are its two weights w, so the gradient of the cross-entropy is
softmax(w) - e_0 and every number of a round can be written out (/work/notes/v2/<method>.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from runner.results.report import read_metrics
from tasks.catalogue import InputShape
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.functional.update import LocalUpdate
from tasks.models import build_model
from tests.conftest import serve_in_process
from tests.helpers_cohort import assert_cohort_client_equals

X1 = torch.tensor([[1.0]], dtype=torch.float64)
Y1 = torch.tensor([0])


def weight(values) -> dict[str, torch.Tensor]:
    """A tree over the linear model's one entry, ``weight`` (2 x 1), from two numbers."""
    return {"weight": torch.tensor(values, dtype=torch.float64).reshape(2, 1)}


def linear_round(update: LocalUpdate, keys: dict, w_t, *, lr: float = 0.5, epochs: int = 2, state=None,
                 server=None, **options):
    """One round of ``update`` on the hand-computation model from w_t (two numbers): batch 1,
    ``epochs`` steps, SGD without momentum or weight decay unless ``options`` (more ``Hyper``
    fields: ``weight_decay``, ``clip_norm``, ...) say otherwise (``local_round``)."""
    model = nn.Linear(1, 2, bias=False).double()
    hp = Hyper(lr=lr, keys=keys, **options)
    return local_round(Round(update, model, weight(w_t), {}, state or {}, {"buffers": {}, **(server or {})}, hp, X1, Y1,
                       1, epochs, torch.Generator().manual_seed(0)))


def values(tree: dict) -> list[float]:
    """The two numbers of a tree over ``weight``."""
    return tree["weight"].flatten().tolist()


FLAT = InputShape(0, 12, 5)  # 12 features, 5 classes: an mlp cohort runs in about a second


def assert_cohort_matches(update: LocalUpdate, keys: dict, states=None, server=None,
                          sizes=(14, 6, 12), model_name: str = "mlp", clip_norm: float = 0.0) -> None:
    """A cohort of len(sizes) clients of different sizes (one vmap per step) against each
    client's own ``local_round``: within 1e-5 relative (float32), and a cohort of one exactly.
    ``states(names, k)`` / ``server(names)`` build client k's state and the server's message
    from the parameter names and shapes ({name: shape})."""
    gen = torch.Generator().manual_seed(5)
    models = [build_model(model_name, FLAT, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}
    shapes = {n: p.shape[1:] for n, p in params.items()}
    data = [(torch.randn(n, 12, generator=gen), torch.randint(0, FLAT.classes, (n,), generator=gen)) for n in sizes]
    client_states = [states(shapes, k) if states else {} for k in range(len(sizes))]
    sent = {"buffers": {}, **(server(shapes) if server else {})}
    skeleton = build_model(model_name, FLAT).to("meta")
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=keys, clip_norm=clip_norm)
    for members, rel in ((list(range(len(sizes))), 1e-5), ([0], 0)):
        sub = {n: p[members] for n, p in params.items()}
        subb = {n: b[members] for n, b in buffers.items()}
        together = cohort_round(update, skeleton, sub, subb, [client_states[k] for k in members], sent, hp,
                                [data[k] for k in members], 4, 2,
                                [torch.Generator().manual_seed(10 + k) for k in members])
        for j, k in enumerate(members):
            alone = local_round(Round(update, skeleton, unstack_tree(sub, j), unstack_tree(subb, j), client_states[k],
                                sent, hp, *data[k], 4, 2, torch.Generator().manual_seed(10 + k)))
            assert_cohort_client_equals(together, j, alone, rel)
            assert list(together.metrics[j]) == list(alone.metrics)


def crash_and_resume(cfg: dict, tmp_path, rounds: int = 4, crash_after: int = 2) -> tuple[list, list]:
    """The metric rows of an uninterrupted in-process run of ``cfg`` (synthetic data, logreg, 4
    nodes, half sampled per round) and of the same run crashed after round ``crash_after`` and
    resumed by a new server and new nodes (nothing kept in memory), each ``rounds`` rounds."""
    base = {"dataset": "synthetic", "model": "logreg", "num-server-rounds": rounds, "fraction-fit": 0.5,
            "learning-rate": 0.05, "tracking": "none", "results-dir": str(tmp_path), **cfg}
    serve_in_process({**base, "run-name": "full"}, 4)
    with pytest.raises(RuntimeError, match=f"injected crash after round {crash_after}"):
        serve_in_process({**base, "run-name": "cut", "inject-faults": f"crash-after:{crash_after}"}, 4)
    assert len(read_metrics(tmp_path / "cut")) == crash_after
    serve_in_process({**base, "run-name": "cut", "resume": True}, 4)
    return read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")


def assert_same_rounds(full: list[dict], resumed: list[dict], columns: tuple[str, ...], start: int) -> None:
    """Rounds ``start``.. of the two runs agree on the test metrics and on ``columns`` (the
    method's own server metrics)."""
    assert [r["round"] for r in full] == [r["round"] for r in resumed]
    for a, b in zip(full[start:], resumed[start:]):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        for column in columns:
            assert float(a[column]) == pytest.approx(float(b[column]), rel=1e-6), (a["round"], column)


def as_arrays(tree: dict) -> list[np.ndarray]:
    return [t.detach().numpy() for t in tree.values()]
