"""``run_simulation.py --list``: methods (one line each), models, datasets and every run-config
key with its default and what is allowed, read from the registry and the schema (so a new
method, model or key shows up without editing this file).

And the generated parts of four files, rewritten by one command,
``python -m runner.listing generate`` (never edited by hand; tests keep them equal to
what it writes): the README's method table and docs/methods.md's summary table and per-method
sections, both from each method's module docstring (``fl_app.registry.documentation``: the
module its ``LocalUpdate`` declares, or a server-only method's strategy module),
pyproject.toml's ``[tool.flwr.app.config]`` table, from the key schema
(``fl_app.registry.toml_table``), and docs/configuration.md's key reference, from the same schema.
``readme-table``, ``methods-doc``, ``toml-table`` and ``config-doc`` print one of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
WHAT = ("methods", "models", "datasets", "partitioners", "keys")

def methods() -> list[str]:
    """One line per registered method: its description (``fl_app.registry.description``, the
    first paragraph of its own module's docstring, ``LocalUpdate.module`` or, for a server-only
    method, its strategy module; never cut) and its own keys."""
    from fl_app.registry import METHODS, config_keys, description

    width = max(map(len, METHODS))
    lines = []
    for name, method in METHODS.items():
        keys = ", ".join(config_keys(method))
        lines.append(f"  {name:<{width}}  {description(method)}" + (f"  [keys: {keys}]" if keys else ""))
    return lines


def models() -> list[str]:
    """One line per model: the first paragraph of its builder's docstring, never cut."""
    from fl_app.api import BUILDERS, FLAT_MODELS, MODELS
    from fl_app.registry import first_paragraph

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
                    f" <data-dir>/{name}/{split_files(info.splits())}.parquet, else hub {info.hub_id}")
            if info.held_out_test:
                text += f" ({info.held_out_test:.0%} of train held out as test)"
            if info.natural_id_column:
                text += f"; natural ids: {info.natural_id_column}"
        lines.append(f"  {name:<{width}}  {text}")
    return lines


def partitioners() -> list[str]:
    """One line per value of the run-config key ``partitioner``: what it cuts, and the NIID-Bench
    setting it stands for (``tasks.catalogue.PARTITIONERS``; docs/configuration.md)."""
    from tasks.catalogue import PARTITIONERS

    width = max(map(len, PARTITIONERS))
    return [f"  {name:<{width}}  {text}" for name, text in PARTITIONERS.items()]


def split_files(splits: tuple[str, ...]) -> str:
    """'train' or '{train,test}': the parquet files of a dataset's local folder, as a pattern."""
    return splits[0] if len(splits) == 1 else "{" + ",".join(splits) + "}"


def allowed(name: str, key) -> str:
    """What a run-config key accepts, in words (``--list keys`` and docs/configuration.md)."""
    if key.choices:
        return "one of " + ", ".join(key.choices)
    return key.allowed or f"any {key.type.__name__}"


def keys() -> list[str]:
    from fl_app.registry import spec

    table = spec()
    width = max(map(len, table))
    return [f"  {name:<{width}}  default {key.default!r:<12} {allowed(name, key)}" for name, key in table.items()]


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


SUMMARY_FIELDS = ("client", "server", "client state", "server state", "traffic")
SUMMARY_FORMAT = ("'Summary: client <change> | server <change> | client state <what> | server state <what> |"
                  " traffic <what>' ('-' for none)")
SUMMARY_HEADER = (
    "| method | client changes | server changes | client state | server state | extra traffic |",
    "|---|---|---|---|---|---|",
)


def split_summary(name: str, doc: str) -> tuple[str, list[str]]:
    """A method's module docstring without its ``Summary:`` paragraph, and that paragraph's five
    fields (the method's row of the summary table)."""
    paragraphs = doc.split("\n\n")
    found = [p for p in paragraphs if p.startswith("Summary: ")]
    fields = [f.strip() for f in " ".join(found[0].split()).removeprefix("Summary: ").split(" | ")] if found else []
    values = [f.removeprefix(label + " ") for label, f in zip(SUMMARY_FIELDS, fields) if f.startswith(label + " ")]
    if len(found) != 1 or len(values) != len(SUMMARY_FIELDS) or len(fields) != len(SUMMARY_FIELDS):
        raise ValueError(f"method {name!r}: its module docstring needs one paragraph {SUMMARY_FORMAT}"
                         " (docs/contributing.md)")
    return "\n\n".join(p for p in paragraphs if p is not found[0]), values


def methods_doc() -> str:
    """docs/methods.md's generated part: the summary table (one row per registered method,
    linking to its section) and one section per method, its module docstring whole."""
    from fl_app.registry import METHODS, documentation

    rows, sections = list(SUMMARY_HEADER), []
    for name, method in METHODS.items():
        body, fields = split_summary(name, documentation(method))
        rows.append(f"| [`{name}`](#{name}) | " + " | ".join(fields) + " |")
        sections.append(f"### {name}\n\n{body}")
    return "\n\n".join(["## Summary", "\n".join(rows), "## The methods", *sections])


def toml_table() -> str:
    from fl_app.registry import toml_table as table

    return table()


def config_reference() -> str:
    """docs/configuration.md's generated part: every run-config key of ``fl_app.registry.spec()``
    with its default (as TOML writes it) and what it accepts; the general keys first, then each
    method's own keys with the methods that read them."""
    from fl_app.config import toml_value
    from fl_app.registry import METHODS, config_keys, general_keys, spec

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def prose(text: str) -> str:  # '[:<factor>][@<round>]' is text, not a Markdown reference link
        return cell(text).replace("][", "]\\[")

    readers: dict[str, list[str]] = {}
    for method_name, method in METHODS.items():
        for key_name in config_keys(method):
            readers.setdefault(key_name, []).append(method_name)
    general = ["## General keys", "", "| key | default | allowed |", "|---|---|---|"]
    own = ["## Method keys", "", "Each read only by the methods named (their sections in [methods.md](methods.md)).",
           "", "| key | default | allowed | methods |", "|---|---|---|---|"]
    for name, key in spec().items():
        row = f"| `{name}` | `{cell(toml_value(key.default))}` | {prose(allowed(name, key))} |"
        if name in general_keys():
            general.append(row)
        else:
            own.append(row + " " + ", ".join(f"[`{m}`](methods.md#{m})" for m in readers[name]) + " |")
    return "\n".join([*general, "", *own])


class Generated(NamedTuple):
    """A generated part of a file: the text between ``begin`` and ``end`` (exclusive, each the
    first occurrence) is a newline, ``make()`` and a newline."""

    path: Path
    begin: str
    end: str
    make: Callable[[], str]


GENERATED = {
    "readme-table": Generated(ROOT / "README.md", "<!-- methods table: generated by python -m runner.listing"
                              " generate -->", "<!-- end of methods table -->", readme_methods_table),
    "methods-doc": Generated(ROOT / "docs" / "methods.md", "<!-- methods: generated by python -m"
                             " runner.listing generate from each method's module docstring -->",
                             "<!-- end of methods -->", methods_doc),
    "toml-table": Generated(ROOT / "pyproject.toml", "[tool.flwr.app.config]", "\n[", toml_table),
    "config-doc": Generated(ROOT / "docs" / "configuration.md", "<!-- run-config keys: generated by python -m"
                            " runner.listing generate from fl_app/config.py and the methods -->",
                            "<!-- end of run-config keys -->", config_reference),
}


def current_part(part: Generated) -> str:
    """What the file holds now between the part's markers (without the framing newlines)."""
    text = part.path.read_text(encoding="utf-8")
    start = text.find(part.begin)
    end = text.find(part.end, start + len(part.begin)) if start >= 0 else -1
    if end < 0:
        raise ValueError(f"{part.path.name}: the markers of its generated part are missing ({part.begin!r})")
    return text[start + len(part.begin):end].removeprefix("\n").removesuffix("\n")


def regenerate(part: Generated) -> bool:
    """Rewrite the part in its file; True if the file changed."""
    old, new = current_part(part), part.make()
    if old == new:
        return False
    text = part.path.read_text(encoding="utf-8")
    start = text.find(part.begin) + len(part.begin)
    end = text.find(part.end, start)
    part.path.write_text(text[:start] + "\n" + new + "\n" + text[end:], encoding="utf-8")
    return True


def generate() -> list[str]:
    """Rewrite every generated part; the files that changed."""
    return [str(part.path.relative_to(ROOT)) for part in GENERATED.values() if regenerate(part)]


def main(argv: list[str]) -> None:
    if argv == ["generate"]:
        changed = generate()
        print("rewrote " + ", ".join(changed) if changed else "every generated part is up to date")
    elif argv[:1] and argv[0] in GENERATED:
        print(GENERATED[argv[0]].make())
    else:
        print(listing(*argv))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
