"""Server-side fault injection (``inject-faults``): ``crash-after:<round>`` makes the server
fail after that round's row and checkpoint are written, to test resuming."""

from __future__ import annotations

from fl_app.common.faults import parse_faults


def crash_if_injected(cfg: dict, server_round: int) -> None:
    """Raise RuntimeError when ``inject-faults`` holds ``crash-after:<server_round>``."""
    if parse_faults(cfg["inject-faults"]).get("crash-after") == server_round:
        raise RuntimeError(f"injected crash after round {server_round} (inject-faults)")
