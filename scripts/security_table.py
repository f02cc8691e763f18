"""Security table: final test accuracy of FedAvg, SCAFFOLD and FedDyn under model poisoning, clean
vs attacked vs each defence, for f attackers of 10 clients; writes docs/security.md.

Usage (the data folder holds mnist/{train,test}.parquet; without it the Hugging Face hub is used):

    python scripts/security_table.py --data-dir DATA --attackers 3        # runs, then writes the page
    python scripts/security_table.py --data-dir DATA --attackers 3 1      # f = 3 first, then f = 1
    python scripts/security_table.py --data-dir DATA --seeds 0 1 2        # seed by seed
    python scripts/security_table.py --data-dir DATA --partitioner dirichlet --alpha 0.3   # label-skewed clients
    python scripts/security_table.py --data-dir DATA --attackers 3 --attacks alie ipm   # other attacks
    python scripts/security_table.py --render                             # the page from kept runs only
    python scripts/security_table.py --data-dir DATA --strategies scaffold --redo-before-rollback  # the ‡ runs again

Each run is one seeded run (the seed sets the split (IID, or Dirichlet(alpha) over the labels with
``--partitioner dirichlet``), the test images drawn, the model's
initial weights and the clients' batch order), driven in this process (no Ray, no SuperLink) with the project's
own pieces: every client is the method's real client behind ``NodeClient`` (which applies
``inject-faults``), the server is the method's strategy inside ``DriftServer`` (its ``fit``, which
applies ``screening``), and the test accuracy is the server's evaluation. All 10 clients are
sampled every round; the attackers are partitions 0 .. f-1. Attacks: ``scale-x10``
(``scale:k:10``), ``sign-flip`` (``flip:k``), ``adaptive`` (``adaptive:k``: a sign flip sized to
0.9 x the screening bound, fl_app/node/attacks.py) by default; ``--attacks`` picks among those and
``alie``, ``ipm``, ``mimic`` (the omniscient attacks, applied at the server with their defaults,
fl_app/server/omniscient.py), ``label-flip`` and ``gaussian`` (``ATTACKS``). A page shows the
default attacks and every other one with a kept run. Defences: every screening the method supports
(fl_app/server/screening.py, geometric-median and centered-clip included), with ``screen-attackers``
= f, and the pre-aggregation chains ``CHAINS``, each named as one defence 'step+...+rule'
(``screen-pre`` = the steps, ``screening`` = the rule; ``--screenings nnm+trimmed-mean``); Bulyan
only where 10 >= 4f + 3, bucketing only where the buckets the f attackers spoil are fewer than half.
A table's columns are the defences that apply with a kept run; its last row is each one's worst
case (the largest mean loss over the attacks kept for it), and the text names the defence of
smallest worst case among those kept for every attack shown.

Each finished run is kept as one JSON file in ``docs/results/security/`` (IID clients) or
``docs/results/security/dirichlet-<alpha>/``, named by method, f, attack, screening and seed (a run already kept is not run again, so an interrupted table
resumes), and the page is generated from those files only: nothing in it is typed by hand,
except the text below ``HAND_WRITTEN`` in the page, which regenerating keeps as it is.

The page has a part per split (IID, then each Dirichlet alpha kept) and pairs runs by seed: a
cell's loss is clean - attacked on the same seed (same split, test images and initial weights),
in points; the "no attack" row is what a screening costs an honest run (clean without screening
minus clean with it), shown as the mean over the kept seeds with its 95%
Student t interval (``runner.results.stats.paired_difference``). The acceptance asks, for every
attack, a screening whose mean loss over at least ``SEEDS_NEEDED`` seeds is at most
``TOLERANCE``; with fewer seeds kept it is not decided. Kept runs of different settings (other
than the seed, attack and screening) are refused, naming both, not mixed into one page.
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
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.common import ndarrays_to_parameters  # noqa: E402
from flwr.server.client_manager import SimpleClientManager  # noqa: E402

from fl_app.common.screening_modes import SELECTION_MODES, allowed_modes, parse_pre  # noqa: E402
from fl_app.node.client_state import stateful  # noqa: E402
from fl_app.node.drift_client import DriftClient  # noqa: E402
from fl_app.node.node_client import NodeClient  # noqa: E402
from fl_app.registry import METHODS, validate_config  # noqa: E402
from fl_app.server.screening import min_replies, rows_left  # noqa: E402
from fl_app.server.server import DriftServer  # noqa: E402
from runner.inprocess import InProcessProxy  # noqa: E402
from runner.results.stats import Paired, paired_difference  # noqa: E402
from strategies.base import fedavg_kwargs  # noqa: E402
from tasks.datasets import input_shape  # noqa: E402
from tasks.models import build_model, get_weights, set_weights  # noqa: E402
from tasks.partitioning import PartitionSpec, load_partition, load_test_split  # noqa: E402
from tasks.train import evaluate  # noqa: E402

KEPT = ROOT / "docs" / "results" / "security"
PAGE = ROOT / "docs" / "security.md"
CLIENTS = 10
STRATEGIES = ("fedavg", "scaffold", "feddyn")  # the page's order: FedAvg, then two servers with state (c, h)
ATTACKS = {"scale-x10": "scale:{k}:10", "sign-flip": "flip:{k}", "adaptive": "adaptive:{k}",
           "alie": "alie:{k}", "ipm": "ipm:{k}", "mimic": "mimic:{k}", "label-flip": "label-flip:{k}",
           "gaussian": "gaussian:{k}"}  # name -> the inject-faults item of attacker k (--attacks picks)
DEFAULT_ATTACKS = ("scale-x10", "sign-flip", "adaptive")  # run without --attacks, always on the page
ATTACK_TEXT = {
    "scale-x10": "`scale-x10` multiplies each attacker's update by 10",
    "sign-flip": "`sign-flip` sends its negation",
    "adaptive": "`adaptive` sends its negation scaled to 0.9 x the screening bound (3 x its own update norm under "
                "`reject`, the clip bound under `clip`), so that it stays just inside the norm filter",
    "alie": "`alie` (Baruch et al. 2019) sends the honest updates' mean - z x their standard deviation per "
            "coordinate, z the paper's z_max for n and f (fl_app/server/omniscient.py)",
    "ipm": "`ipm` (Xie et al. 2020) sends -0.1 x the honest updates' mean",
    "mimic": "`mimic` (Karimireddy et al. 2022) sends the update of the honest client of lowest partition",
    "label-flip": "`label-flip` trains on the labels y -> 9 - y",
    "gaussian": "`gaussian` sends N(0, 1) coordinates",
}
CHAINS = ("nnm+trimmed-mean", "arc+nnm+trimmed-mean", "bucketing+median")
"""Pre-aggregation chains run as one defence, named 'step+...+rule' (``screen-pre`` = the steps,
``screening`` = the rule), as their papers pair them: NNM + coordinate-wise trimmed mean (Allouah
et al., AISTATS 2023), ARC + NNM + a robust rule (Allouah et al., ICLR 2025), bucketing (s = 2)
+ a robust rule (Karimireddy et al., ICLR 2022)."""
DEFENCE_ORDER = ("clip", "reject", "median", "trimmed-mean", "krum", "multi-krum", "bulyan", "geometric-median",
                 "centered-clip", *CHAINS)  # columns
RUN_ORDER = ("multi-krum", "trimmed-mean", "reject", "clip", "median", "krum", "bulyan", "geometric-median",
             "centered-clip", *CHAINS)  # likeliest first
TOLERANCE = 0.03  # the acceptance target: a mean loss of at most 3 points against the clean run
SEEDS_NEEDED = 3  # the acceptance is over the mean of (at least) this many seeds
SETTING = {"dataset": "mnist", "model": "cnn-small", "partitioner": "iid", "learning-rate": 0.05,
           "local-epochs": 1, "batch-size": 32, "seed": 0}  # "seed": the default, replaced per run
BUCKET = 2  # bucketing's s: the run config's default screen-bucket-size, which every run uses
HAND_WRITTEN = "<!-- hand-written below: scripts/security_table.py keeps this part of the page as it is -->"


class Everyone(SimpleClientManager):
    """Samples every registered client every round, in partition order."""

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(len(self.clients))]


def split_defence(name: str) -> tuple[str, str]:
    """A defence's (``screen-pre``, ``screening``): 'arc+nnm+trimmed-mean' -> ('arc+nnm',
    'trimmed-mean'); a plain rule 'krum' -> ('none', 'krum')."""
    pre, _, rule = name.rpartition("+")
    return pre or "none", rule


def applies(defence: str, attackers: int) -> bool:
    """Whether ``defence`` holds its guarantee with ``attackers`` of CLIENTS, all sampled: enough
    replies for its rule after its chain (``min_replies``), and, with bucketing (s =
    ``screen-bucket-size``'s default 2), fewer attacked buckets than half of them (each attacker
    spoils at most one bucket; the paper's s <= n / (2f) in another form): so Bulyan only where
    10 >= 4f + 3, bucketing+median only where f < ceil(10 / 2) / 2."""
    pre, rule = split_defence(defence)
    steps = parse_pre(pre)
    if CLIENTS < min_replies(rule, attackers, steps, BUCKET):
        return False
    return "bucketing" not in steps or 2 * attackers < rows_left(CLIENTS, steps, attackers, BUCKET)


def defences(strategy: str, attackers: int) -> list[str]:
    """The defences of ``strategy`` that apply with ``attackers`` of CLIENTS, in table order: its
    screenings, and the chains where it allows their rule and ``screen-pre`` (``check_pre``: a
    strategy without ``median``, e.g. SCAFFOLD, takes none)."""
    strategy_cls = METHODS[strategy].strategy
    modes = allowed_modes(strategy_cls)
    chains_ok = "median" in getattr(strategy_cls, "SCREENING", ("clip", "reject"))
    return [d for d in DEFENCE_ORDER if split_defence(d)[1] in modes and (chains_ok or "+" not in d)
            and applies(d, attackers)]


def cells(strategy: str, attackers: int, attacks=DEFAULT_ATTACKS) -> list[tuple[str, str]]:
    """Every (attack, screening) run of one table, in the order they are run: clean, each attack
    of ``attacks`` undefended, then defence by defence (``RUN_ORDER``), so a table cut short by
    time still has whole columns."""
    out = [("clean", "none")] + [(attack, "none") for attack in attacks]
    mine = defences(strategy, attackers)
    for d in sorted(mine, key=lambda m: RUN_ORDER.index(m)):
        out += [("clean", d)] + [(attack, d) for attack in attacks]
    return out


def shown_attacks(records: list[dict]) -> list[str]:
    """The attacks a page (or one table) shows, in ``ATTACKS`` order: the default ones and any
    other with a kept run."""
    kept = {r["attack"] for r in records}
    return [a for a in ATTACKS if a in DEFAULT_ATTACKS or a in kept]


def split_name(partitioner: str, alpha: float) -> str:
    """'iid', or 'dirichlet-0.3': the name of a split's part of the page and of its kept folder."""
    return "iid" if partitioner == "iid" else f"{partitioner}-{alpha:g}"


def kept_folder(partitioner: str, alpha: float) -> Path:
    """Where one split's runs are kept: ``KEPT`` for IID clients (where they always were), a
    folder per other split inside it."""
    return split_folder(split_name(partitioner, alpha))


def split_folder(name: str) -> Path:
    """The kept folder of the split named ``name`` (``split_name``)."""
    return KEPT if name == "iid" else KEPT / name


def run_name(strategy: str, attackers: int, attack: str, screening: str, seed: int) -> str:
    return f"{strategy}-f{attackers}-{attack}-{screening}-s{seed}"


def run_config(strategy: str, attackers: int, attack: str, screening: str, seed: int, args) -> dict:
    """The validated run config of one run; ``screening`` is a defence name (``split_defence``)."""
    faults = ",".join(ATTACKS[attack].format(k=k) for k in range(attackers)) if attack != "clean" else ""
    pre, rule = split_defence(screening)
    return validate_config({
        **SETTING, "partitioner": args.partitioner, "alpha": args.alpha, "seed": seed, "strategy": strategy, "data-dir": args.data_dir, "num-server-rounds": args.rounds,
        "fraction-fit": 1.0, "min-fit-clients": CLIENTS, "min-available-clients": CLIENTS,
        "inject-faults": faults, "screening": rule, "screen-pre": pre, "screen-attackers": attackers,
        "min-fit-fraction": 0.0,  # a wrecked model's clients may all send NaN: the run goes on
        "checkpoint-every": 0, "tensorboard": False,
    })


def defence_keys(cfg: dict) -> tuple[str, ...]:
    """The run-config keys a run's defence reads beyond ``screening`` and ``screen-attackers``,
    kept in its record (only where they apply, so that records of the other defences, kept before
    these keys existed, stay as they were): the chain and bucketing's s, centered-clip's tau and
    iterations."""
    pre = parse_pre(cfg["screen-pre"])
    return ((("screen-pre",) if pre else ()) + (("screen-bucket-size",) if "bucketing" in pre else ())
            + (("screen-cc-tau", "screen-cc-iters") if cfg["screening"] == "centered-clip" else ()))


def load_data(args, seed: int):
    """Each client's first ``--per-client`` images of the seed's split (IID, or Dirichlet over the
    labels: the partitioner shuffles each client's rows, so its first images keep its label mix),
    and the first ``--test`` images of the test split as the seed shuffles it."""
    spec = PartitionSpec("mnist", CLIENTS, partitioner=args.partitioner, alpha=args.alpha, data_dir=args.data_dir,
                         seed=seed)
    parts = [tuple(t[: args.per_client] for t in load_partition(spec, k)) for k in range(CLIENTS)]
    x, y = load_test_split("mnist", args.data_dir, seed)
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
    manager = Everyone()
    for k in range(CLIENTS):
        context = Context(run_id=0, node_id=k, node_config={}, state=RecordDict(), run_config={})
        client = DriftClient(method.update, cfg, context, partition_id=k, num_partitions=CLIENTS)
        client._data = parts[k]
        manager.register(InProcessProxy(str(k), NodeClient(client)))
    with tempfile.TemporaryDirectory(prefix="fl-drift-security-") as run_dir:  # the server's files: not kept
        server = DriftServer(client_manager=manager, strategy=inner, cfg=cfg, method_class=method.strategy,
                             run_dir=Path(run_dir))
        server.set_max_workers(1)  # the clients one after the other, in partition order, as before
        server.fit(cfg["num-server-rounds"], timeout=None)
        rows = server.record.rows
    return {"accuracy": [r["test_accuracy"] for r in rows],
            "num_rejected": [r["num_rejected"] for r in rows],
            "seconds": round(time.monotonic() - started, 1)}


def run_table(strategy: str, attackers: int, seed: int, args, data) -> None:
    """Runs (and keeps) every cell of one table and seed not kept yet; with ``--shard i/n`` only
    the cells whose position in ``cells`` is i modulo n (for n processes side by side); with
    ``--screenings`` only those screenings (and the clean run); with ``--redo-before-rollback``
    the kept runs marked ‡ (``made_before_rollback``) run again and replace theirs."""
    folder = kept_folder(args.partitioner, args.alpha)
    folder.mkdir(parents=True, exist_ok=True)
    part, parts = args.shard
    for position, (attack, screening) in enumerate(cells(strategy, attackers, args.attacks)):
        if position % parts != part:
            continue
        if args.screenings and attack != "clean" and screening not in args.screenings:
            continue
        path = folder / f"{run_name(strategy, attackers, attack, screening, seed)}.json"
        if path.exists() and not (args.redo_before_rollback and made_before_rollback(
                [json.loads(path.read_text())], strategy, screening)):
            continue
        cfg = run_config(strategy, attackers, attack, screening, seed, args)
        result = one_run(cfg, *data)
        keys = (*SETTING, *(("alpha",) if args.partitioner != "iid" else ()),  # IID records as before
                "num-server-rounds", "inject-faults", "screening", "screen-attackers", *defence_keys(cfg))
        setting = {k: cfg[k] for k in keys}
        record = {"strategy": strategy, "attackers": attackers, "attack": attack, "screening": screening,
                  "clients": CLIENTS, "per_client": args.per_client, "test_images": args.test,
                  "setting": setting, ROLLED_BACK: True, **result}
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{path.name}: final {result['accuracy'][-1]:.4f} in {result['seconds']} s", flush=True)


# ------------------------------------------------------------------ the page, from the kept runs
NAMES = {"fedavg": "FedAvg", "scaffold": "SCAFFOLD", "feddyn": "FedDyn"}
PER_RUN = ("seed", "inject-faults", "screening", "screen-attackers", "screen-pre", "screen-bucket-size",
           "screen-cc-tau", "screen-cc-iters")  # what differs between the runs of one page (defence_keys)


def load_kept(folder: Path) -> list[dict]:
    """Every kept run: IID ones in ``folder``, other splits' in its sub-folders."""
    paths = sorted(folder.glob("*.json")) + sorted(folder.glob("*/*.json"))
    return [json.loads(p.read_text()) for p in paths]


def split_of(record: dict) -> str:
    """The split a kept run was made on ('iid' for runs kept before splits were recorded)."""
    setting = record["setting"]
    return split_name(setting.get("partitioner", "iid"), setting.get("alpha", 0.0))


def split_title(name: str) -> str:
    if name == "iid":
        return "IID clients"
    partitioner, _, alpha = name.partition("-")
    return f"{partitioner.capitalize()}({alpha}) clients"


def seed_of(record: dict) -> int:
    return record["setting"]["seed"]


def common_setting(record: dict) -> dict:
    """What every run of one page must share: the setting without ``PER_RUN``, and the sizes."""
    return {"clients": record["clients"], "per_client": record["per_client"], "test_images": record["test_images"],
            **{k: v for k, v in record["setting"].items() if k not in PER_RUN}}


def check_one_setting(records: list[dict]) -> None:
    """Refuse kept runs made in two settings (ValueError naming one run of each and the keys that
    differ): a paired loss between them would compare different experiments."""
    first = records[0]
    for r in records[1:]:
        a, b = common_setting(first), common_setting(r)
        if a != b:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise ValueError(
                f"kept runs of two settings: {describe(first)} and {describe(r)} differ in "
                + ", ".join(f"{k} ({a.get(k)!r} vs {b.get(k)!r})" for k in keys)
                + f"; move one setting's runs out of {split_folder(split_of(first)).relative_to(ROOT)}")


def describe(r: dict) -> str:
    return run_name(r["strategy"], r["attackers"], r["attack"], r["screening"], seed_of(r))


def finals(records: list[dict], attack: str, screening: str) -> dict[int, float]:
    """Final test accuracy by seed of the kept runs of one cell."""
    return {seed_of(r): r["accuracy"][-1] for r in records if r["attack"] == attack and r["screening"] == screening}


def loss(records: list[dict], attack: str, screening: str) -> Paired:
    """Accuracy lost to the attack under ``screening``: clean - attacked, paired by seed."""
    return paired_difference(finals(records, "clean", "none"), finals(records, attack, screening))


def points(p: Paired) -> str:
    """'0.7 [-0.3, 1.7]' in points (n >= 2), '0.7 (1 seed)' (n = 1), '' (n = 0)."""
    if p.n == 0:
        return ""
    if p.n == 1:
        return f"{one(p.mean)} (1 seed)"
    return f"{one(p.mean)} [{one(p.low)}, {one(p.high)}]"


def one(fraction: float) -> str:
    """A fraction in points with one decimal; a value that rounds to zero reads '0.0', not '-0.0'."""
    text = f"{fraction * 100:.1f}"
    return "0.0" if text == "-0.0" else text


ROLLED_BACK = "client_rollback"  # in a record: its code took a left-out client's state back (fl_app/server/counted.py)
DROPS = ("reject", *SELECTION_MODES)  # the rules that leave whole replies out


def made_before_rollback(records: list[dict], strategy: str, screening: str) -> int:
    """How many kept runs of one column were made before a client whose reply was left out went
    back to its state from before that round: a stateful method's (SCAFFOLD's c_i) under a rule
    that drops replies, whose record lacks ``ROLLED_BACK``. Their left-out clients kept the move of
    the dropped round, which the server's state never took; today's code would give other numbers."""
    if screening not in DROPS or not stateful(METHODS[strategy].update):
        return 0
    return sum(1 for r in records if r["screening"] == screening and not r.get(ROLLED_BACK))


def table_lines(records: list[dict], strategy: str, attackers: int) -> list[str]:
    """The loss table of one (strategy, f): a row per attack, a column per screening; a cell with
    fewer seeds than the clean run says how many it has; a column of runs made before the
    rollback (``made_before_rollback``) is marked ‡ and said so under the table."""
    columns = ["none"] + shown_defences(records, strategy, attackers)
    clean = finals(records, "clean", "none")
    stale = {c: made_before_rollback(records, strategy, c) for c in columns[1:]}
    lines = ["| attack | " + " | ".join("no screening" if c == "none" else c + (" ‡" if stale[c] else "")
                                       for c in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    accuracy = sum(clean.values()) / len(clean)
    lines.append(f"| clean (accuracy) | {accuracy:.3f} over seeds {', '.join(map(str, sorted(clean)))} |"
                 + " |" * (len(columns) - 1))
    cost = [points(loss(records, "clean", c)) for c in columns[1:]]
    if any(cost):
        lines.append("| no attack (the screening's cost) | | " + " | ".join(cost) + " |")
    for attack in shown_attacks(records):
        values = []
        for c in columns:
            p = loss(records, attack, c)
            values.append(points(p) + (f" (n = {p.n})" if 1 < p.n < len(clean) else ""))
        lines.append(f"| {attack} | " + " | ".join(values) + " |")
    attacks = shown_attacks(records)
    worst = []
    for c in columns:
        attack, p = worst_case(records, c, attacks)
        kept = sum(loss(records, a, c).n > 0 for a in attacks)
        part = f"; {kept} of {len(attacks)} attacks" if kept < len(attacks) else ""
        worst.append(f"{points(p)} ({attack}{part})" if attack else "")
    lines.append("| **worst case** (attack) | " + " | ".join(worst) + " |")
    if any(stale.values()):
        marked = ", ".join(f"{c} ({n} runs)" for c, n in stale.items() if n)
        lines += ["", f"‡ {marked}: made before a client whose reply the rule left out went back to its state "
                  "from before that round (it kept the move of the dropped round, which the server's state never "
                  "took); they stand until they are re-run."]
    return lines


def shown_defences(records: list[dict], strategy: str, attackers: int) -> list[str]:
    """The columns of one table after 'no screening': the defences that apply (``defences``) and
    have a kept run in ``records``, in table order."""
    kept = {r["screening"] for r in records}
    return [d for d in defences(strategy, attackers) if d in kept]


def worst_case(records: list[dict], defence: str, attacks: list[str]):
    """(attack, its Paired loss) of the largest mean loss under ``defence`` among ``attacks``
    with a paired run kept (the first in ``attacks`` order on a tie); (None, None) with none."""
    kept = [(a, p) for a in attacks if (p := loss(records, a, defence)).n > 0]
    if not kept:
        return None, None
    return max(kept, key=lambda item: item[1].mean)  # max keeps the first of equal means


def best_worst_case(records: list[dict], strategy: str, attackers: int):
    """(defence, attack, Paired) of the smallest worst-case loss (``worst_case``) among the
    defences kept for every shown attack on at least ``SEEDS_NEEDED`` seeds (the first in
    table order on a tie), and the defences shown that are left out for fewer attacks or seeds;
    (None, None, None) as the first three when no defence is complete."""
    attacks = shown_attacks(records)
    shown = shown_defences(records, strategy, attackers)
    complete = [d for d in shown if all(loss(records, a, d).n >= SEEDS_NEEDED for a in attacks)]
    left_out = [d for d in shown if d not in complete]
    if not complete:
        return None, None, None, left_out
    worst = {d: worst_case(records, d, attacks) for d in complete}
    best = min(complete, key=lambda d: worst[d][1].mean)  # min keeps the first of equal means
    return best, *worst[best], left_out


def worst_case_line(records: list[dict], strategy: str, attackers: int) -> str:
    """The text naming the defence of smallest worst-case loss, its cost without attack, and
    whether it holds every attack within ``TOLERANCE`` (by the mean), saying so plainly when not."""
    attacks = shown_attacks(records)
    best, attack, p, left_out = best_worst_case(records, strategy, attackers)
    bar = f"{TOLERANCE * 100:.0f} points"
    over = f"over the {len(attacks)} attacks shown, each on at least {SEEDS_NEEDED} seeds"
    out = f" (left out, fewer attacks or seeds kept: {', '.join(left_out)})" if left_out else ""
    if best is None:
        return (f"- Worst case: no defence is kept yet for all {len(attacks)} attacks shown on at least "
                f"{SEEDS_NEEDED} seeds each{out}.")
    cost = loss(records, "clean", best)
    costs = f"it costs {points(cost)} points without attack" if cost.n else "its cost without attack is not kept"
    said = (f"it holds every attack within {bar} by the mean" if p.mean <= TOLERANCE + 1e-12 else
            f"**no defence holds every attack within {bar}**")
    return (f"- Worst case {over}: the smallest is `{best}`'s, {points(p)} points against {attack}; {costs}; "
            f"{said}{out}.")


def best_screening(records: list[dict], strategy: str, attackers: int, attack: str):
    """(screening, its Paired loss, status) for one attack. The best is the smallest mean loss among
    the screenings kept for at least ``SEEDS_NEEDED`` seeds; status is 'within' when that is at most
    ``TOLERANCE``, 'NOT within' when it is not and every screening has its seeds, else 'not decided'
    (then the best shown is the best so far, over fewer seeds)."""
    losses = {d: loss(records, attack, d) for d in defences(strategy, attackers)}
    losses = {d: p for d, p in losses.items() if p.n > 0}
    if not losses:
        return None, None, "not decided"
    complete = {d: p for d, p in losses.items() if p.n >= SEEDS_NEEDED}
    pool = complete or losses
    best = min(pool, key=lambda d: pool[d].mean)
    if complete and complete[best].mean <= TOLERANCE + 1e-12:
        return best, pool[best], "within"
    if len(complete) == len(defences(strategy, attackers)):
        return best, pool[best], "NOT within"
    return best, pool[best], "not decided"


def verdict_lines(records: list[dict], strategy: str, attackers: int, iid: bool = True) -> list[str]:
    """Per attack the best screening and its loss; per screening the attacks it fails (mean
    loss over its kept seeds above the tolerance); the acceptance over all attacks."""
    lines, statuses = [], []
    bar = f"{TOLERANCE * 100:.0f} points"
    for attack in shown_attacks(records):
        best, p, status = best_screening(records, strategy, attackers, attack)
        statuses.append(status)
        if best is None:
            lines.append(f"- {attack}: no screened run kept yet")
            continue
        accuracy = finals(records, attack, best)
        mean_accuracy = sum(accuracy.values()) / len(accuracy)
        seeds = f"{p.n} seed{'s' if p.n > 1 else ''}"
        interval = f" [{p.low * 100:.1f}, {p.high * 100:.1f}]" if p.n > 1 else ""
        lead = "best screening" if status != "not decided" else "best so far"
        short = [d for d in defences(strategy, attackers) if loss(records, attack, d).n < SEEDS_NEEDED]
        why = f" (fewer than {SEEDS_NEEDED} seeds kept for {', '.join(short)})" if status == "not decided" else ""
        above = (f"; the interval's upper end {p.high * 100:.1f} is above {bar}, so the bar is met by the mean, "
                 "not shown at 95%") if status == "within" and p.n > 1 and p.high > TOLERANCE + 1e-12 else ""
        lines.append(f"- {attack}: {lead} `{best}`, loss {p.mean * 100:.1f} points{interval} over {seeds}, "
                     f"mean accuracy {mean_accuracy:.3f}: {status}{'' if status == 'not decided' else ' ' + bar}{why}"
                     f"{above}")
    lines.append("")
    for d in defences(strategy, attackers):
        kept = {a: p for a in shown_attacks(records) if (p := loss(records, a, d)).n > 0}
        cost = loss(records, "clean", d)
        if not kept and not cost.n:
            continue
        fails = [f"{a} ({p.mean * 100:.1f} points)" for a, p in kept.items() if p.mean > TOLERANCE + 1e-12]
        holds = [a for a, p in kept.items() if p.mean <= TOLERANCE + 1e-12]
        costs = f"costs {points(cost)} points without attack; " if cost.n else ""
        lines.append(f"- `{d}` {costs}fails against: {', '.join(fails) or 'none'}; holds against: "
                     f"{', '.join(holds) or 'none'}")
    lines += ["", worst_case_line(records, strategy, attackers)]
    verdict = ("NOT met" if "NOT within" in statuses else
               "met" if all(s == "within" for s in statuses) else "not decided (runs missing)")
    lead = "Acceptance" if iid else "The IID acceptance bar applied to these clients"
    lines += ["", f"{lead} (every attack: some screening's mean loss over at least {SEEDS_NEEDED} seeds "
              f"at most {bar}): **{verdict}**."]
    return lines


def section(records: list[dict], strategy: str, attackers: int, iid: bool = True) -> list[str]:
    mine = [r for r in records if r["strategy"] == strategy and r["attackers"] == attackers]
    lines = [f"### {NAMES[strategy]}, f = {attackers} of {CLIENTS}", ""]
    if not finals(mine, "clean", "none"):
        return lines + ["The clean run is not kept yet: no loss to show.", ""]
    lines += table_lines(mine, strategy, attackers) + [""]
    seeds = sorted({seed_of(r) for r in mine})
    shown = shown_defences(mine, strategy, attackers)
    wanted = (1 + len(shown_attacks(mine))) * (1 + len(shown)) * len(seeds)  # the cells of ``cells``
    kept = sum(r["screening"] in ("none", *shown) for r in mine)
    if kept < wanted:
        lines += [f"{wanted - kept} of {wanted} runs (every cell shown, on seeds {', '.join(map(str, seeds))}) "
                  "are not kept yet.", ""]
    unrun = [d for d in defences(strategy, attackers) if d not in shown]
    if unrun:
        lines += [f"Not run for this table (no kept run): {', '.join(f'`{d}`' for d in unrun)}.", ""]
    lines += verdict_lines(mine, strategy, attackers, iid) + [""]
    return lines


def render_page(records: list[dict], hand_written: str = "") -> str:
    """docs/security.md: the setting, then per (method, f) the loss table and its verdicts, then
    ``hand_written`` (the page's text from ``HAND_WRITTEN`` on, kept as it is)."""
    lines = [f"# Security table: model poisoning against {page_methods(records)}", "",
             "Generated by `scripts/security_table.py` from the runs kept in `docs/results/security/`; "
             "do not edit by hand above the marker at the end (text below it is kept as it is).", ""]
    if not records:
        lines.append("No runs are kept yet.")
    else:
        lines += [*about(shown_attacks(records)), ""]
        splits = sorted({split_of(r) for r in records}, key=lambda name: (name != "iid", name))
        for name in splits:
            lines += split_part([r for r in records if split_of(r) == name], name)
    lines.append(HAND_WRITTEN)
    text = "\n".join(lines) + "\n"
    return text + hand_written.lstrip("\n") if hand_written.strip() else text


def page_methods(records: list[dict]) -> str:
    """'FedAvg and SCAFFOLD': the methods with a kept run, in ``STRATEGIES`` order (all of them
    before any run is kept), so the title names only what the page shows."""
    kept = {r["strategy"] for r in records}
    names = [NAMES[s] for s in STRATEGIES if s in kept or not kept]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def split_part(records: list[dict], name: str) -> list[str]:
    """One split's part of the page: its setting, then per (f, method) the table and verdicts."""
    check_one_setting(records)
    r0 = records[0]
    setting = ", ".join(f"{k} = {v}" for k, v in r0["setting"].items() if k not in PER_RUN)
    seeds = sorted({seed_of(r) for r in records})
    seconds = sum(r["seconds"] for r in records)
    how = ("IID" if name == "iid" else f"{split_title(name).removesuffix(' clients')} over the labels: the "
           "partitioner shuffles each client's rows, so its first images keep its label mix")
    lines = [f"## {split_title(name)}", "",
             f"Setting: {r0['clients']} clients, all sampled every round, {r0['per_client']} training images "
             f"each ({how}), test accuracy on {r0['test_images']} MNIST test images after the last round; "
             f"{setting}. Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: the seed sets the "
             "split, the test images drawn, the initial weights and the batch order; the attackers are partitions "
             f"0 .. f-1. {len(records)} runs, {seconds / 60:.0f} minutes in all on a shared 2-core CPU machine.", ""]
    for attackers in sorted({r["attackers"] for r in records}, reverse=True):
        for strategy in STRATEGIES:
            if any(r["strategy"] == strategy and r["attackers"] == attackers for r in records):
                lines += section(records, strategy, attackers, iid=name == "iid")
    return lines


def hand_written_part(page: str) -> str:
    """The text after ``HAND_WRITTEN`` in an existing page ('' without the marker)."""
    _, marker, rest = page.partition(HAND_WRITTEN)
    return rest if marker else ""


ABOUT = [
    "Each cell is the accuracy the attack costs, in points: clean minus attacked final accuracy on the same "
    "seed, as the mean over the kept seeds and its 95% Student t interval over them "
    "(`runner/results/stats.py`); a negative loss is a gain. The acceptance asks, for each attack, a screening "
    f"whose mean loss over at least {SEEDS_NEEDED} seeds is at most {TOLERANCE * 100:.0f} points.",
    "",
    "{attacks}",
    "",
    "Defences (`screening`, fl_app/server/screening.py, with `screen-attackers` = f): `clip` and `reject` are "
    "norm filters (bound: 1 x, resp. 3 x the round's median update norm): by their documented rule they "
    "stop updates that are too large, not updates that point the wrong way at an ordinary norm, so a "
    "sign flip at an honest norm or the adaptive attacker passes them. `median`, `trimmed-mean` (f cut "
    "at each end), `krum`, `multi-krum` (n - f kept) and `bulyan` (only where n >= 4f + 3) judge the "
    "updates against each other, as do `geometric-median` (smoothed Weiszfeld, RFA) and `centered-clip` "
    "(3 iterations from the zero update, tau the round's median update norm). A name `step+...+rule` is a "
    "pre-aggregation chain (`screen-pre` = the steps, `screening` = the rule, fl_app/server/robust_rules.py) "
    "in the pairings its papers recommend: `nnm+trimmed-mean` (NNM, Allouah et al. AISTATS 2023, shown there "
    "with the coordinate-wise trimmed mean), `arc+nnm+trimmed-mean` (ARC, Allouah et al. ICLR 2025, clips "
    "before NNM and a robust rule) and `bucketing+median` (Karimireddy et al. ICLR 2022, s = 2); bucketing "
    "only where the f spoilt buckets are fewer than half of the ceil(n / s) (at f = 3 of 10 they are 3 of 5, "
    "past the median's breakdown, so it is not run there). SCAFFOLD allows only the rules that keep or drop "
    "whole replies (clip, reject, krum, multi-krum) and no chain: a robust value of the weights alone would "
    "leave its control variate open to the attackers.",
    "",
    "The **worst case** row is, per defence, the largest mean loss over the attacks kept for it (with that "
    "cell's interval and the attack; 'k of K attacks' where some are not kept), and the line after the "
    "verdicts names the defence with the smallest worst case among those kept for every attack shown on at "
    f"least {SEEDS_NEEDED} seeds, its cost without attack, and whether it stays within {TOLERANCE * 100:.0f} "
    "points.",
    "",
    "What this rests on: the attackers poison the model update only (SCAFFOLD's delta c_i is sent as "
    "computed); the server is told the true f (`screen-attackers`); every client is sampled every round. With "
    "IID clients honest updates resemble each other, which is what the rules that judge updates against each "
    "other assume; with label-skewed (Dirichlet) clients they do not, and the second part measures what the "
    "screening buys, and costs without attack, there. The acceptance bar is the IID promise; the Dirichlet part "
    "is measured against the same bar so the gap is visible. Who can reach a deployment at all, and "
    "what that rests on, is [Deploy on real devices](deployment.md)'s subject.",
]


def about(attacks: list[str]) -> list[str]:
    """``ABOUT`` with the paragraph on ``attacks``."""
    text = "Attacks (`inject-faults`, fl_app/node/attacks.py): " + "; ".join(ATTACK_TEXT[a] for a in attacks) + "."
    return [text if line == "{attacks}" else line for line in ABOUT]


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
    parser.add_argument("--partitioner", choices=("iid", "dirichlet"), default="iid",
                        help="the clients' split: IID, or Dirichlet(--alpha) over the labels")
    parser.add_argument("--alpha", type=float, default=0.3, help="the Dirichlet concentration (with dirichlet)")
    parser.add_argument("--test", type=int, default=2000, help="test images")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--shard", type=shard, default=(0, 1), help="i/n: run every n-th cell from the i-th")
    parser.add_argument("--seeds", type=int, nargs="+", default=[SETTING["seed"]],
                        help="seeds, run one after the other (each seed's whole table before the next)")
    parser.add_argument("--screenings", nargs="+", choices=("none", *DEFENCE_ORDER), default=None,
                        help="run only these screenings (and the clean run); default: every one that applies")
    parser.add_argument("--attacks", nargs="+", choices=tuple(ATTACKS), default=list(DEFAULT_ATTACKS),
                        help="the attacks to run (default: the first three); each is run on partitions 0 .. f-1")
    parser.add_argument("--render", action="store_true", help="only write the page from the kept runs")
    parser.add_argument("--redo-before-rollback", action="store_true",
                        help="run again (and replace) the kept runs marked ‡: made before a left-out client's "
                             "state went back")
    args = parser.parse_args(argv)
    for f in args.attackers:
        if not 1 <= f < CLIENTS / 2:
            parser.error(f"--attackers {f} is invalid: f must be in [1, {CLIENTS // 2 - 1}] for {CLIENTS} clients")
    if not args.alpha > 0:
        parser.error(f"--alpha {args.alpha} is invalid: the Dirichlet concentration must be > 0")
    for seed in args.seeds:
        if seed < 0:
            parser.error(f"--seeds {seed} is invalid: a seed must be >= 0")
    if not args.render:
        torch.set_num_threads(args.threads)
        for seed in args.seeds:
            data = load_data(args, seed)
            for f in args.attackers:
                for strategy in args.strategies:
                    run_table(strategy, f, seed, args, data)
    try:
        page = render_page(load_kept(KEPT), hand_written_part(PAGE.read_text() if PAGE.exists() else ""))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
