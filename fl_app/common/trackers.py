"""What the run-config key ``tracking`` asks for, parsed in one place: the experiment trackers a
run writes to. The run-config check (``fl_app.config``) and the server's trackers
(``fl_app.server.tracking``, which writes to them) both read it here."""

from __future__ import annotations

TRACKERS = ("tensorboard", "mlflow", "wandb")


def parse_tracking(text: str) -> tuple[str, ...]:
    """'mlflow, wandb' -> ('mlflow', 'wandb'); 'none' or '' -> (). A name that is not a
    tracker raises ValueError naming it and the valid choices."""
    names = tuple(dict.fromkeys(t.strip() for t in str(text).split(",") if t.strip()))
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a tracker; valid: 'none' or a comma list of {', '.join(TRACKERS)}")
    return names
