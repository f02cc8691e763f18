"""FedPVR (Li et al. 2023, partial variance reduction): SCAFFOLD control variates on the last
``pvr-layers`` Linear layers only (default 1: the classifier head); the other layers take
plain SGD steps. Server as SCAFFOLD: weighted mean, c <- c + (1/N) sum delta c_i."""

from protocol.keys import Key, at_least
from protocol.layout import pvr_param_names
from strategies.base import REPLIES_ONLY
from strategies.control_variates import ControlVariateStrategy


class FedPVRStrategy(ControlVariateStrategy):
    CONFIG_KEYS = {"pvr-layers": Key(1, at_least(1), ">= 1 (last Linear layers with control variates)")}
    CV_DIVISOR = "total"
    SCREENING = REPLIES_ONLY  # c moves by the clients' delta c_i (SCREENING_WHY)
    REPLY_SUMS = ("delta_c",)  # the weighted mean and c's sum of delta c_i
    cv_param_names = staticmethod(pvr_param_names)
