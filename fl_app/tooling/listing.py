"""``run_simulation.py --list``: methods (one line each), models, datasets and every run-config
key with its default and what is allowed, read from the registry and the schema (so a new
method, model or key shows up without editing this file); and the README's method table,
generated from the same descriptions (``python -m fl_app.tooling.listing readme-table``)."""

from __future__ import annotations

WHAT = ("methods", "models", "datasets", "keys")

def methods() -> list[str]:
    """One line per registered method: its description (``fl_app.registry.description``, the
    first paragraph of its client module's docstring, never cut) and its own keys."""
    from fl_app.registry import METHODS, config_keys, description

    width = max(map(len, METHODS))
    lines = []
    for name, method in METHODS.items():
        keys = ", ".join(config_keys(method))
        lines.append(f"  {name:<{width}}  {description(method)}" + (f"  [keys: {keys}]" if keys else ""))
    return lines


def models() -> list[str]:
    """One line per model: the first paragraph of its builder's docstring, never cut."""
    from fl_app.registry import first_paragraph
    from tasks.models import BUILDERS, FLAT_MODELS, MODELS

    width = max(map(len, MODELS))
    lines = []
    for name in MODELS:
        kind = "synthetic data" if name in FLAT_MODELS else "image datasets"
        lines.append(f"  {name:<{width}}  {first_paragraph(BUILDERS[name])} [{kind}]")
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


README_TABLE_HEADER = (
    "| method | what it is (the update rule, state and choices: docs/methods.md) | own keys (default) |",
    "|---|---|---|",
)


def readme_methods_table() -> str:
    """The README's method table: one line per registered method, its name linking to its
    section in docs/methods.md, its description, its own run-config keys with their defaults."""
    from fl_app.config import toml_value
    from fl_app.registry import METHODS, config_keys, description

    lines = list(README_TABLE_HEADER)
    for name, method in METHODS.items():
        keys = ", ".join(f"`{k} = {toml_value(key.default)}`" for k, key in config_keys(method).items()) or "-"
        text = description(method).replace("|", "\\|")
        lines.append(f"| [`{name}`](docs/methods.md#{name}) | {text} | {keys} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(readme_methods_table() if sys.argv[1:] == ["readme-table"] else listing(*sys.argv[1:]))
