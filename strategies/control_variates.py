"""The server declaration of the methods whose server is SCAFFOLD's, written once (SCAFFOLD,
FedPVR, FedGAM-CV; FedDC declares the same part, ``strategies.parts.ControlVariates``, beside
FedDyn's): the n_k-weighted mean of the weights (Flower's FedAvg) and the server control
variate c, which travels after the weights (``c`` down, ``delta_c`` up: ``protocol.traffic``).
It reports ``cv_norm`` = ||c|| (after the update) as a round metric; the model weights the
server evaluates and stores never include c. The client side is ``clients.control_variates``.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocol.keys import Key
from protocol.layout import trainable_param_names
from protocol.traffic import CONTROL_VARIATES
from strategies.base import REPLIES_ONLY
from strategies.declared import ServerSide
from strategies.parts import ControlVariates, Names

CV_WHY = ("the server control variate c is updated by a sum of the clients' delta c_i; "
          "a median of the weights alone would leave c open to one client")
"""Why the control-variate servers refuse ``median`` (``SCREENING_WHY``)."""


def control_variate_server(name: str, scope: Names = trainable_param_names, divisor: str = "total",
                           keys: Mapping[str, Key] | None = None, divisor_key: str = "") -> ServerSide:
    """The declaration of a SCAFFOLD-style server: c over the parameters ``scope`` names, D of
    its update ``divisor`` (or the value of the key ``divisor_key``), the method's ``keys``.
    Screening: clip and reject only (``CV_WHY``); a cohort node may sum its clients' replies
    (the weighted mean and c's sum of delta c_i)."""
    return ServerSide(name, screening=REPLIES_ONLY, reply_sums=("delta_c",), keys=dict(keys or {}),
                      parts={"cv": ControlVariates(scope, divisor, divisor_key)}, traffic=CONTROL_VARIATES,
                      screening_why=CV_WHY)
