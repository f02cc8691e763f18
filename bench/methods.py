#!/usr/bin/env python
"""Client-side cost of every registered method relative to FedAvg, beside its cost model.

Not a test; run by hand:  FL_DATA_DIR=/path/to/data python bench/methods.py

Each method's client ``fit()`` is driven directly (no Flower, no Ray) on the same partitions
(MNIST unless ``--set dataset=cifar10``; ``--set model=...`` or ``--model`` picks the model), same model, same batch order, same received weights; so the ratio isolates the
method's local computation. Stateful methods are timed in their second round (MOON's
contrastive term, control variates and FedDyn's state exist only from then on): every client
first does one untimed round-1 fit on its own context, then round 2 is timed. Methods are
interleaved (rep 1: every method, rep 2: every method, ...), each rep's time is divided by
that rep's FedAvg time and the median of these ratios is taken, so drift in the machine's
speed hits all methods alike.

Two predictions, both from the extra passes each method makes (``predictions``):

- pass count: F = forward multiply-accumulates of one sample (Conv2d and Linear layers,
  counted with hooks), a training step = 3F (backward = twice the forward), as the papers
  count;
- calibrated: the same passes priced at this machine's measured costs, as the methods run
  them (``pass_costs``): a second forward+backward, a no-grad forward, a body forward, an RI
  evaluation; plus what a pass count leaves out, read from each client's code: in-place
  elementwise passes over all weights per step (``WEIGHT_PASSES``) and model-sized state
  saved and reloaded once per round (``STATE_ROUND_TRIPS``); all relative to the measured
  FedAvg fit time per training sample (``calibrated``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from torch import nn  # noqa: E402

from fl_app.node.drift_client import DriftClient  # noqa: E402
from fl_app.registry import METHODS, resolve, validate_config  # noqa: E402
from tasks.datasets import input_shape  # noqa: E402
from tasks.models import build_model, get_weights, last_layers_param_names  # noqa: E402
from tasks.partitioning import PartitionSpec, load_partition  # noqa: E402

NEEDS_MODEL = {"fedbn": "cnn-bn"}  # timed against a FedAvg on that model


def layer_macs(model: nn.Module, shape) -> dict[str, int]:
    """Forward multiply-accumulates of one sample per Conv2d/Linear layer (by module name)."""
    macs: dict[str, int] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            def hook(mod, inp, out, name=name):
                k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
                macs[name] = out[0].numel() * k
        elif isinstance(m, nn.Linear):
            def hook(mod, inp, out, name=name):
                macs[name] = mod.in_features * mod.out_features
        else:
            continue
        hooks.append(m.register_forward_hook(hook))
    x = torch.zeros(1, shape.channels, shape.size, shape.size) if shape.channels else torch.zeros(1, shape.size)
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return macs


def predictions(cfg: dict, model_name: str, n_k: float) -> dict[str, tuple[float, str]]:
    """Predicted fit-time ratio to FedAvg and its one-line justification, per method."""
    shape = input_shape(cfg["dataset"])
    model = build_model(model_name, shape)
    macs = layer_macs(model, shape)
    f = sum(macs.values())
    head = sum(v for k, v in macs.items() if k.startswith("head"))
    body = f - head
    dim = model.head.in_features  # the representation's dimension d (FedDecorr)
    pgvc_names = {n.rsplit(".", 1)[0] for n in last_layers_param_names(model, cfg["pgvc-layers"])}
    pgvc = sum(v for k, v in macs.items() if k in pgvc_names)
    # rho's backward: weight grads of the masked layers (1x each) + input grads of all but the
    # first masked layer (1x each); the full backward then runs as in FedAvg.
    pgvc_extra = 2 * pgvc - macs[min(pgvc_names, key=lambda k: list(macs).index(k))]
    ri_evals = cfg["ri-directions"] * (cfg["ri-points"] + 1) * min(cfg["ri-samples"], n_k)
    e = cfg["local-epochs"]
    same = (1.0, "gradient edits that are O(#params) per step, no extra pass")
    return {
        "fedavg": (1.0, "reference: one forward + backward (3F) per batch"),
        "fedprox": (1.0, "adds mu (w - w_t) to each gradient: O(#params)"),
        "scaffold": (1.0, "adds c - c_i to each gradient: O(#params); c_i update once per round"),
        "fedpvr": (1.0, "SCAFFOLD correction on the last Linear layer only"),
        "feddyn": (1.0, "adds -g_k + alpha (w - w_t): O(#params)"),
        "fednova": (1.0, "plain local SGD (normalisation is server-side)"),
        "dp-fedavg": (1.0, "plain local SGD (clipping is in Flower's mod, outside fit)"),
        "fedbn": (1.0, "plain local SGD on cnn-bn; BN entries swapped in/out once per round"),
        "fedntd": ((3 * f + f) / (3 * f), "+1 forward of the frozen global model: 1 + F/3F"),
        "moon": ((3 * f + 2 * body) / (3 * f), "+ body forwards of the frozen global and previous models: 1 + 2F_body/3F"),
        "fedsol": ((3 * f + f + 4 * head) / (3 * f),
                   "+1 global forward (F) + head-only prox gradient and perturbed head forward (~4F_head); body pass shared (paper Table 5: ~1.33)"),
        "fedgam": ((6 * f) / (3 * f) if cfg["gam-variant"] == "paper" else 4.0,
                   f"gam-variant {cfg['gam-variant']}: 2 forward+backward passes per batch (reference variant: 4)"),
        "fedgam-cv": (2.0, "FedGAM (2 passes) + SCAFFOLD correction (O(#params))"),
        "fedsam": (2.0, "SAM: gradient at w, then at w + eps: 2 passes"),
        "fedasam": (2.0, "ASAM: as SAM, eps rescaled elementwise"),
        "fedsmoo": (2.0, "SAM (2 passes) with eps from g - mu_i - s, plus FedDyn's dual: O(#params)"),
        "fedpgvc": ((3 * f + pgvc_extra) / (3 * f),
                    f"+ backward of 0.5 mean(loss^2) into the last {cfg['pgvc-layers']} Linear layers only"),
        "ri-fedavg": (1 + ri_evals / (3 * e * n_k),
                      "+ M(m+1) forwards on ri-samples examples once per round: 1 + M(m+1)S/(3 E n_k)"),
        "fedrs": (1.0, "scales the logits by a per-class factor: O(B C) per batch"),
        "fedlc": (1.0, "subtracts a per-class offset from the logits: O(B C) per batch"),
        "feddecorr": (1 + dim**2 / f, "+ the d x d Gram matrix of the batch's representations, forward and"
                      " backward (3 N d^2): 1 + d^2/F"),
        "fedacg": (1.0, "FedProx's step at the look-ahead (the momentum is the server's): O(#params)"),
        "fedexp": (1.0, "FedAvg's client (the extrapolation is the server's)"),
        "feddc": (1.0, "FedDyn's term plus SCAFFOLD's correction: O(#params); h_i, c_i updates once per round"),
        "fedspeed": (2.0, "SAM (2 passes) plus FedDyn's term: O(#params)"),
        "fedcm": (1.0, "alpha g + (1 - alpha) Delta per step: O(#params)"),
        "mofedsam": (2.0, "SAM (2 passes) mixed with the server's Delta: O(#params)"),
        "fedgamma": (2.0, "SAM (2 passes) plus SCAFFOLD's c - c_i: O(#params)"),
        "fedlesam": (1.0, "one gradient per step, at w + rho v/||v|| (v given, no ascent pass): O(#params)"),
        "fedswa": (1.0, "plain local SGD at a decaying rate (the lookahead is the server's)"),
        "fedmoswa": (1.0, "SCAFFOLD-style m - c_i after the clip: O(#params); c_i update once per round"),
        "fedinit": (1.0, "plain local SGD from the relaxed start (set once per round)"),
        "fedgela": (1.0, "logits scaled per class, the head fixed: O(B C) per batch"),
        "ccvr": (1.0, "FedAvg's client (the calibration is one extra round of forwards, not timed here)"),
    } | {m: (1.0, "FedAvg's client (the method is a server optimiser)")
         for m in ("fedavgm", "fedadam", "fedyogi", "fedadagrad")} | {"_f": (f, ""), "_same": same}


def _median_seconds(fn, reps: int = 15) -> float:
    for _ in range(3):  # warm-up
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def training_passes(model, x, y) -> dict:
    """A training step (forward, backward, SGD step), the same with a second forward+backward
    at the same weights (SAM-style methods), a no-grad forward and a body-only forward (MOON)."""
    import torch.nn.functional as F

    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)

    def step():
        model.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def step_two_passes():
        model.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        for p in params:
            p.grad = None
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def forward():
        model.eval()
        with torch.no_grad():
            F.cross_entropy(model(x), y)

    def body():
        model.eval()
        with torch.no_grad():
            model.body(x)

    return {"step": step, "step_two_passes": step_two_passes, "forward": forward, "body": body}


def ri_pass(model, x_ri, y_ri, direction, batch: int):
    """One of RI-FedAvg's evaluations: ``functional_call`` at a perturbed point, ``batch``
    examples at a time, as the client does on CPU."""
    from tasks.roughness import model_loss_fn, point_along

    center = {n: p.detach() for n, p in model.named_parameters()}

    def ri_point():
        model.eval()
        with torch.no_grad():
            model_loss_fn(model, x_ri, y_ri, batch_size=batch)(point_along(center, direction, 0, torch.tensor(1e-3)))

    return ri_point


def weight_passes(model, model_name: str, shape) -> tuple:
    """A state round trip (what a method with per-client state pays once per round per
    model-sized state: save it into ``context.state``, an ArrayRecord, and read it back into
    a model) and one in-place elementwise pass over all weights (the O(#params) gradient edits)."""
    from flwr.app import ArrayRecord

    from tasks.models import set_weights

    params = list(model.parameters())
    other = build_model(model_name, shape, seed=1)

    def state_round_trip():
        record = ArrayRecord(numpy_ndarrays=get_weights(model))
        set_weights(other, record.to_numpy_ndarrays())

    grads = [torch.randn_like(p) for p in params]

    def weights_pass():
        with torch.no_grad():
            for g, p in zip(grads, params):
                g.add_(p)

    return state_round_trip, weights_pass


def pass_costs(model_name: str, shape, batch: int, ri_samples: int) -> dict[str, float]:
    """Measured costs of the passes the methods add, same model and threads, as the methods
    run them: seconds per sample of a training step (forward, backward, SGD step), of a
    second forward+backward at the same weights (SAM-style methods), of a no-grad forward
    and of a body-only forward (MOON), at batch ``batch``, of RI-FedAvg's evaluation
    (``functional_call`` at a perturbed point, ``batch`` examples at a time, as the client
    does on CPU); and seconds per in-place elementwise pass over all weights (the
    O(#params) gradient edits). The median of 15 repetitions after 3 warm-ups."""
    model = build_model(model_name, shape, seed=0)
    gen = torch.Generator().manual_seed(0)
    dims = (shape.channels, shape.size, shape.size) if shape.channels else (shape.size,)
    x = torch.randn(batch, *dims, generator=gen)
    y = torch.randint(0, shape.classes, (batch,), generator=gen)
    passes = training_passes(model, x, y)
    x_ri = torch.randn(ri_samples, *dims, generator=gen)
    y_ri = torch.randint(0, shape.classes, (ri_samples,), generator=gen)
    direction = {n: torch.randn((1, *p.shape), generator=gen) for n, p in model.named_parameters()}
    ri_point = ri_pass(model, x_ri, y_ri, direction, batch)
    state_round_trip, weights_pass = weight_passes(model, model_name, shape)
    return {
        "step": _median_seconds(passes["step"]) / batch,
        "second_pass": (_median_seconds(passes["step_two_passes"]) - _median_seconds(passes["step"])) / batch,
        "forward": _median_seconds(passes["forward"]) / batch,
        "body": _median_seconds(passes["body"]) / batch,
        "ri": _median_seconds(ri_point) / ri_samples,
        "weights_pass": _median_seconds(weights_pass),
        "state_round_trip": _median_seconds(state_round_trip),
    }


# Elementwise passes over all weights per local step, beyond FedAvg's (read from each client's
# code): these are what a pass count of forwards and backwards leaves out.
WEIGHT_PASSES = {
    "fedprox": 2,  # w - w_t into a temporary, then added to the gradient
    "feddyn": 2,  # grad += alpha w, grad -= (g_k + alpha w_t)
    "scaffold": 1,  # grad += c - c_i
    "fedsam": 5,  # ||g|| (per-tensor norms), eps = g * scale, save w, w += eps, restore w
    "fedasam": 8,  # as SAM, plus T = |w| + eta, T g, T (T g)
    "fedsmoo": 11,  # as SAM, plus v = g - mu_i - s (2), mu_i += shat - s (2), FedDyn's dual (2)
    "fedgam": 6,  # as SAM, plus G = g + alpha rho g_adv
    "fedgam-cv": 7,  # FedGAM plus c - c_i
    "fedacg": 2,  # FedProx's term, beta (w - w_t)
    "feddc": 3,  # FedDyn's term (2) plus SCAFFOLD's c - c_i
    "fedspeed": 7,  # SAM's 5 plus FedDyn's 2 (FedSMOO's dual held at zero: not computed)
    "fedcm": 2,  # alpha g, + (1 - alpha) Delta
    "mofedsam": 7,  # SAM's 5 plus FedCM's 2
    "fedgamma": 6,  # SAM's 5 plus c - c_i
    "fedlesam": 3,  # w += rho v/||v|| (norm included), restore w
    "fedmoswa": 1,  # grad += m - c_i
}


# Model-sized state written and read back once per round (context.state and model copies).
STATE_ROUND_TRIPS = {
    "moon": 2,  # the previous local model kept and reloaded, the frozen global model copied in
    "scaffold": 1,  # c_i
    "fedgam-cv": 1,  # c_i
    "feddyn": 1,  # g_k
    "fedsmoo": 2,  # g_k (FedDyn's) and mu_i
    "feddc": 2,  # c_i and h_i
    "fedspeed": 1,  # g_k (FedDyn's)
    "fedgamma": 1,  # c_i
    "fedmoswa": 1,  # c_i
    "fedinit": 1,  # the last local model
}


def calibrated(cfg: dict, costs: dict, fedavg_per_sample: float, n_k: float) -> dict[str, float]:
    """1 + (the method's extra passes per training sample, priced by ``pass_costs``) / (the
    measured FedAvg fit time per training sample, which includes batching and the optimiser)."""
    ri_evals = cfg["ri-directions"] * (cfg["ri-points"] + 1) * min(cfg["ri-samples"], n_k)
    gam_passes = 1 if cfg["gam-variant"] == "paper" else 3
    per_pass = costs["weights_pass"] / cfg["batch-size"]  # per training sample
    extra = {
        "fedntd": costs["forward"],
        "moon": 2 * costs["body"],
        "fedsol": costs["forward"],  # + head-only terms, a few % of F: left out
        "fedsam": costs["second_pass"],
        "fedasam": costs["second_pass"],
        "fedsmoo": costs["second_pass"],
        "fedspeed": costs["second_pass"],  # FedSMOO's step under smoo-s = none
        "fedgam": gam_passes * costs["second_pass"],
        "fedgam-cv": gam_passes * costs["second_pass"],
        "mofedsam": costs["second_pass"],
        "fedgamma": costs["second_pass"],
        "ri-fedavg": ri_evals * costs["ri"] / (cfg["local-epochs"] * n_k),
    }
    for method, passes in WEIGHT_PASSES.items():
        extra[method] = extra.get(method, 0.0) + passes * per_pass
    for method, trips in STATE_ROUND_TRIPS.items():  # once per round: spread over E n_k samples
        extra[method] = extra.get(method, 0.0) + trips * costs["state_round_trip"] / (cfg["local-epochs"] * n_k)
    return {m: 1 + e / fedavg_per_sample for m, e in extra.items()}


def make_client(name: str, base: dict, pid: int, num_partitions: int):
    """The method's client as a run builds it: the config resolved by the registry (validated,
    the method looked up, its own checks applied), the client built from it."""
    cfg, method = resolve({**base, "strategy": name})
    context = Context(run_id=0, node_id=pid, node_config={}, state=RecordDict(), run_config={})
    return cfg, DriftClient(method.update, cfg, context, pid, num_partitions)


def fit_config(method: str, cfg: dict, rnd: int) -> dict:
    config = {"server-round": rnd}
    if method == "fedprox":
        config["proximal_mu"] = cfg["proximal-mu"]
    return config


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--model", default="cnn-small")
    p.add_argument("--clients", type=int, default=100, help="partitions of the split")
    p.add_argument("--partitions", type=int, nargs="+", default=[1, 3, 7], help="which partitions to train on")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 = one Ray actor's share with cpus-per-client=1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--data-dir", default=os.environ.get("FL_DATA_DIR", str(ROOT.parent / "shared" / "data")))
    return p.parse_args(argv)


def base_config(args: argparse.Namespace) -> dict:
    """The run config every method's clients share; ``--set model=/dataset=`` win over the
    defaults (``args.model`` follows)."""
    from fl_app.registry import parse_override

    base = {"dataset": "mnist", "model": args.model, "data-dir": str(Path(args.data_dir).resolve()),
            "checkpoint-every": 0, "local-epochs": 1, "batch-size": 32}
    for text in args.set:
        k, v = parse_override(text)
        base[k] = v
    args.model = base["model"]
    return base


def bench_entries(methods: list[str], model_name: str) -> list[tuple[str, str, str]]:
    """(label, method, model) to time: FedAvg on every model some method needs (its reference),
    then every other method on its model."""
    entries = []
    models = sorted({NEEDS_MODEL.get(m, model_name) for m in methods})
    for model in models:
        if model != model_name or "fedavg" in methods:
            entries.append((f"fedavg[{model}]" if model != model_name else "fedavg", "fedavg", model))
    for m in methods:
        if m != "fedavg":
            entries.append((m, m, NEEDS_MODEL.get(m, model_name)))
    return entries


def warm_clients(entries, base: dict, args: argparse.Namespace, weights: dict) -> dict:
    """One client object per (entry, partition), after an untimed round-1 fit (state, warm-up)."""
    clients = {}
    for label, method, model in entries:
        clients[label] = []
        for pid in args.partitions:
            cfg, client = make_client(method, {**base, "model": model}, pid, args.clients)
            client.fit([w.copy() for w in weights[model]], fit_config(method, cfg, 1))
            clients[label].append((cfg, client))
    return clients


def time_fits(entries, clients: dict, weights: dict, reps: int) -> dict[str, list[float]]:
    """Seconds of each entry's round-2 fits over its partitions, once per rep."""
    times: dict[str, list[float]] = {label: [] for label, _, _ in entries}
    for rep in range(reps):
        for label, method, model in entries:
            t0 = time.perf_counter()
            for cfg, client in clients[label]:
                client.fit([w.copy() for w in weights[model]], fit_config(method, cfg, 2))
            times[label].append(time.perf_counter() - t0)
        print(f"rep {rep + 1}/{reps} done, load {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    return times


def print_costs(pred: dict, costs: dict, model_name: str, fedavg_per_sample: float) -> None:
    print(f"\nF = {pred['_f'][0]:,} forward MACs per sample ({model_name}); measured per sample: "
          f"training step {costs['step'] * 1e6:.0f} us, second forward+backward {costs['second_pass'] * 1e6:.0f} us, "
          f"forward {costs['forward'] * 1e6:.0f} us (= {costs['forward'] / costs['step']:.2f} step; pass count "
          f"assumes 0.33), body forward {costs['body'] * 1e6:.0f} us, RI evaluation {costs['ri'] * 1e6:.0f} us; "
          f"one pass over the weights {costs['weights_pass'] * 1e3:.2f} ms, a state round trip "
          f"{costs['state_round_trip'] * 1e3:.1f} ms; FedAvg fit "
          f"{fedavg_per_sample * 1e6:.0f} us per training sample")


def print_table(entries, times: dict, pred: dict, cal: dict, model_name: str, num_partitions: int) -> None:
    """Measured against predicted cost per method, and how many predictions fall within 10%."""
    print(f"\n| method | s per round ({num_partitions} clients) | measured / FedAvg | predicted: pass count (3F)"
          " | predicted: calibrated | within 10%: pass count / calibrated | why predicted |")
    print("|---|---|---|---|---|---|---|")
    hits = {"pass count": 0, "calibrated": 0}
    for label, method, model in entries:
        ref = "fedavg" if model == model_name else f"fedavg[{model}]"
        med = statistics.median(times[label])
        # each rep's ratio to the FedAvg run of the same rep, then the median: drift in the
        # machine's speed between reps cancels within a rep
        ratio = statistics.median(t / r for t, r in zip(times[label], times[ref]))
        predicted, why = pred.get(method, pred["_same"])
        measured_cost = cal.get(method, predicted)
        ok_count = abs(ratio / predicted - 1) <= 0.10
        ok_cal = abs(ratio / measured_cost - 1) <= 0.10
        if label == method:  # the FedAvg reference on another model is not a method
            hits["pass count"] += ok_count
            hits["calibrated"] += ok_cal
        print(f"| {label} | {med:.2f} | {ratio:.2f} | {predicted:.2f} | {measured_cost:.2f} | "
              f"{'yes' if ok_count else 'no'} ({ratio / predicted:.2f}x) / {'yes' if ok_cal else 'NO'} "
              f"({ratio / measured_cost:.2f}x) | {why} |")
    n = sum(1 for label, method, _ in entries if label == method)
    print(f"\nwithin 10%: {hits['pass count']}/{n} of the pass-count prediction, {hits['calibrated']}/{n} of the "
          "calibrated one")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    base = base_config(args)
    dataset = base["dataset"]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    spec = PartitionSpec.from_config(validate_config(base), args.clients)
    sizes = [len(load_partition(spec, pid)[1]) for pid in args.partitions]
    n_k = float(np.mean(sizes))
    print(f"load {Path('/proc/loadavg').read_text().split()[0]}, torch {torch.__version__}, {args.threads} thread(s); "
          f"{dataset} {args.model}, partitions {args.partitions} of {args.clients} (n_k = {sizes}), E=1, B=32", flush=True)

    entries = bench_entries(methods, args.model)
    models = sorted({model for _, _, model in entries})
    weights = {model: get_weights(build_model(model, input_shape(dataset), seed=0)) for model in models}
    clients = warm_clients(entries, base, args, weights)
    times = time_fits(entries, clients, weights, args.reps)

    cfg0 = validate_config({**base, "strategy": "fedavg"})
    pred = predictions(cfg0, args.model, n_k)
    costs = pass_costs(args.model, input_shape(dataset), base["batch-size"], int(min(cfg0["ri-samples"], n_k)))
    fedavg_per_sample = statistics.median(times["fedavg"]) / (cfg0["local-epochs"] * sum(sizes))
    print_costs(pred, costs, args.model, fedavg_per_sample)
    print_table(entries, times, pred, calibrated(cfg0, costs, fedavg_per_sample, n_k), args.model, len(args.partitions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
