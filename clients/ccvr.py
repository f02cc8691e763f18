"""CCVR: after federated training, the server retrains the classifier on virtual features drawn
from a Gaussian per class whose mean and covariance it pools from the clients' own feature
statistics (Luo, Chen, Hu, Zhang, Liang, Feng, "No Fear of Heterogeneity: Classifier Calibration
for Federated Learning with Non-IID Data", NeurIPS 2021).

- Rounds 1 to R − 1 (R = `num-server-rounds`): FedAvg (plain local SGD, the n_k-weighted mean).
  Round R is the calibration round (`protocol.calibration`): the server asks every client
  (`ccvr-clients = "all"`; `"sampled"`: the round's `fraction-fit`), and each trains no step.
  So R − 1 rounds train: a run of T training rounds sets `num-server-rounds = T + 1`, and its
  metrics show the uncalibrated model at round R − 1 beside the calibrated one at round R.
- Client, in round R, with z = body(x) the global model's features (the head's input, eval
  mode, float64) on its training data, for each class c with N_c examples:

  ```
  μ_c = (1/N_c) Σ_j z_j          Σ_c = (1/(N_c − 1)) Σ_j (z_j − μ_c)(z_j − μ_c)ᵀ    (ccvr-covariance = "unbiased")
                                 Σ_c = (1/N_c) Σ_j (z_j − μ_c)(z_j − μ_c)ᵀ          (ccvr-covariance = "population")
  ```

  and sends (N_c, μ_c, Σ_c) for every class (`class_stats`: counts (C,), means (C, d), covs
  (C, d, d), float64; zeros for a class it lacks, Σ_c = 0 for N_c = 1) with w_t unchanged.
  In the other rounds the group's three arrays are empty.
- Server (`strategies/ccvr.py`), in round R, per class over the clients k that replied
  (N_c = Σ_k N_{c,k}; a class with N_c < 2 gets no virtual features):

  ```
  μ_c = Σ_k (N_{c,k} / N_c) μ_{c,k}
  Σ_c = Σ_k (N_{c,k} − 1)/(N_c − 1) Σ_{c,k} + Σ_k N_{c,k}/(N_c − 1) μ_{c,k} μ_{c,k}ᵀ − N_c/(N_c − 1) μ_c μ_cᵀ
  ```

  then M virtual features per class z ~ N(μ_c, Σ_c) (μ_c + V √Λ ε, Σ_c = V Λ Vᵀ with negative
  rounding eigenvalues set to 0, ε standard normal from a generator seeded by the run's `seed`),
  and the head alone (its weight and bias) retrained on them from the aggregated model's head:
  `ccvr-epochs` passes of plain SGD at `ccvr-lr`, batches of `batch-size` in a seeded shuffled
  order, on the mean cross-entropy (float64). The body and buffers are the aggregated model's.
  Server metrics `ccvr_virtual_features` (how many were drawn) and `ccvr_head_change` (‖Δ head‖),
  0 in the other rounds. State: none on either side (the round's statistics are used once).
- What travels, and what it reveals: once, in round R, each client's per-class counts (its label
  distribution), and the mean and covariance of the global model's features of its examples of
  each class: much more than the model update reveals about its data (a covariance of d × d
  values per class, estimated from as few as 2 examples, pins those examples' features down to
  their span; with N_c ≤ d it is of rank N_c − 1). The paper (as recalled) does not protect them; no noise
  is added here.
- Keys: `ccvr-samples` M (100, ≥ 1; fluke's default, FL-bench's 200), `ccvr-epochs` (1, ≥ 1;
  FL-bench's and fluke's one pass), `ccvr-lr` (0.01, > 0), `ccvr-clients` (`all` | `sampled`,
  default `all`), `ccvr-covariance` (`unbiased` | `population`, default `unbiased`).
- Readings: no authors' code was found (users of the CReFF-FL authors' repository ask them for
  one); the paper's algorithm runs by default as recalled here, and FL-bench
  (`src/server/ccvr.py`, `src/client/ccvr.py`) and fluke (`fluke/algorithms/ccvr.py`) were read.
  The pooled covariance above is exact for the clients' unbiased covariances (the paper's, as recalled); both
  FL-bench and fluke compute the clients' covariance with divisor N_c (torch's correction 0) and pool it with the
  same formula: `ccvr-covariance = "population"`. Both retrain the head one pass from the global
  head with plain SGD and the run's batch size, as here; fluke draws 100 per class at lr 0.1,
  FL-bench 200 at the clients' lr. fluke calibrates once at the end of training with every
  client's statistics, as here; FL-bench calibrates a copy before each evaluation (the calibrated
  head evaluated, training continuing from the uncalibrated model): not offered. Features are
  the body's output (the head's input), in eval mode (FL-bench's `model.eval()`).
- Paper and authors' code. Read: the paper's abstract only (arXiv 2106.05001: the classifier
  "post-calibrat[ed] after federated training" on "virtual representations sampled from an
  approximated gaussian mixture model", as here); its algorithm box, its pooling formula and
  its choice of M, of the retraining's rate and length, and of the layer whose features are
  pooled were not available to this change, so the rules above are the paper as recalled and
  FL-bench's and fluke's code; with no authors' code there is no second reading to offer
  beyond `ccvr-covariance`.

Summary: client - (round R: per-class feature statistics) | server round R: head retrained on
virtual features | client state - | server state - | traffic per-class counts, means, covariances
up (round R)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from protocol.calibration import STATISTICS, is_calibration_round
from protocol.keys import Key
from tasks.functional.core import call_part, eval_forward, plain_direction
from tasks.functional.update import Arrays, LocalUpdate, Round

COVARIANCES = ("unbiased", "population")
CHUNK = 256  # examples per forward pass when the statistics are measured


def class_statistics(features: torch.Tensor, y: torch.Tensor, classes: int,
                     covariance: str) -> dict[str, torch.Tensor]:
    """{counts (C,), means (C, d), covs (C, d, d)} of ``features`` (n x d) per label of ``y``, in the
    features' dtype: Σ_c with divisor N_c − 1 (``unbiased``; 0 for N_c = 1) or N_c (``population``);
    zeros for a class without examples."""
    n, d = features.shape
    counts = torch.bincount(y.long(), minlength=classes).to(features.dtype)
    means = torch.zeros(classes, d, dtype=features.dtype, device=features.device)
    covs = torch.zeros(classes, d, d, dtype=features.dtype, device=features.device)
    for c in range(classes):
        z = features[y == c]
        if len(z) == 0:
            continue
        means[c] = z.mean(dim=0)
        centred = z - means[c]
        divisor = len(z) - 1 if covariance == "unbiased" else len(z)
        if divisor > 0:
            covs[c] = centred.T @ centred / divisor
    return {"counts": counts, "means": means, "covs": covs}


def ccvr_prepare(job: Round) -> Round:
    """The calibration round trains no step (``epochs`` 0); every other round as it came."""
    if is_calibration_round(job.server_round, job.hp.keys["num-server-rounds"]):
        return replace(job, epochs=0)
    return job


def ccvr_finish(job: Round, result):
    """The reply's ``class_stats``: in the calibration round the statistics (``class_statistics``)
    of the eval-mode body's features at the round's weights (w_t: no step was taken) on the
    client's training data, in float64; otherwise three empty arrays."""
    like = next(iter(result.params.values()))
    if not is_calibration_round(job.server_round, job.hp.keys["num-server-rounds"]):
        empty = torch.zeros(0, dtype=torch.float64, device=like.device)
        return replace(result, reply={**result.reply, "class_stats": {name: empty for name in STATISTICS}})
    model = job.model
    x = job.x.to(like.device)
    chunks = [eval_forward(model, lambda part=x[i:i + CHUNK]: call_part(model, "body", result.params, result.buffers,
                                                                         part, strict=True))
              for i in range(0, len(x), CHUNK)]
    features = torch.cat(chunks).double() if chunks else torch.zeros(0, model.head.in_features, dtype=torch.float64)
    stats = class_statistics(features, job.y.to(features.device), model.head.out_features,
                             job.hp.keys["ccvr-covariance"])
    return replace(result, reply={**result.reply, "class_stats": stats})


def statistics_names(model, cfg) -> tuple[str, ...]:
    """The names of the ``class_stats`` arrays, in the order they travel."""
    return STATISTICS


UPDATE = LocalUpdate("ccvr", plain_direction, keys={
    "ccvr-covariance": Key("unbiased", choices=COVARIANCES),
}, reads=("num-server-rounds",), sends={"class_stats": Arrays(statistics_names)}, prepare=ccvr_prepare,
    finish=ccvr_finish, module=__name__)
