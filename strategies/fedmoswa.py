"""FedMoSWA server (Liu et al., ICML 2025): FedSWA's lookahead step w_t + α (mean − w_t) forms the
model (``strategies.parts.Lookahead``), and the server control variate m, sent as ``c``, moves by
a momentum over the replies' c_i⁺ − m (``delta_c``): m ← m + γ (1/|S_t|) Σ (c_i⁺ − m), the first
update at γ = 1 under ``fedmoswa-m-init = first-mean`` (``strategies.parts.ControlVariates`` with
D = |S_t|; the rules in ``clients/fedmoswa.py``)."""

from __future__ import annotations

from protocol.keys import Key, positive, unit_interval
from protocol.layout import trainable_param_names
from protocol.traffic import CONTROL_VARIATES
from strategies.base import REPLIES_ONLY
from strategies.control_variates import CV_WHY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import FIRST_MEAN, STARTS, ControlVariates, Lookahead


class FedMoSWAStrategy(DeclaredStrategy):
    """The lookahead step on the plain mean, and m, a momentum over the clients' latest c_i."""

    SERVER = ServerSide(
        "FedMoSWA", screening=REPLIES_ONLY, reply_sums=None, traffic=CONTROL_VARIATES,
        keys={"fedmoswa-alpha": Key(1.0, positive, "> 0 (server step towards the clients' plain mean; 1 = the mean)"),
              "fedmoswa-gamma": Key(0.4, unit_interval, "in (0, 1] (momentum of m over the clients' c_i)"),
              "fedmoswa-m-init": Key(FIRST_MEAN, choices=STARTS)},
        parts={"lookahead": Lookahead("fedmoswa-alpha"),
               "cv": ControlVariates(trainable_param_names, "participants", gain_key="fedmoswa-gamma",
                                     start_key="fedmoswa-m-init")},
        screening_why=CV_WHY)
