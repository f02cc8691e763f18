"""Start-up work run beside something else instead of before it.

Between ``flwr run`` and round 1 the server waits for Ray and for the nodes' partition ids
while its own CPU idles, then decodes the test split while the clients idle; the clients then
pay their own first-use costs in round 1. Running each side's start-up work in a background
thread overlaps the two (docs/performance.md, "What the code does for speed").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def in_background(fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn(*args)`` in a daemon thread; ``.result()`` returns its value or raises its error.

    A daemon thread, unlike a ThreadPoolExecutor's, never holds up the exit of a process
    whose run failed before it needed the result.
    """
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever asks for the result
            future.set_exception(exc)

    threading.Thread(target=work, daemon=True, name=f"fl-drift-{getattr(fn, '__name__', 'work')}").start()
    return future
