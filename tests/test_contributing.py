"""docs/contributing.md stays true: it teaches the one way a client trains (a ``LocalUpdate``,
no other), and its worked example (``fedmom-example``) is at most four files, and exactly the
code blocks it shows, registered in place of the real registry line (monkeypatched, so the
example never becomes a method of the product), build a method that validates, lists with a
complete description, gets its README row, docs/methods.md section and pyproject keys from the
one generate command, declares its screening decision, and passes its own tests in process:
its local step by hand, two rounds of its server rule, and its per-client and cohort paths
finding the same replies."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from fl_app import registry
from runner.listing import config_reference, listing, methods_doc, readme_methods_table, toml_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "contributing.md"
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
    scope = {"Method": registry.Method, **vars(client), **vars(strategy)}
    for name, method in eval("{" + files["fl_app/registry.py"] + "}", scope).items():
        monkeypatch.setitem(registry.METHODS, name, method)
    return load_module(monkeypatch, "tests/test_fedmom_example.py", files["tests/test_fedmom_example.py"])


def test_the_example_is_at_most_four_files():
    files = blocks()
    assert set(files) == {"clients/fedmom_example.py", "strategies/fedmom_example.py",
                          "fl_app/registry.py", "tests/test_fedmom_example.py"}
    assert files["fl_app/registry.py"].strip().count("\n") == 0, "the registry change is one line"


def test_the_example_is_not_a_real_method():
    assert NAME not in registry.METHODS
    assert not (DOC.parent.parent / "clients" / "fedmom_example.py").exists()


def test_the_page_teaches_the_local_update_and_no_other_way():
    text = DOC.read_text(encoding="utf-8")
    assert "`LocalUpdate`" in text and "LOCAL_UPDATE" in text
    assert "hook" not in text.lower()
    for gone in ("train_step", "adjust_gradients", "begin_round", "end_round", "fit_hooks"):
        assert gone not in text


def test_the_example_trains_through_its_own_local_update(monkeypatch):
    register_example(monkeypatch)
    method = registry.get_method(NAME)
    update = method.client.local_update_for(registry.validate_config({"strategy": NAME}))
    assert update.name == NAME and update is sys.modules["clients.fedmom_example"].FEDMOM_EXAMPLE


def test_the_example_registers_lists_and_passes_its_tests_on_both_paths(monkeypatch, tmp_path):
    example_tests = register_example(monkeypatch)
    method = registry.get_method(NAME)
    assert set(registry.config_keys(method)) == {"fedmom-mu", "fedmom-beta", "fedmom-server-lr"}
    description = registry.description(method)
    assert description.startswith("FedMom-example: ") and description.endswith(".")
    assert any(line.split()[:1] == [NAME] and description in line for line in listing("methods").splitlines())
    example_tests.test_local_step_by_hand()
    example_tests.test_two_rounds_follow_the_momentum_rule(tmp_path)
    example_tests.test_per_client_and_cohort_paths_agree()


def test_the_page_names_the_one_generate_command():
    text = DOC.read_text(encoding="utf-8")
    assert "python -m runner.listing generate" in text
    for generated in ("README", "docs/methods.md", "pyproject", "docs/configuration.md"):
        assert generated in text


def test_the_generated_files_take_the_example_from_its_four_files(monkeypatch, tmp_path):
    """What ``python -m runner.listing generate`` would write with the example
    registered: its README row, its docs/methods.md summary row and section (its client
    module's docstring), its keys in pyproject's table and docs/configuration.md's reference; no
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
    from tests.test_screening import depends_only_on_the_mean, probe_config

    register_example(monkeypatch)
    strategy = registry.get_method(NAME).strategy
    assert "SCREENING" in vars(strategy) and "median" in strategy.SCREENING
    assert depends_only_on_the_mean(strategy, probe_config(strategy))
