"""docs/contributing.md stays true: it teaches the one way a method's client side is written (a
``LocalUpdate`` declaration in its client module: no client class, no subclass, no override),
and its worked example (``fedmom-example``) is at most four files, and exactly the code blocks
it shows (read from the page and executed), registered in place of the real registry line
(monkeypatched, so the example never becomes a method of the product), build a method that
validates, lists with a complete description, gets its README row, docs/methods.md section and
pyproject keys from the one generate command, declares its screening decision, and passes its
own tests in process: its local step by hand, two rounds of its server rule, and its per-client
(``DriftClient.fit``) and cohort (``cohort_round`` over three clients) paths finding the same
replies within 1e-5 relative in float32, the cohort tests' tolerance."""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

from fl_app import registry
from runner.listing import config_reference, listing, methods_doc, readme_methods_table, toml_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "contributing.md"
BLOCK = re.compile(r"^```python file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NAME = "fedmom-example"


def blocks() -> dict[str, str]:
    return dict(BLOCK.findall(DOC.read_text(encoding="utf-8")))


def load_module(monkeypatch, path: str, source: str) -> types.ModuleType:
    """``source`` as the module ``path`` names (clients/x.py -> clients.x), in sys.modules for
    the test's duration."""
    module = types.ModuleType(path.removesuffix(".py").replace("/", "."))
    module.__file__ = str(DOC.parent.parent / path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def register_example(monkeypatch) -> types.ModuleType:
    """Load the example's modules and register it; returns its test module."""
    files = blocks()
    client = load_module(monkeypatch, "clients/fedmom_example.py", files["clients/fedmom_example.py"])
    strategy = load_module(monkeypatch, "strategies/fedmom_example.py", files["strategies/fedmom_example.py"])
    # the registry line's names, as its two imports bind them
    scope = {"Method": registry.Method, "fedmom_example": client, **vars(strategy)}
    for name, method in eval("{" + files["fl_app/registry.py"] + "}", scope).items():
        monkeypatch.setitem(registry.METHODS, name, method)
    test = "tests/methods/test_fedmom_example.py"
    return load_module(monkeypatch, test, files[test])


def test_the_example_is_at_most_four_files():
    files = blocks()
    assert set(files) == {"clients/fedmom_example.py", "strategies/fedmom_example.py",
                          "fl_app/registry.py", "tests/methods/test_fedmom_example.py"}
    assert files["fl_app/registry.py"].strip().count("\n") == 0, "the registry change is one line"


def test_the_example_is_not_a_real_method():
    assert NAME not in registry.METHODS
    assert not (DOC.parent.parent / "clients" / "fedmom_example.py").exists()


# What earlier ways of writing a client were called: a hook, a client class naming its update or
# its cost, overridden inputs/outputs, a control-variate client class.
GONE = ("LOCAL_UPDATE", "STEP_COST", "train_step", "adjust_gradients", "begin_round", "end_round", "fit_hooks",
        "functional_inputs", "functional_outputs", "prepare_functional", "finish_functional", "local_update_for",
        "FunctionalRound", "ControlVariateClient", "DriftClient.mods")
SUBCLASS = re.compile(r"class \w+\((?:\w+\.)*\w*Client\)")


def test_the_page_teaches_the_local_update_and_no_other_way():
    text = DOC.read_text(encoding="utf-8")
    assert "`LocalUpdate`" in text and "UPDATE = LocalUpdate(" in text
    assert "hook" not in text.lower()
    assert [gone for gone in GONE if gone in text] == []
    assert not SUBCLASS.search(text), SUBCLASS.search(text).group(0)
    for field in ("keys", "reads", "state", "receives", "sends", "personal", "carry", "prepare", "finish",
                  "step_cost", "client_mods", "module"):  # every field of the declaration is taught
        assert f"`{field}`" in text, field


def test_the_subclass_pattern_finds_a_client_class():
    assert SUBCLASS.search("class FedMomExampleClient(DriftClient):")
    assert SUBCLASS.search("class X(fl_app.node.drift_client.DriftClient):")
    assert not SUBCLASS.search("class FedMomExampleStrategy(DriftFedAvg):")


def test_the_example_trains_through_its_own_local_update(monkeypatch):
    """The registered update is the client module's ``UPDATE``, which documents itself by its
    own module, and the module defines no class: the generic client runs it."""
    from fl_app.node.drift_client import DriftClient
    from tests.kit import fake_context

    register_example(monkeypatch)
    client_module = sys.modules["clients.fedmom_example"]
    update = registry.get_method(NAME).update
    assert update is client_module.UPDATE and update.name == NAME and update.module == client_module.__name__
    assert registry.own_module(registry.get_method(NAME)) == client_module.__name__
    own_classes = [v for v in vars(client_module).values()
                   if isinstance(v, type) and v.__module__ == client_module.__name__]
    assert own_classes == []
    cfg = registry.validate_config({"strategy": NAME, "dataset": "synthetic", "model": "logreg"})
    assert DriftClient(update, cfg, fake_context(), 0, 1).update is update


def test_the_example_registers_lists_and_passes_its_tests_on_both_paths(monkeypatch, tmp_path):
    example_tests = register_example(monkeypatch)
    method = registry.get_method(NAME)
    assert set(registry.config_keys(method)) == {"fedmom-mu", "fedmom-beta", "fedmom-server-lr"}
    description = registry.description(method)
    assert description.startswith("FedMom-example: ") and description.endswith(".")
    assert any(line.split()[:1] == [NAME] and description in line for line in listing("methods").splitlines())
    tests = {name: fn for name, fn in vars(example_tests).items() if name.startswith("test_") and callable(fn)}
    assert {"test_local_step_by_hand", "test_two_rounds_follow_the_momentum_rule",
            "test_per_client_and_cohort_paths_agree"} <= set(tests)
    for name, test in tests.items():  # every test the page shows, as pytest would call it
        test(tmp_path / name) if "tmp_path" in inspect.signature(test).parameters else test()


def test_the_page_names_the_one_generate_command():
    text = DOC.read_text(encoding="utf-8")
    assert "python -m runner.listing generate" in text
    for generated in ("README", "docs/methods.md", "pyproject", "docs/configuration.md"):
        assert generated in text


def test_the_generated_files_take_the_example_from_its_four_files(monkeypatch, tmp_path):
    """What ``python -m runner.listing generate`` would write with the example
    registered: its README row, its docs/methods.md summary row and section (the docstring of
    the module its ``LocalUpdate`` declares), its keys in pyproject's table and docs/configuration.md's reference; no
    other file to edit."""
    register_example(monkeypatch)
    method = registry.get_method(NAME)
    doc = methods_doc()
    assert f"| [`{NAME}`](#{NAME}) | proximal term μ (w − w_t) | heavy-ball step on the mean update |" in doc
    section = doc.split(f"### {NAME}\n\n", 1)[1].split("\n### ", 1)[0]
    assert " ".join(section.split("\n\n")[0].split()) == registry.description(method)
    assert all(f"`fedmom-{key}`" in section for key in ("mu", "beta", "server-lr")) and "Summary:" not in section
    assert f"[`{NAME}`](docs/methods.md#{NAME})" in readme_methods_table()
    assert {"fedmom-mu = 0.01", "fedmom-beta = 0.9", "fedmom-server-lr = 1.0"} <= set(toml_table().splitlines())
    assert "| `fedmom-beta` | `0.9` | " in config_reference() and f"[`{NAME}`](methods.md#{NAME})" in config_reference()


def test_the_example_decides_its_screening(monkeypatch):
    from tests.kit_server import depends_only_on_the_mean, probe_config

    register_example(monkeypatch)
    strategy = registry.get_method(NAME).strategy
    assert "SCREENING" in vars(strategy) and "median" in strategy.SCREENING
    assert depends_only_on_the_mean(strategy, probe_config(strategy))


# --- every path and module the page names exists -------------------------------------------

ROOT = DOC.parent.parent
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
TICKED = re.compile(r"`([^`\n]+)`")
PACKAGES = ("runner", "fl_app", "clients", "strategies", "protocol", "tasks", "tests")
DOTTED = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+")
FILE = re.compile(r"[\w.<>-]*\.(?:py|md|toml|txt|yml|yaml|sh|cfg)")
PATH = re.compile(r"\.?[\w<>-][\w.<>-]*(?:/[\w.<>-]+)*/?")  # a relative path: no spaces, no leading /


def named_paths(text: str) -> list[tuple[str, list[Path]]]:
    """Every repository path the prose of ``text`` names in backticks (code blocks left out), each
    with the places it may mean: a path with a slash from the repository root; a bare file name
    (``cli.py``) in a folder the same top-level list item or paragraph named before it, nearest
    first (``runner/``), or at the root; a bare folder at the root (``runner/``), else in such a
    folder (``functional/`` after ``tasks/``). ``<name>`` stands for any name
    (``clients/<name>.py``: some ``clients/*.py``)."""
    found: list[tuple[str, list[Path]]] = []
    folders: list[Path] = []
    for line in FENCE.sub("", text).splitlines():
        if not line.strip() or line.startswith(("- ", "#")):  # a new paragraph or top-level item
            folders = []
        for token in TICKED.findall(line):
            if token.startswith("/") or not PATH.fullmatch(token) or not ("/" in token or FILE.fullmatch(token)):
                continue
            if "/" in token.rstrip("/"):
                places = [Path(token)]
            elif token.endswith("/"):
                places = [Path(token)] + [folder / token for folder in reversed(folders)]
            else:
                places = [folder / token for folder in reversed(folders)] + [Path(token)]
            if token.endswith("/"):
                folders.append(next((p for p in places if exists(p)), places[0]))
            found.append((token, places))
    return found


def exists(place: Path) -> bool:
    if "<" in str(place):  # a placeholder: some file of that form
        return any(ROOT.glob(re.sub(r"<[^>]+>", "*", str(place).rstrip("/"))))
    return (ROOT / place).exists()


def missing_paths(text: str) -> list[str]:
    return [f"{token} (looked for {', '.join(map(str, places))})"
            for token, places in named_paths(text) if not any(exists(p) for p in places)]


def missing_modules(text: str) -> list[str]:
    """Every dotted name of the repository's packages in the page's prose and commands
    (``fl_app.node.drift_client.DriftClient``, ``python -m runner.listing``): its longest
    importable prefix, then each further part an attribute of it."""
    import importlib

    bad = []
    for name in sorted({m for token in TICKED.findall(FENCE.sub("", text)) for m in DOTTED.findall(token)}):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        else:
            bad.append(name)
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                bad.append(name)
                break
            obj = getattr(obj, attr)
    return bad


def test_the_path_check_finds_a_wrong_path():
    text = ("`runner/`: `cli.py` and `sweep.py`; `tasks/`: `optim.py`, `functional/` (`rounds.py`); "
            "`tests/methods/test_<name>.py`, `run_simulation.py`, `/proc`, `x = 1`, `fl_app.registry.spec`. "
            "Wrong: `tests/test_<name>.py`, `runner/nope.py`, `nope.py`, `fl_app.registry.nope`, `tasks.nope`."
            "\n```python file=clients/not_checked.py\n```\n")
    assert [token for token, _ in named_paths(text)] == [
        "runner/", "cli.py", "sweep.py", "tasks/", "optim.py", "functional/", "rounds.py",
        "tests/methods/test_<name>.py", "run_simulation.py", "tests/test_<name>.py", "runner/nope.py", "nope.py"]
    assert [m.split(" ")[0] for m in missing_paths(text)] == ["tests/test_<name>.py", "runner/nope.py", "nope.py"]
    assert missing_modules(text) == ["fl_app.registry.nope", "tasks.nope"]


def test_every_path_and_module_the_page_names_exists():
    """docs/contributing.md names the files a contributor edits and reads; each must be where it
    says (a renamed or moved module fails here, naming the page's stale path)."""
    text = DOC.read_text(encoding="utf-8")
    assert len(named_paths(text)) > 100
    assert not missing_paths(text), "docs/contributing.md names paths that do not exist: " + "; ".join(missing_paths(text))
    assert not missing_modules(text), "docs/contributing.md names modules that do not exist: " + ", ".join(
        missing_modules(text))
