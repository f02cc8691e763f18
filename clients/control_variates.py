"""Client side of SCAFFOLD-style control variates, written once (SCAFFOLD, FedPVR, FedGAM-CV).

Protocol (``strategies/control_variates.py`` is the server side):

- the server sends the model state (state_dict order) followed by c, one array per
  parameter that carries a control variate, in state_dict order;
- every local step uses g - c_i + c, on top of whatever direction the method's local update
  takes (plain CE for SCAFFOLD, the GAM gradient for FedGAM-CV);
- after the K local steps of the round (K = total local steps over all epochs, not batches
  per epoch) the client sets c_i+ = c_i - c + (w_t - w) / (eta * K_eff) (SCAFFOLD option II,
  FedGAM Eq. 21) with eta the round's learning rate, keeps c_i+ in ``context.state``, and
  replies the weights followed by delta c_i = c_i+ - c_i, same count and shapes as sent.
  K_eff = sum_{s=1..K} (1 - beta^s)/(1 - beta) (``tasks.optim.effective_steps``) is K at
  momentum beta = 0 (the papers' rule) and the momentum-corrected step count otherwise, as
  the FedSOL authors' SCAFFOLD ("adaptive division"; Lee et al., CVPR 2024) divides: with
  momentum the corrected gradient moves the weights about 1/(1 - beta) times further than K
  plain steps, and dividing by K over-counts the client's direction by that factor, which
  feeds back through c over the rounds until the run diverges. Option II needs a step linear
  in the gradient, so these methods refuse ``optimizer`` adam/adamw before training
  (``ControlVariateStrategy.resolve_config``).

The rule for c_i+ is ``tasks.functional.methods.control_variate_update``; SCAFFOLD runs the
whole round as ``tasks.functional.SCAFFOLD``, FedPVR as ``tasks.functional.corrections.FEDPVR``
(the same functions on its layers) and FedGAM-CV as ``tasks.functional.sharpness.FEDGAM_CV``;
this class carries c, c_i and delta c_i between the wire, ``context.state`` and the update
(``receive``, ``functional_inputs`` / ``functional_outputs``, ``reply``).

c and c_i start at zero and cover trainable parameters only; ``cv_param_names`` selects
which ones (all of them by default; FedPVR: the last Linear layers). The client reports
||c_i+|| as the fit metric ``ci_norm``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from clients.base import DriftClient
from protocol.layout import cv_names_in_state_order, trainable_param_names
from tasks.functional import RoundResult

CI_STATE = "cv-ci"


def split_received(model: nn.Module, parameters: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """What the server sent: (the model state arrays, the extra arrays after them)."""
    n_state = len(model.state_dict())
    return parameters[:n_state], parameters[n_state:]


def arrays_to_tensors(arrays: list[np.ndarray], names: list[str], params: list[torch.Tensor],
                      what: str) -> list[torch.Tensor]:
    """One tensor per parameter (its dtype and device), refusing a wrong count or shape."""
    if len(arrays) != len(params):
        raise ValueError(f"{what}: {len(arrays)} arrays for {len(params)} parameters")
    out = []
    for name, p, a in zip(names, params, arrays):
        if tuple(a.shape) != tuple(p.shape):
            raise ValueError(f"{what} for {name!r} has shape {a.shape}, expected {tuple(p.shape)}")
        out.append(torch.as_tensor(np.asarray(a), dtype=p.dtype, device=p.device).clone())
    return out


class ControlVariateClient(DriftClient):
    """Mixin/base: put it before the method's client in the bases (``class X(ControlVariateClient,
    FedGAMClient)``) so its ``receive`` / ``reply`` wrap the method's and call ``super()``."""

    # Which parameters carry control variates; the strategy uses the same function.
    cv_param_names = staticmethod(trainable_param_names)

    def _cv_setup(self) -> None:
        self.cv_names = cv_names_in_state_order(self.model, self.cv_param_names(self.model, self.cfg))
        named = dict(self.model.named_parameters())
        self.cv_params = [named[n] for n in self.cv_names]

    def _zeros(self) -> list[torch.Tensor]:
        return [torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for p in self.cv_params]

    def _tensors(self, arrays: list[np.ndarray], what: str) -> list[torch.Tensor]:
        return arrays_to_tensors(arrays, self.cv_names, self.cv_params, what)

    # ------------------------------------------------------------- c and c_i on the wire
    def receive(self, parameters: list[np.ndarray]) -> list[np.ndarray]:
        weights, extra = split_received(self.model, super().receive(parameters))
        self._cv_setup()
        self.c = self._tensors(extra, "c") if extra else self._zeros()
        stored = self.load_state(CI_STATE)
        self.ci = self._tensors(stored, "stored c_i") if stored is not None else self._zeros()
        self.delta_c: list[torch.Tensor] | None = None
        return weights

    # ------------------------------------------------------------- the local update
    def functional_inputs(self) -> tuple[dict, dict]:
        return {"ci": dict(zip(self.cv_names, self.ci))}, {"c": dict(zip(self.cv_names, self.c))}

    def functional_outputs(self, result: RoundResult) -> None:
        """Store c_i+ in ``context.state`` and delta c_i = c_i+ - c_i for ``reply``."""
        ci_new = [result.state["ci"][n] for n in self.cv_names]
        self.delta_c = [new - old for new, old in zip(ci_new, self.ci)]
        self.save_state(CI_STATE, [t.cpu().numpy() for t in ci_new])

    def reply(self) -> list[np.ndarray]:
        if self.delta_c is None:
            raise RuntimeError("reply() before the round: delta c_i is not computed")
        return super().reply() + [d.cpu().numpy() for d in self.delta_c]
