"""``run_simulation.py --list``: methods (one line each), models, datasets and every run-config
key with its default and what is allowed, read from the registry and the schema (so a new
method, model or key shows up without editing this file)."""

from __future__ import annotations

import re

WHAT = ("methods", "models", "datasets", "keys")

# One line per method; a method missing here shows the first line of its strategy docstring.
METHOD_LINES = {
    "fedavg": "FedAvg (McMahan et al., AISTATS 2017): local SGD, n_k-weighted mean of the weights",
    "fedprox": "FedProx (Li et al., MLSys 2020): local loss + mu/2 ||w - w_t||^2",
    "ri-fedavg": "RI-FedAvg: proximal pull scaled by each client's loss-surface roughness index",
    "fedpgvc": "FedPGVC: gradient variance correction on the last Linear layers, server step eta_g",
    "feddyn": "FedDyn (Acar et al., ICLR 2021): dynamic regulariser with server state h",
    "fednova": "FedNova (Wang et al., NeurIPS 2020): averaging normalised by local step counts",
    "fedbn": "FedBN (Li et al., ICLR 2021): batch-norm layers stay local (needs a *-bn model)",
    "fedntd": "FedNTD (Lee et al., NeurIPS 2022): not-true-class distillation from the global model",
    "moon": "MOON (Li et al., CVPR 2021): model-contrastive loss on the representation",
    "dp-fedavg": "DP-FedAvg: clipped, noised updates (Flower's DP wrappers)",
    "fedsol": "FedSOL (Lee et al., CVPR 2024): proximal perturbation + orthogonal local learning",
    "fedgam": "FedGAM: gradient-norm-aware (GAM) local minimiser",
    "fedgam-cv": "FedGAM-CV: FedGAM with SCAFFOLD control variates",
    "scaffold": "SCAFFOLD (Karimireddy et al., ICML 2020): control variates, option II",
    "fedpvr": "FedPVR (Li et al., TMLR 2023): control variates on the last layers only",
    "fedsam": "FedSAM (Qu et al., ICML 2022): SAM as the local optimiser",
    "fedasam": "FedASAM (Caldarola et al., ECCV 2022): adaptive SAM as the local optimiser",
}


def _first_line(obj) -> str:
    doc = (obj.__doc__ or "").strip().splitlines()
    return re.sub(r"\s*\(paper [^)]*\)", "", doc[0]) if doc else ""


def methods() -> list[str]:
    from fl_app.registry import METHODS, config_keys

    width = max(map(len, METHODS))
    lines = []
    for name, method in METHODS.items():
        text = METHOD_LINES.get(name) or _first_line(__import__(method.strategy.__module__, fromlist=["_"]))
        keys = ", ".join(config_keys(method))
        lines.append(f"  {name:<{width}}  {text}" + (f"  [keys: {keys}]" if keys else ""))
    return lines


def models() -> list[str]:
    from tasks.models import BUILDERS, FLAT_MODELS, MODELS

    width = max(map(len, MODELS))
    lines = []
    for name in MODELS:
        builder = BUILDERS.get(name)
        text = _first_line(builder) if builder is not None else ""
        if name == "cnn-bn":
            text = "the cnn with BatchNorm after each conv (for FedBN)"
        elif name == "lenet-bn":
            text = "the lenet with BatchNorm after each conv and hidden FC layer (for FedBN)"
        elif name == "mlp" and not text:
            text = "one hidden layer of 64 (flat features)"
        kind = "synthetic data" if name in FLAT_MODELS else "image datasets"
        lines.append(f"  {name:<{width}}  {text} [{kind}]")
    return lines


def datasets() -> list[str]:
    from fl_app.config import DATASETS as NAMES
    from tasks.catalogue import DATASETS

    width = max(map(len, NAMES))
    lines = []
    for name in NAMES:
        info = DATASETS.get(name)
        if info is None:
            text = "Synthetic(alpha, beta) of the FedProx paper, generated (no download); models mlp, logreg"
        else:
            s = info.shape
            text = (f"{s.channels}x{s.size}x{s.size} images, {s.classes} classes; local parquet"
                    f" <data-dir>/{name}/{{train,test}}.parquet, else hub {info.hub_id}")
        lines.append(f"  {name:<{width}}  {text}")
    return lines


def keys() -> list[str]:
    from fl_app.config import spec
    from fl_app.registry import method_names

    table = spec()
    width = max(map(len, table))
    lines = []
    for name, key in table.items():
        if name == "strategy":
            allowed = "one of " + ", ".join(method_names())
        elif key.choices:
            allowed = "one of " + ", ".join(key.choices)
        else:
            allowed = key.allowed or f"any {key.type.__name__}"
        lines.append(f"  {name:<{width}}  default {key.default!r:<12} {allowed}")
    return lines


def listing(what: str = "all") -> str:
    parts = WHAT if what == "all" else (what,)
    out = []
    for part in parts:
        out.append(f"{part}:")
        out.extend(globals()[part]())
    return "\n".join(out)
