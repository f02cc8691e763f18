"""The pair a method is: its server ``Strategy`` class and its client side, a ``LocalUpdate``
(``tasks.functional.update``) that the one generic ``NumPyClient`` (``fl_app.node.drift_client.DriftClient``)
and a cohort node run.

Defined here, below every room of ``fl_app``, so that the server's and the node's parts can
name the type of the method object the entry points pass down, without importing the
registry (the one place a method is looked up by its name, ``fl_app.registry``).
"""

from __future__ import annotations

from typing import NamedTuple

from tasks.functional.update import LocalUpdate


class Method(NamedTuple):
    strategy: type
    update: LocalUpdate
