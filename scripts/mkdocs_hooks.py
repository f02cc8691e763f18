"""MkDocs hook (``mkdocs.yml``, ``hooks:``): README.md is the documentation site's home page.

The README is written to be read beside ``docs/`` (on a forge, in a checkout), so its links
into the pages start with ``docs/``. On the site it becomes ``index.md`` inside ``docs/``, so
exactly that prefix is dropped from its link and image targets; nothing else changes, and
``mkdocs build --strict`` then checks every README link like any page's. The README is not
copied into docs/: one text, never two that could differ.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS_LINK = re.compile(r"\]\(docs/")


def readme_as_index(text: str) -> str:
    """The README with its ``](docs/...`` link and image targets made relative to docs/."""
    return DOCS_LINK.sub("](", text)


def on_files(files, config):
    """Add the README, rewritten by ``readme_as_index``, as the site's ``index.md``."""
    from mkdocs.structure.files import File

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme_as_index(text)))
    return files
