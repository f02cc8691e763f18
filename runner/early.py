"""The one refusal the command-line runner makes before it imports torch and Flower: an explicit
``--data-dir`` (or ``--set data-dir=``) folder that does not exist. The imports take seconds on a
small machine, so this typo fails at once; every other check runs after them (``runner.checks``).
Imports nothing heavy: ``tasks.catalogue`` is plain data."""

from __future__ import annotations

import sys
from pathlib import Path


def missing_data_dir(argv: list[str]) -> tuple[str, str] | None:
    """(folder, dataset) when an explicit ``--data-dir`` / ``--set data-dir=`` folder does not
    exist, else None. Checked before torch and Flower are imported (seconds on a small machine),
    so this typo fails at once; every other check runs after the imports, in ``main``."""
    given: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for key in ("data-dir", "dataset"):
            if arg == f"--{key}" and i + 1 < len(argv):
                given[key] = argv[i + 1]
            elif arg.startswith(f"--{key}="):
                given[key] = arg.split("=", 1)[1]
            elif arg == "--set" and i + 1 < len(argv) and argv[i + 1].replace(" ", "").startswith(f"{key}="):
                given[key] = argv[i + 1].split("=", 1)[1].strip().strip("'\"")
    folder, dataset = given.get("data-dir"), given.get("dataset", "<dataset>")
    if not folder or dataset == "synthetic" or {"--resume", "--list", "--config"} & set(argv):
        return None
    return None if Path(folder).expanduser().is_dir() else (folder, dataset)


def refuse_missing_data_dir(argv: list[str]) -> None:
    """Exit 2 with one ``error:`` line on stderr when ``missing_data_dir(argv)`` finds the
    folder missing (naming the folder, what it must hold and the alternatives); else return."""
    if not missing_data_dir(argv):
        return
    from tasks.catalogue import DATASETS  # plain data: no torch

    bad, dataset = missing_data_dir(argv)
    hub = f" {DATASETS[dataset].hub_id}" if dataset in DATASETS else ""
    print(f"error: run-config key 'data-dir' = {bad!r} is invalid: no such folder ({Path(bad).expanduser().resolve()});"
          f" it must hold {dataset}/train.parquet and {dataset}/test.parquet (leave it out to use $FL_DATA_DIR"
          f" or the Hugging Face hub id{hub})", file=sys.stderr)
    sys.exit(2)
