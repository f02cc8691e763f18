"""Compare methods on the same split, model and budget with Flower's simulation (`flwr run`).

Example:
    FL_DATA_DIR=/path/to/data python run_simulation.py --strategy fedavg,fedprox \\
        --dataset mnist --rounds 3 --clients 20 --fraction 0.25 --seeds 0 1

Every (strategy, seed) is one `flwr run` on a private local SuperLink (started here, stopped
at exit). Results: <out>/runs/<label>-seed<seed>/{metrics.csv,summary.json}, and in <out>:
comparison.csv, comparison.md, accuracy.png (accuracy and loss; and roughness.png when ri-fedavg ran).

`--config FILE` reads an experiment file (TOML, see experiments/): its `strategies`, `seeds`,
`clients`, `[run-config]` (keys for every run), `[methods.<label>]` (keys for one row; with
`strategy = "<method>"` a label is a variant, so one method can be listed twice with different
settings) and `[grid]` / `[methods.<label>.grid]` (KEY = [values]: one row per value, labelled
`<label>[KEY=value]`). Flags given on the command line (`--set` included) override the file.
Output defaults to results/experiments/<name>.

`--grid KEY=V1,V2` (repeatable) runs every method once per value (the product over several
`--grid` keys), each a labelled row in comparison.md/.csv and the plots.

An experiment file's `[tune]` table (the tuning protocol, docs/experiments.md; `--tune` asks for
it explicitly, `--no-tune` skips it) first searches each row's grid on a validation split held out
of the training data, in <out>/tuning, writes the choice and every point's numbers to
<out>/tuning.json, then runs the table with the chosen values (runner/tuning.py).

`--list [methods|models|datasets|keys]` prints what can be chosen; `--check` validates every
run (config, data, federation size) and exits without launching anything.
An output folder's finished runs are never re-run: re-running the same command continues.

`--resume DIR` continues an interrupted comparison in DIR with the arguments it was started
with (saved in DIR/runner.json): finished runs are kept, unfinished ones continue from their
last checkpoint (run-config `resume = true`), missing ones start. Beside it only `--quiet`,
`--check`, `--parallel` and `--verbose` are taken; a flag that would change the runs is refused.
"""

# This module's docstring is the runner's usage: ``run_simulation.py --help`` prints it.

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fl_app.api import resolve_data_dir
from fl_app.config import ConfigError
from fl_app.registry import DEFAULT_METHOD, method_names
from fl_app.registry import spec as config_keys
from runner.experiment import read_experiment
from runner.listing import WHAT as LISTINGS
from runner.plan import check_distinct


def build_parser() -> argparse.ArgumentParser:
    """The runner's arguments; ``--help`` shows this module's docstring, every default, and the
    methods, models and datasets to choose from."""
    from fl_app.config import DATASETS, GENERAL_KEYS, MODELS

    d = {k: GENERAL_KEYS[k].default for k in GENERAL_KEYS}
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"methods: {', '.join(method_names())}\nmodels: {', '.join(MODELS)}\n"
                                       f"datasets: {', '.join(DATASETS)}\nevery key with its default and range:"
                                       " run_simulation.py --list keys")
    p.add_argument("--config",
                   help="experiment file (TOML): strategies, seeds, clients, run-config, per-method keys, grid")
    p.add_argument("--strategy", help=f"method name or comma list (--list methods) (default: {DEFAULT_METHOD})")
    p.add_argument("--dataset", help=f"{', '.join(DATASETS)} (default: {d['dataset']})")
    p.add_argument("--rounds", type=int, help=f"num-server-rounds (default: {d['num-server-rounds']})")
    p.add_argument("--clients", type=int, help="number of simulated SuperNodes (partitions) (default: 10)")
    p.add_argument("--fraction", type=float,
                   help=f"fraction-fit: share of clients sampled per round (default: {d['fraction-fit']})")
    p.add_argument("--alpha", type=float, help=f"Dirichlet concentration (default: {d['alpha']})")
    p.add_argument("--seeds", type=int, nargs="+", help="one or more seeds (default: 0)")
    p.add_argument("--data-dir",
                   help="folder with <dataset>/{train,test}.parquet (default: $FL_DATA_DIR, else the hub)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any run-config key (repeatable; --list keys); wins over the experiment file")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="one labelled row per value, e.g. learning-rate=0.01,0.05 (repeatable: the product)")
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                   help="run the experiment file's [tune] search first and the table with its choice (the default"
                        " when the file has a [tune] table); --no-tune runs the file's values, untuned")
    p.add_argument("--out", help="output folder (default: results/compare-<time>)")
    p.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per simulated client (default: 1)")
    p.add_argument("--gpus-per-client", type=float, default=None,
                   help="Ray GPUs per client (default: 0, or 1/clients-in-parallel when CUDA is present)")
    p.add_argument("--ray-address", help="run on this running Ray cluster (head host:port; README: 'On a Ray"
                   " cluster') instead of a private Ray on this machine")
    p.add_argument("--parallel", type=int, metavar="N",
                   help="runs at a time, each on its own private SuperLink and Ray with 1/N of the machine (default:"
                        " as many as the cores, GPUs and memory hold, 1 on a machine under 8 cores; docs/running.md)")
    p.add_argument("--quiet", action="store_true", help="print only the per-round progress lines")
    p.add_argument("--verbose", action="store_true",
                   help="also print Flower's, Ray's and MLflow's own log lines and the libraries' deprecation warnings")
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted comparison in DIR")
    p.add_argument("--list", nargs="?", const="all", choices=("all", *LISTINGS),
                   help="print methods (one line each), models, datasets, partitioners, run-config keys (default,"
                        " range); exit")
    p.add_argument("--check", action="store_true", help="validate every run (config, data, nodes) and exit")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments of ``argv`` (``--list``: as given). With ``--resume DIR``, those saved in
    DIR/runner.json, with ``--quiet``, ``--check`` and ``--parallel`` as given now; else with
    the ``$FL_DATA_DIR`` and working directory of this shell recorded. Then filled in from the
    experiment file and the defaults (``resolve_experiment``); a refused value exits 2."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.resume:
        check_resume_flags(args, p)
        args = argparse.Namespace(**{"grid": [], "verbose": False, "list": None, "tune": None, "parallel": None,
                                     "env_data_dir": None, "cwd": None, **read_runner_record(args.resume, p),
                                     "resume": args.resume, "out": args.resume, "quiet": args.quiet,
                                     "check": args.check, **({"verbose": True} if args.verbose else {}),
                                     **({"parallel": args.parallel} if args.parallel is not None else {})})
    else:
        args.env_data_dir = resolve_data_dir("")  # recorded in runner.json: a new shell may differ
        args.cwd = os.getcwd()  # relative data-dir values resolve against it, on --resume too
    return resolve_experiment(args, p)


RESUME_FLAGS = ("resume", "quiet", "check", "parallel", "verbose")  # what --resume reads now; the rest is runner.json's


def check_resume_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse ``--resume DIR`` given with a flag that would change the runs (``--rounds``,
    ``--set``, ``--strategy``, ``--seeds``, ...): a resume continues the comparison saved in
    DIR/runner.json as it was started, so such a flag could only be dropped (it was, silently:
    ``--resume DIR --rounds 5`` said "finished, kept" and ran no round). Only ``--quiet``,
    ``--check``, ``--parallel`` and ``--verbose``, which change how it runs, are taken."""
    given = [f"--{'set' if dest == 'overrides' else dest.replace('_', '-')}" for dest, value in vars(args).items()
             if dest not in RESUME_FLAGS and value != parser.get_default(dest)]
    if given:
        refuse(parser, f"--resume {args.resume} with {', '.join(given)} is invalid: a resume continues the comparison"
                       f" with the arguments saved in {Path(args.resume) / 'runner.json'}, so these would be ignored;"
                       " to change the runs start a new comparison (its command with the new flags and another"
                       " --out); --resume takes only --quiet, --check, --parallel and --verbose")


def refuse(parser: argparse.ArgumentParser, message: str) -> None:
    """Exit 2 with ``error: <message>`` as the one line on stderr: a value the parser read but
    this runner refuses (an experiment file, a runner.json, the seeds) is named alone, without
    argparse's usage block, like every other refusal before launch."""
    parser.exit(2, f"error: {message}\n")


RECORD_TYPES = {"strategy": str, "seeds": list, "clients": int, "overrides": list}  # what a resume needs


def read_runner_record(folder: str, parser: argparse.ArgumentParser) -> dict:
    """``<folder>/runner.json`` as saved by ``runner_record``; a missing, unreadable or altered
    one is a one-line parser error naming the file."""
    saved = Path(folder) / "runner.json"
    if not saved.exists():
        refuse(parser, f"--resume {folder}: no runner.json there (not a run_simulation.py output folder)")
    try:
        record = json.loads(saved.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        refuse(parser, f"--resume {folder}: {saved} is not readable JSON ({exc}); it is written by"
                       " run_simulation.py: start the comparison again with its command and --out")
    for key, kind in RECORD_TYPES.items():
        if not isinstance(record, dict) or not isinstance(record.get(key), kind):
            refuse(parser, f"--resume {folder}: {saved} has no {kind.__name__} {key!r} (corrupt or not written"
                           " by run_simulation.py): start the comparison again with its command and --out")
    return record


def resolve_experiment(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill strategy/seeds/clients from --config (flags win) and the plain defaults."""
    args.experiment = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.is_file():
            refuse(parser, f"--config {args.config}: no such file")
        try:
            exp = read_experiment(path)
        except ConfigError as exc:
            refuse(parser, f"--config: {exc}")
        args.experiment = exp
        args.strategy = args.strategy or ",".join(exp.get("strategies", []))
        args.seeds = args.seeds or exp.get("seeds")
        args.clients = exp.get("clients") if args.clients is None else args.clients
        args.out = args.out or f"results/experiments/{exp.get('name', path.stem)}"
    if args.strategy is not None and not [s for s in args.strategy.split(",") if s.strip()]:
        refuse(parser, f"--strategy {args.strategy!r} names no method; give one or a comma list (--list methods)")
    args.strategy = args.strategy or config_keys()["strategy"].default
    args.seeds = args.seeds or [0]
    try:
        check_distinct(args.seeds, f"--seeds {' '.join(map(str, args.seeds))}", "seed")
    except ConfigError as exc:
        refuse(parser, str(exc))
    args.clients = 10 if args.clients is None else args.clients  # --clients 0 is refused, not replaced
    return args


def runner_record(args: argparse.Namespace) -> dict:
    """The arguments saved in runner.json for --resume, with what a new shell would resolve
    differently made explicit: ``--data-dir`` and the experiment file by absolute path, and the
    ``$FL_DATA_DIR`` of this shell as ``env_data_dir``, and the working directory (``cwd``) that
    an experiment file's relative ``data-dir`` was meant from. The two data sources are kept apart, so
    a resume replays the same precedence (an experiment file's ``data-dir`` still beats
    ``$FL_DATA_DIR``) and therefore the same configuration."""
    saved = {k: v for k, v in vars(args).items() if k not in ("resume", "experiment", "list", "check")}
    saved["data_dir"] = resolve_data_dir(args.data_dir) if args.data_dir else None
    saved["env_data_dir"] = args.env_data_dir
    saved["cwd"] = args.cwd
    if saved.get("config"):
        saved["config"] = str(Path(saved["config"]).resolve())
    return saved
