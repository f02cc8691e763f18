"""Security table: final test accuracy of FedAvg and SCAFFOLD under model poisoning, clean vs
attacked vs each defence, for f attackers of 10 clients; writes docs/security.md.

Usage (the data folder holds mnist/{train,test}.parquet; without it the Hugging Face hub is used):

    python scripts/security_table.py --data-dir DATA --attackers 3        # runs, then writes the page
    python scripts/security_table.py --data-dir DATA --attackers 3 1      # f = 3 first, then f = 1
    python scripts/security_table.py --render                             # the page from kept runs only

Each cell is one seeded run, driven in this process (no Ray, no SuperLink) with the project's
own pieces: every client is the method's real client behind ``NodeClient`` (which applies
``inject-faults``), the server is the method's strategy inside ``RecordingStrategy`` (which
applies ``screening``), and the test accuracy is the server's evaluation. All 10 clients are
sampled every round; the attackers are partitions 0 .. f-1. Attacks: ``scale-x10``
(``scale:k:10``), ``sign-flip`` (``flip:k``), ``adaptive`` (``adaptive:k``: a sign flip sized to
0.9 x the screening bound, fl_app/node/attacks.py). Defences: every screening the method supports
(fl_app/server/screening.py), with ``screen-attackers`` = f; Bulyan only where 10 >= 4f + 3.

Each finished run is kept as one JSON file in ``docs/results/security/`` (a run already kept is
not run again, so an interrupted table resumes), and the page is generated from those files
only: nothing in it is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from flwr.common import (  # noqa: E402
    Context,
    RecordDict,
    ndarrays_to_parameters,  # noqa: E402
)
from flwr.server.client_manager import SimpleClientManager  # noqa: E402

from fl_app.config import validate_config  # noqa: E402
from fl_app.node.node_client import NodeClient  # noqa: E402
from fl_app.registry import METHODS  # noqa: E402
from fl_app.server.recording import RecordingStrategy  # noqa: E402
from fl_app.server.screening import allowed_modes, min_replies  # noqa: E402
from fl_app.tooling.inprocess import InProcessProxy  # noqa: E402
from strategies.base import fedavg_kwargs  # noqa: E402
from tasks.datasets import input_shape  # noqa: E402
from tasks.models import build_model, get_weights, set_weights  # noqa: E402
from tasks.partitioning import PartitionSpec, load_partition, load_test_split  # noqa: E402
from tasks.train import evaluate  # noqa: E402

KEPT = ROOT / "docs" / "results" / "security"
PAGE = ROOT / "docs" / "security.md"
CLIENTS = 10
STRATEGIES = ("fedavg", "scaffold")
ATTACKS = {"scale-x10": "scale:{k}:10", "sign-flip": "flip:{k}", "adaptive": "adaptive:{k}"}
DEFENCE_ORDER = ("clip", "reject", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")  # columns
RUN_ORDER = ("multi-krum", "trimmed-mean", "reject", "clip", "median", "krum", "bulyan")  # likeliest first
TOLERANCE = 0.03  # the acceptance target: within 3 points of the clean run
SETTING = {"dataset": "mnist", "model": "cnn-small", "partitioner": "iid", "learning-rate": 0.05,
           "local-epochs": 1, "batch-size": 32, "seed": 0}


class Everyone(SimpleClientManager):
    """Samples every registered client every round, in partition order."""

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(len(self.clients))]


def defences(strategy: str, attackers: int) -> list[str]:
    """The screenings of ``strategy`` that apply with ``attackers`` of CLIENTS, in table order."""
    modes = allowed_modes(METHODS[strategy].strategy)
    return [m for m in DEFENCE_ORDER if m in modes and CLIENTS >= min_replies(m, attackers)]


def cells(strategy: str, attackers: int) -> list[tuple[str, str]]:
    """Every (attack, screening) run of one table, in the order they are run: clean, each attack
    undefended, then defence by defence (``RUN_ORDER``), so a table cut short by time still
    has whole columns."""
    out = [("clean", "none")] + [(attack, "none") for attack in ATTACKS]
    mine = defences(strategy, attackers)
    for d in sorted(mine, key=lambda m: RUN_ORDER.index(m)):
        out += [(attack, d) for attack in ATTACKS]
    return out


def run_name(strategy: str, attackers: int, attack: str, screening: str) -> str:
    return f"{strategy}-f{attackers}-{attack}-{screening}"


def run_config(strategy: str, attackers: int, attack: str, screening: str, args) -> dict:
    faults = ",".join(ATTACKS[attack].format(k=k) for k in range(attackers)) if attack != "clean" else ""
    return validate_config({
        **SETTING, "strategy": strategy, "data-dir": args.data_dir, "num-server-rounds": args.rounds,
        "fraction-fit": 1.0, "min-fit-clients": CLIENTS, "min-available-clients": CLIENTS,
        "inject-faults": faults, "screening": screening, "screen-attackers": attackers,
        "min-fit-fraction": 0.0,  # a wrecked model's clients may all send NaN: the run goes on
        "checkpoint-every": 0, "tensorboard": False,
    })


def load_data(args):
    """Each client's first ``--per-client`` images of an IID split, and the test images."""
    spec = PartitionSpec("mnist", CLIENTS, partitioner="iid", data_dir=args.data_dir, seed=SETTING["seed"])
    parts = [tuple(t[: args.per_client] for t in load_partition(spec, k)) for k in range(CLIENTS)]
    x, y = load_test_split("mnist", args.data_dir, SETTING["seed"])
    return parts, (x[: args.test], y[: args.test])


def one_run(cfg: dict, parts, test) -> dict:
    """Accuracy after each round of one seeded run, and its wall time."""
    started = time.monotonic()
    method = METHODS[cfg["strategy"]]
    model = build_model(cfg["model"], input_shape("mnist"), seed=cfg["seed"])
    w0 = get_weights(model)

    def evaluate_fn(server_round, arrays, config):
        set_weights(model, arrays)
        loss, accuracy = evaluate(model, *test)
        return loss, {"accuracy": accuracy}

    inner = method.strategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    strategy = RecordingStrategy(inner, cfg, Path(tempfile.mkdtemp(prefix="fl-drift-security-")),
                                 num_rounds=cfg["num-server-rounds"])
    manager = Everyone()
    for k in range(CLIENTS):
        context = Context(run_id=0, node_id=k, node_config={}, state=RecordDict(), run_config={})
        client = method.client(cfg, context, partition_id=k, num_partitions=CLIENTS)
        client._data = parts[k]
        manager.register(InProcessProxy(str(k), NodeClient(client)))
    parameters = ndarrays_to_parameters(w0)
    for t in range(1, cfg["num-server-rounds"] + 1):
        instructions = strategy.configure_fit(t, parameters, manager)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        new, _ = strategy.aggregate_fit(t, results, [])
        parameters = new if new is not None else parameters
        strategy.evaluate(t, parameters)
    rows = strategy.rows
    return {"accuracy": [r["test_accuracy"] for r in rows],
            "num_rejected": [r["num_rejected"] for r in rows],
            "seconds": round(time.monotonic() - started, 1)}


def run_table(strategy: str, attackers: int, args, data) -> None:
    """Runs (and keeps) every cell of one table not kept yet; with ``--shard i/n`` only the
    cells whose position in ``cells`` is i modulo n (for n processes side by side)."""
    KEPT.mkdir(parents=True, exist_ok=True)
    part, parts = args.shard
    for position, (attack, screening) in enumerate(cells(strategy, attackers)):
        if position % parts != part:
            continue
        path = KEPT / f"{run_name(strategy, attackers, attack, screening)}.json"
        if path.exists():
            continue
        cfg = run_config(strategy, attackers, attack, screening, args)
        result = one_run(cfg, *data)
        setting = {k: cfg[k] for k in (*SETTING, "num-server-rounds", "inject-faults", "screening",
                                       "screen-attackers")}
        record = {"strategy": strategy, "attackers": attackers, "attack": attack, "screening": screening,
                  "clients": CLIENTS, "per_client": args.per_client, "test_images": args.test,
                  "setting": setting, **result}
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{path.name}: final {result['accuracy'][-1]:.4f} in {result['seconds']} s", flush=True)


# ------------------------------------------------------------------ the page, from the kept runs
NAMES = {"fedavg": "FedAvg", "scaffold": "SCAFFOLD"}


def load_kept(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def final(records: list[dict], attack: str, screening: str) -> float | None:
    hits = [r["accuracy"][-1] for r in records if r["attack"] == attack and r["screening"] == screening]
    return hits[0] if hits else None


def table_lines(records: list[dict], strategy: str, attackers: int) -> list[str]:
    """The accuracy table of one (strategy, f): a row per attack, a column per defence."""
    columns = ["none"] + defences(strategy, attackers)
    lines = ["| attack | " + " | ".join("no defence" if c == "none" else c for c in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for attack in ("clean", *ATTACKS):
        shown = ["none"] if attack == "clean" else columns
        values = [final(records, attack, c) for c in shown] + [None] * (len(columns) - len(shown))
        lines.append(f"| {attack} | " + " | ".join("" if v is None else f"{v:.3f}" for v in values) + " |")
    return lines


def verdict_lines(records: list[dict], strategy: str, attackers: int, clean: float) -> list[str]:
    """Per attack the best defence and its gap to clean; per defence the attacks it fails.
    The acceptance is decided only when every attack has a defended run kept."""
    lines, holds_all, undecided = [], True, False
    for attack in ATTACKS:
        scores = {d: final(records, attack, d) for d in defences(strategy, attackers)}
        scores = {d: v for d, v in scores.items() if v is not None}
        if not scores:
            undecided = True
            lines.append(f"- {attack}: no defended run kept yet")
            continue
        best = max(scores, key=scores.get)
        gap = (scores[best] - clean) * 100
        ok = scores[best] >= clean - TOLERANCE
        holds_all &= ok
        lines.append(f"- {attack}: best defence `{best}` {scores[best]:.3f} ({gap:+.1f} points vs clean; "
                     f"{'within' if ok else 'NOT within'} {TOLERANCE * 100:.0f} points)")
    lines.append("")
    for d in defences(strategy, attackers):
        kept = {a: v for a in ATTACKS if (v := final(records, a, d)) is not None}
        if not kept:
            continue
        fails = [f"{a} ({v:.3f})" for a, v in kept.items() if v < clean - TOLERANCE]
        holds = [a for a, v in kept.items() if v >= clean - TOLERANCE]
        lines.append(f"- `{d}` fails against: {', '.join(fails) or 'none'}; holds against: "
                     f"{', '.join(holds) or 'none'}")
    verdict = "not decided (runs missing)" if undecided and holds_all else ("met" if holds_all else "NOT met")
    lines += ["", f"Acceptance (every attack within {TOLERANCE * 100:.0f} points of clean with its best "
              f"defence): **{verdict}**."]
    return lines


def section(records: list[dict], strategy: str, attackers: int) -> list[str]:
    mine = [r for r in records if r["strategy"] == strategy and r["attackers"] == attackers]
    clean = final(mine, "clean", "none")
    lines = [f"## {NAMES[strategy]}, f = {attackers} of {CLIENTS}", ""]
    lines += table_lines(mine, strategy, attackers) + [""]
    if clean is None:
        return lines + ["The clean run is not kept yet: no verdict.", ""]
    missing = len(cells(strategy, attackers)) - len(mine)
    if missing:
        lines += [f"{missing} of {len(cells(strategy, attackers))} runs are not kept yet.", ""]
    lines += verdict_lines(mine, strategy, attackers, clean) + [""]
    return lines


def render_page(records: list[dict]) -> str:
    """docs/security.md: the setting, then per (method, f) the table and its verdicts."""
    lines = ["# Security table: model poisoning against FedAvg and SCAFFOLD", "",
             "Generated by `scripts/security_table.py` from the runs kept in `docs/results/security/`; "
             "do not edit by hand.", ""]
    if not records:
        return "\n".join(lines + ["No runs are kept yet.", ""])
    r0 = records[0]
    setting = ", ".join(f"{k} = {v}" for k, v in r0["setting"].items()
                        if k not in ("inject-faults", "screening", "screen-attackers"))
    seconds = sum(r["seconds"] for r in records)
    lines += [f"Setting: {r0['clients']} clients, all sampled every round, {r0['per_client']} training images "
              f"each (IID), test accuracy on {r0['test_images']} MNIST test images after the last round; "
              f"{setting}. One seeded run per cell; the attackers are partitions 0 .. f-1. "
              f"{len(records)} runs, {seconds / 60:.0f} minutes in all on a shared 2-core CPU machine.", "",
              *ABOUT, ""]
    for attackers in sorted({r["attackers"] for r in records}, reverse=True):
        for strategy in STRATEGIES:
            if any(r["strategy"] == strategy and r["attackers"] == attackers for r in records):
                lines += section(records, strategy, attackers)
    return "\n".join(lines)


ABOUT = [
    "Attacks (`inject-faults`, fl_app/node/attacks.py): `scale-x10` multiplies each attacker's update by 10; "
    "`sign-flip` sends its negation; `adaptive` sends its negation scaled to 0.9 x the screening bound "
    "(3 x its own update norm under `reject`, the clip bound under `clip`), so that it stays just "
    "inside the norm filter.",
    "",
    "Defences (`screening`, fl_app/server/screening.py, with `screen-attackers` = f): `clip` and `reject` are "
    "norm filters (bound: 1 x, resp. 3 x the round's median update norm): by their documented rule they "
    "stop updates that are too large, not updates that point the wrong way at an ordinary norm, so a "
    "sign flip at an honest norm or the adaptive attacker passes them. `median`, `trimmed-mean` (f cut "
    "at each end), `krum`, `multi-krum` (n - f kept) and `bulyan` (only where n >= 4f + 3) judge the "
    "updates against each other. SCAFFOLD allows only the rules that keep or drop whole replies "
    "(clip, reject, krum, multi-krum): a robust value of the weights alone would leave its control "
    "variate open to the attackers.",
]


def shard(text: str) -> tuple[int, int]:
    """'1/3' -> (1, 3); argparse reports the ValueError as a one-line usage error."""
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise ValueError(text)
    return int(i), int(n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="", help="folder with mnist/{train,test}.parquet")
    parser.add_argument("--attackers", type=int, nargs="+", default=[3], help="f values, run in this order")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-client", type=int, default=400, help="training images per client")
    parser.add_argument("--test", type=int, default=2000, help="test images")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--shard", type=shard, default=(0, 1), help="i/n: run every n-th cell from the i-th")
    parser.add_argument("--render", action="store_true", help="only write the page from the kept runs")
    args = parser.parse_args(argv)
    for f in args.attackers:
        if not 1 <= f < CLIENTS / 2:
            parser.error(f"--attackers {f} is invalid: f must be in [1, {CLIENTS // 2 - 1}] for {CLIENTS} clients")
    if not args.render:
        torch.set_num_threads(args.threads)
        data = load_data(args)
        for f in args.attackers:
            for strategy in args.strategies:
                run_table(strategy, f, args, data)
    PAGE.write_text(render_page(load_kept(KEPT)))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
