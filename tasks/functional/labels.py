"""The client's label distribution, for the methods that correct label skew (FedRS, FedLC): counted
before the round by a ``prepare`` step, read by their ``begin``."""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.functional.update import Round


def count_labels(job: Round) -> Round:
    """The ``prepare`` step of a method that reads the client's label distribution (FedRS,
    FedLC): n_c, the number of the examples the client trains on (``job.y``, its training
    split) of each class c, into ``job.state["label_counts"]`` (an int64 tensor of the model's
    number of classes, ``model.head.out_features``; not kept: the update declares no state, it
    is counted again each round from the same data). A label outside the head's classes is
    refused in one line."""
    classes = job.model.head.out_features
    if len(job.y) and int(job.y.max()) >= classes:
        raise ValueError(f"{job.update.name}: label {int(job.y.max())} on a model with {classes} classes "
                         f"(labels must be 0..{classes - 1})")
    counts = torch.bincount(job.y.long(), minlength=classes)
    return replace(job, state={**job.state, "label_counts": counts})


def counts_of(state: dict, like: torch.Tensor) -> torch.Tensor:
    """``state["label_counts"]`` (``count_labels``) in the dtype and device of ``like``; a
    round prepared without the step is refused in one line."""
    if "label_counts" not in state:
        raise ValueError("state['label_counts'] (the client's label counts, counted by count_labels before the round)"
                         " is missing")
    return state["label_counts"].to(dtype=like.dtype, device=like.device)
