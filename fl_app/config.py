"""Run-config schema: every general key's default, type and allowed range, and the checks,
written once for any table of keys.

The whole schema is these general keys, the ``strategy`` key and every registered method's own
keys; the registry (``fl_app.registry.spec``) puts them together, since only it knows the
methods, and this module knows none. Flower requires the defaults to sit in ``pyproject.toml``
under ``[tool.flwr.app.config]``; ``tests/project/test_config.py`` checks that table against
``spec()`` so the two cannot drift apart. Validation (``fl_app.registry.validate_config``) runs
when the ServerApp starts (and in ``run_simulation.py`` before anything is launched), so a bad
value fails before any training with a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from fl_app.common.faults import FAULT_FORMS, parse_faults
from fl_app.common.screening_modes import PRE_FORMS, parse_pre
from fl_app.common.trackers import parse_tracking
from protocol.keys import ConfigError, Key, at_least, between, non_negative, positive, unit_interval
from tasks.catalogue import DATASET_NAMES as DATASETS
from tasks.catalogue import DATASETS as IMAGE_DATASETS
from tasks.catalogue import PARTITIONERS as PARTITIONER_SETTINGS
from tasks.models import FLAT_MODELS, IMAGE_MODELS, MODELS
from tasks.optim import OPTIMIZERS, optimizer_problem


def did_you_mean(value: object, choices) -> str:
    """' (did you mean 'x'?)' for the closest of ``choices`` (difflib), else ''."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# Where a refused key's reader finds every valid one: the list itself (about 140 keys with the
# methods' own) is not printed in the error, only the closest key to each unknown one.
KEYS_LISTED = "every key: python run_simulation.py --list keys (docs/configuration.md)"


def unknown_keys(unknown, keys) -> str:
    """``unknown run-config key 'learnig-rate' (did you mean 'learning-rate'?); every key: ...``:
    each of ``unknown`` with its closest of ``keys`` (``did_you_mean``), and where to find them
    all instead of the whole list."""
    unknown = sorted(unknown)
    named = ", ".join(f"{k!r}{did_you_mean(k, keys)}" for k in unknown)
    return f"unknown run-config key{'s' if len(unknown) > 1 else ''} {named}; {KEYS_LISTED}"


PARTITIONERS = tuple(PARTITIONER_SETTINGS)
SCREENING_MODES = ("none", "clip", "reject", "median", "trimmed-mean", "krum", "multi-krum", "bulyan",
                   "geometric-median", "centered-clip")
EXECUTIONS = ("auto", "per-client", "cohort")
COHORT_REPLIES = ("auto", "full", "sum")
# noise-sigma's two readings (tasks/feature_noise.py): the NIID-Bench paper's words (variance
# sigma * i / N, drawn once per client) or its code (std sigma * p / (N - 1) for partition p,
# drawn anew for every batch)
NOISE_READINGS = ("paper", "code")
# inner-dirichlet's lognormal size spread: at sigma 5 two clients' sizes already differ by e^10 at
# +-1 standard deviation; above it a draw overflows or gives all but one client nothing
MAX_SIZE_SIGMA = 5.0

# General keys. ``strategy`` (its choices are the registered methods) and the method-specific
# keys (prefixed by the method, e.g. ``ri-lambda``, declared as ``CONFIG_KEYS`` of the method's
# client or strategy class) are added by ``fl_app.registry.spec()``.
GENERAL_KEYS: dict[str, Key] = {
    "num-server-rounds": Key(3, at_least(1), ">= 1"),
    "fraction-fit": Key(0.5, unit_interval, "in (0, 1]"),
    "min-fit-clients": Key(1, at_least(1), ">= 1"),
    "min-available-clients": Key(2, at_least(1), ">= 1"),
    "local-epochs": Key(1, at_least(1), ">= 1"),
    "batch-size": Key(32, at_least(1), ">= 1"),
    "learning-rate": Key(0.01, positive, "> 0"),
    "optimizer": Key("sgd", choices=OPTIMIZERS),
    "momentum": Key(0.0, lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight-decay": Key(0.0, non_negative, ">= 0"),
    "lr-decay": Key(1.0, unit_interval, "in (0, 1] (factor applied to the lr each round)"),
    "local-clip-norm": Key(0.0, non_negative, ">= 0 (every local step's direction, the method's whole gradient, scaled"
                                              " to at most this norm over the trained weights before the optimiser"
                                              " step, as clip_grad_norm_ in the FedDyn, FedDC, FedSMOO and FedACG"
                                              " authors' codes, which clip every method at 10; 0 = off)"),
    "model": Key("cnn", choices=MODELS),
    "dataset": Key("mnist", choices=DATASETS),
    "data-dir": Key(""),
    "partitioner": Key("dirichlet", choices=PARTITIONERS),
    "alpha": Key(0.3, positive, "> 0 (Dirichlet concentration: of the label mix for dirichlet and inner-dirichlet,"
                                " of the client sizes for quantity; NIID-Bench's beta)"),
    "dirichlet-balance": Key(False, None, "true or false (dirichlet: NIID-Bench's and Flower's niid_bench rule,"
                                          " a client holding N/n or more examples gets no more of the later labels;"
                                          " false = flwr-datasets' unbalanced split)"),
    "shards-per-client": Key(2, at_least(1), ">= 1"),
    "min-partition-size": Key(10, non_negative, ">= 0 (dirichlet and quantity redraw until every client has"
                                                " this many)"),
    "classes-per-client": Key(2, at_least(1), ">= 1 (pathological: distinct labels per client, NIID-Bench's #C = k)"),
    "size-sigma": Key(0.0, between(0, MAX_SIZE_SIGMA), f"0 to {MAX_SIZE_SIGMA:g} (inner-dirichlet: client sizes"
                      " lognormal with this sigma, FedDyn's unbalanced_sgm 0.3; 0 = equal sizes; a draw that leaves a"
                      " client no example is refused)"),
    "noise-sigma": Key(0.0, non_negative, ">= 0 (feature noise: client i of N gets Gaussian noise of variance"
                                          " noise-sigma * i / N on its inputs, NIID-Bench's noise-based feature"
                                          " imbalance; with noise-reading 'code' std noise-sigma * (i - 1) / (N - 1),"
                                          " drawn per batch; 0 = off)"),
    "noise-reading": Key("paper", choices=NOISE_READINGS),
    "seed": Key(0, non_negative, ">= 0"),
    "results-dir": Key("results"),
    "run-name": Key(""),
    # The split's picture (tasks/partition_figure.py), drawn once per run; the test suite turns it
    # off where it does not look at it (drawing it is a matplotlib import and ~0.5 s per run)
    "split-picture": Key(True, None, "true or false (false: the run writes client_label_counts.csv but not"
                                     " partitions.png)"),
    "synthetic-alpha": Key(1.0, non_negative, ">= 0"),
    "synthetic-beta": Key(1.0, non_negative, ">= 0"),
    # Training-time augmentation (tasks/augment.py): "none" or a comma list of crop, flip, cutout
    "augment": Key("none", lambda v: _valid_augment(v), "'none' or a comma list of crop, flip, cutout"),
    # Reliability
    "min-fit-fraction": Key(0.5, lambda v: 0 <= v <= 1, "in [0, 1] (share of sampled clients that must succeed)"),
    "drop-rate": Key(0.0, lambda v: 0 <= v < 1, "in [0, 1) (probability a sampled client drops)"),
    "round-timeout": Key(0.0, non_negative, ">= 0 (seconds; 0 = no timeout)"),
    "checkpoint-every": Key(1, non_negative, ">= 0 (rounds; 0 = no checkpoints)"),
    "keep-checkpoint": Key(True, None, "true or false (false: the checkpoint is removed when the run finishes;"
                                       " it can then not be extended by resume)"),
    "wait-for-nodes": Key(60.0, positive, "> 0 (seconds the server waits for min-available-clients nodes)"),
    "resume": Key(False),
    # Fault injection for studying (and testing) failures: "raise:0,nan:3" makes the client of
    # partition 0 raise and the one of partition 3 return NaN weights, every round;
    # "crash-after:3" makes the server die right after round 3 (its checkpoint written).
    # Poisoning attacks for testing defences (fl_app/node/attacks.py): "scale:3:100" multiplies the
    # weight update of partition 3 by 100, "flip:3" sends its negation, "noise:3:50" replaces it
    # by Gaussian noise of norm 50, "adaptive:3" sends a sign flip scaled to 0.9 x the screening
    # bound; "@R" starts one at round R ("scale:3:100@5").
    "inject-faults": Key("", lambda v: _valid_faults(v), f"a comma list of {FAULT_FORMS}"),
    # Update screening before aggregation (fl_app/server/screening.py).
    "screening": Key("none", choices=SCREENING_MODES),
    "screen-clip-norm": Key(0.0, non_negative, ">= 0 (clip bound; 0 = screen-clip-multiple x the round's median norm)"),
    "screen-clip-multiple": Key(1.0, positive, "> 0 (clip bound = this x the round's median update norm)"),
    "screen-reject-multiple": Key(3.0, at_least(1),
                                  ">= 1 (reject an update whose norm exceeds this x the round's median)"),
    "screen-trim": Key(0.2, lambda v: 0 <= v < 0.5, "in [0, 0.5) (share cut at each end by trimmed-mean)"),
    "screen-attackers": Key(0, non_negative, ">= 0 (attackers f to resist: krum, multi-krum, bulyan, screen-pre"
                                             " arc and nnm; trimmed-mean then cuts f at each end; 0 = undeclared)"),
    # Pre-aggregation before the rule (docs/screening.md): "arc+nnm" clips then mixes the updates
    "screen-pre": Key("none", lambda v: bool(parse_pre(v)) or True,
                      f"{PRE_FORMS} (before the screening rule; arc, nnm: f = screen-attackers)"),
    "screen-bucket-size": Key(2, at_least(1), ">= 1 (s: updates averaged per bucket by screen-pre bucketing)"),
    "screen-cc-tau": Key(0.0, non_negative, ">= 0 (centered-clip radius tau; 0 = the round's median update norm)"),
    "screen-cc-iters": Key(3, at_least(1), ">= 1 (centered-clip iterations L)"),
    # Experiment trackers (fl_app/server/tracking.py): "none" or a comma list of tensorboard, mlflow, wandb
    "tracking": Key("tensorboard", lambda v: _valid_tracking(v),
                    "'none' or a comma list of tensorboard, mlflow, wandb"),
    "tensorboard": Key(True, None, "true or false (the older switch: false removes tensorboard from tracking)"),
    # Scale
    "evaluate-every": Key(1, at_least(1), ">= 1 (rounds between server evaluations; the last round always)"),
    "client-test-fraction": Key(0.0, lambda v: 0 <= v < 1,
                                "in [0, 1) (share of each client's partition held out as its local test split,"
                                " scored with the global model; 0 = off)"),
    "client-state": Key("memory", choices=("memory", "disk")),
    # Execution (fl_app/common/execution_path.py): one node per client, or cohort nodes that each train
    # the round's clients they host in one torch.func.vmap; auto = cohort where it can run (a
    # simulation launched by run_simulation.py, CUDA, a method with its own functional local update).
    "execution": Key("auto", choices=EXECUTIONS),
    "num-virtual-clients": Key(0, non_negative, ">= 0 (clients N the cohort nodes host, set by run_simulation.py"
                                                " for the cohort path; 0 = each node is one client)"),
    # The torch threads a cohort node trains an ``unbatched`` update's client at (FedDecorr's, alone
    # through local_round): the per-client path's, whose Ray actor runs at its CPU share
    # (fl_app/node/node_client.py), so that such a client's round is its per-client round bit for bit.
    "client-threads": Key(0, non_negative, ">= 0 (torch threads of a client a cohort node trains alone: the"
                                           " per-client path's CPU share, set by run_simulation.py; 0 = the node's)"),
    # What a cohort node replies (fl_app/common/execution_checks.py, summed_replies): every client's
    # arrays (full), or one n_k-weighted mean and sums for its clients (sum: a server that declares
    # REPLY_SUMS, screening none); auto = sum where it can (and the update is not unbatched), else full.
    "cohort-replies": Key("auto", choices=COHORT_REPLIES),
    # Precision on CUDA (tasks.models.set_cuda_precision), set by both apps before any model is
    # built; decided here, not inherited from PyTorch (TF32 on for cuDNN convolutions by default).
    "cuda-tf32": Key(False, None, "true or false (TF32 for CUDA matmuls and convolutions; false = full fp32;"
                                  " no effect on CPU)"),
    # Tuning (runner/tuning.py): a share of the training split held out before it is
    # partitioned (no client trains on it); the server then scores it instead of the test split.
    "validation-fraction": Key(0.0, lambda v: 0 <= v <= 0.5,
                               "in [0, 0.5] (share of the training split held out as the validation split"
                               " the server scores instead of the test split; 0 = off, the test split)"),
    # Which tuning protocol chose this run's settings (written by the runner's [tune]; training
    # never reads it; '' = none recorded).
    "tuning-protocol": Key("", None, "text: the protocol that chose this run's settings (set by the runner's"
                                     " [tune]; '' = none recorded)"),
    # Reporting (runner/results/report.py): comparison.md's rounds to target is the first round
    # whose test accuracy is >= this; training never reads it. 0 = no target: what is worth
    # reaching depends on dataset, model and budget (0.3 on CIFAR-10 to 0.99 on MNIST in experiments/).
    "target-accuracy": Key(0.0, lambda v: 0 <= v < 1,
                           "in [0, 1) (test accuracy the comparison counts the rounds to; 0 = none)"),
}


def _valid_faults(text: str) -> bool:
    try:
        parse_faults(text)
        return True
    except ValueError as e:
        raise ConfigError(
            f"run-config key 'inject-faults' = {text!r} is invalid: item {e}; valid forms: {FAULT_FORMS}"
        ) from None


def _valid_tracking(text: str) -> bool:
    try:
        parse_tracking(text)
        return True
    except ValueError as e:
        raise ConfigError(f"run-config key 'tracking' = {text!r} is invalid: {e}") from None


def _valid_augment(text: str) -> bool:
    from tasks.augment import parse_augment

    try:
        parse_augment(text)
        return True
    except ValueError:
        return False


def _coerce(name: str, key: Key, value: Any) -> Any:
    """Convert TOML-typed values to the key's type, refusing lossy or surprising casts."""
    want = key.type
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif want is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if math.isfinite(number):
                return number
            raise ConfigError(f"run-config key '{name}' = {value!r} is invalid: must be a finite number"
                              + (f" {key.allowed}" if key.allowed else "") + " (not NaN or an infinity)")
    elif want is str:
        if isinstance(value, str):
            return value
    raise ConfigError(
        f"run-config key '{name}' = {value!r} is invalid: expected a {want.__name__}"
        f" (default {key.default!r})"
    )


def validate_keys(raw: Mapping[str, Any], keys: Mapping[str, Key]) -> dict:
    """Return a complete, typed config of ``keys`` (defaults filled in) or raise ConfigError
    naming the key, the value and what is allowed. ``keys`` is the whole schema
    (``fl_app.registry.spec``); the checks of one method need the method
    (``fl_app.registry.method_config``)."""
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(unknown_keys(unknown, keys))
    cfg: dict[str, Any] = {}
    for name, key in keys.items():
        value = _coerce(name, key, raw.get(name, key.default))
        if key.choices is not None and value not in key.choices:
            raise ConfigError(
                f"run-config key '{name}' = {value!r} is invalid{did_you_mean(value, key.choices)};"
                f" valid choices: {', '.join(key.choices)}"
            )
        if key.check is not None and not key.check(value):
            raise ConfigError(
                f"run-config key '{name}' = {value!r} is invalid: must be {key.allowed}"
            )
        cfg[name] = value
    _check_combinations(cfg)
    return cfg


def _check_combinations(cfg: dict) -> None:
    """Checks that involve more than one key."""
    if cfg["dataset"] == "synthetic" and cfg["model"] not in FLAT_MODELS:
        raise ConfigError(
            f"run-config key 'model' = {cfg['model']!r} does not fit dataset 'synthetic'"
            f" (flat 60-dim features); valid choices: {', '.join(FLAT_MODELS)}"
        )
    if cfg["dataset"] != "synthetic" and cfg["model"] not in IMAGE_MODELS:
        raise ConfigError(
            f"run-config key 'model' = {cfg['model']!r} does not fit image dataset"
            f" {cfg['dataset']!r}; valid choices: {', '.join(IMAGE_MODELS)}"
        )

    problem = optimizer_problem(cfg["optimizer"], cfg["momentum"])
    if problem:
        raise ConfigError(problem)
    if cfg["dataset"] == "synthetic" and cfg["augment"].strip() not in ("", "none"):
        raise ConfigError(
            f"run-config key 'augment' = {cfg['augment']!r} needs an image dataset; use 'none'"
            " with dataset 'synthetic'"
        )
    if cfg["dataset"] == "synthetic" and cfg["validation-fraction"] > 0:
        raise ConfigError(
            f"run-config key 'validation-fraction' = {cfg['validation-fraction']} needs an image dataset (the"
            " synthetic data is generated per device, with no shared training split to hold out); use 0"
        )
    _check_partitioning(cfg)
    if cfg["resume"] and not cfg["run-name"]:
        raise ConfigError(
            "run-config key 'resume' = true needs 'run-name' set: the run to resume is "
            "<results-dir>/<run-name>"
        )
    if cfg["min-fit-clients"] > cfg["min-available-clients"]:
        raise ConfigError(
            f"run-config key 'min-fit-clients' = {cfg['min-fit-clients']} is invalid: must be"
            f" <= min-available-clients ({cfg['min-available-clients']})"
        )


def _check_partitioning(cfg: dict) -> None:
    """The partitioner keys that depend on the dataset."""
    info = IMAGE_DATASETS.get(cfg["dataset"])
    if cfg["partitioner"] == "natural" and (info is None or info.natural_id_column is None):
        natural = [name for name, d in IMAGE_DATASETS.items() if d.natural_id_column]
        raise ConfigError(
            f"run-config key 'partitioner' = 'natural' does not fit dataset {cfg['dataset']!r}, which names no"
            f" natural owner of its examples; valid datasets: {', '.join(natural)}")
    if cfg["partitioner"] == "pathological" and info is not None and cfg["classes-per-client"] > info.shape.classes:
        raise ConfigError(
            f"run-config key 'classes-per-client' = {cfg['classes-per-client']} is invalid: {cfg['dataset']!r} has"
            f" {info.shape.classes} classes; valid: 1 to {info.shape.classes}")
    if cfg["dataset"] == "synthetic" and cfg["noise-sigma"] > 0:
        raise ConfigError(
            f"run-config key 'noise-sigma' = {cfg['noise-sigma']} needs an image dataset (the synthetic data is"
            " generated per device, with its own feature skew, synthetic-beta); use 0 with dataset 'synthetic'")


def parse_key_value(text: str, keys: Mapping[str, Key]) -> tuple[str, Any]:
    """Parse one ``KEY=VALUE`` override of ``keys`` as TOML would (numbers, booleans, strings)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form KEY=VALUE")
    name, value = text.split("=", 1)
    name, value = name.strip(), value.strip()
    if name not in keys:
        raise ConfigError(unknown_keys([name], keys))
    want = keys[name].type
    if want is str:
        return name, value.strip("'\"")
    if want is bool:
        return name, value.lower()
    try:
        return name, int(value) if want is int else float(value)
    except ValueError:
        return name, value  # left for validate_keys to reject with the standard message


def toml_value(value) -> str:
    """A key's default as TOML writes it (true, "paper", 0.01)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)
