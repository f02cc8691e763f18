"""The one-weight-matrix model of the research notes' hand computations (the tests of FedACG,
FedDC, FedSpeed, SCAFFOLD's two readings and the local clip), on which a test checks a round's
numbers against the ones written out by hand.

The model is ``nn.Linear(1, 2, bias=False)`` in float64 on the one example x = [1], y = 0: its
logits are its two weights w, so the gradient of the cross-entropy is softmax(w) - e_0 and every
number of a round can be written out (/work/notes/v2/<method>.md).
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.functional import Hyper, Round, local_round
from tasks.functional.update import LocalUpdate

X1 = torch.tensor([[1.0]], dtype=torch.float64)
Y1 = torch.tensor([0])


def weight(values) -> dict[str, torch.Tensor]:
    """A tree over the linear model's one entry, ``weight`` (2 x 1, float64), from two numbers."""
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
