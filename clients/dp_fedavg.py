"""DP-FedAvg: central differential privacy with fixed clipping (McMahan et al., ICLR 2018), built
from Flower's strategy wrappers.

- `dp-mode = "client"` (default): Flower's `DifferentialPrivacyClientSideFixedClipping`
  sends the clipping norm C and Flower's `fixedclipping_mod` on the ClientApp (added in
  `fl_app/client_app.py` for these runs only) clips the client's update w_k − w_t to norm C.
  `dp-mode = "server"`: `DifferentialPrivacyServerSideFixedClipping` clips each update on the
  server.
- Server (`strategies/dp_fedavg.py`): the unweighted mean of the clipped updates, plus Gaussian
  noise of standard deviation z · C / m on the aggregate (z the noise multiplier, m the number of
  clients sampled in the round).
- Client: plain local SGD, FedAvg's local update; the clipping is the mod's (the update's
  `client_mods`).
- State: the server counts the rounds released and the sampling rate q = m / N for the
  accountant. Keys: `dp-mode` (`client` | `server`, default `client`), `dp-noise-multiplier`
  z (0.1, ≥ 0), `dp-clipping-norm` C (1.0, > 0), `dp-delta` δ (1e-5, in (0, 1)),
  `dp-noise-seeded` (false).
- Reproducible noise: Flower's wrappers draw the noise from NumPy's global generator, which
  nothing seeds, so two runs of one seed differ and a resumed run differs from an
  uninterrupted one. With `dp-noise-seeded = true` round t's noise comes from a generator
  seeded by (seed, t), and the global generator is put back afterwards: one seed, one model,
  and a resumed run draws the noise an uninterrupted one would. For comparing methods in
  simulation only: whoever knows the seed can recompute and subtract the noise, so ε then
  protects nothing.
- Server metrics: `dp_noise_std`, and `dp_epsilon`: ε at δ after the rounds so far, from the
  Rényi-DP bound of the Poisson-subsampled Gaussian mechanism at q = m / N (integer orders
  2..256). Omitted when z = 0.
- Readings: the mean is unweighted because the wrappers' noise z · C / m is calibrated to the
  sensitivity C / m of a uniform mean (an n_k-weighted mean can have sensitivity up to C). m is
  the number of clients actually sampled in the round. The accountant assumes Poisson sampling
  while Flower samples a fixed number of clients, so ε is an approximation, as in McMahan et
  al. z = 0.1 gives little privacy; raise it for real use. Models with integer buffers (BN's
  batch counter) are refused, since integers can be neither clipped nor noised.

Summary: client update clipped (client mode) | server clipping, noise, uniform mean | client
state - | server state accountant | traffic -
"""

from __future__ import annotations

from flwr.app import Message, MessageType
from flwr.clientapp.mod import fixedclipping_mod

from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate


def train_only_fixedclipping_mod(msg: Message, context, call_next) -> Message:
    """Flower's ``fixedclipping_mod`` on training messages only. The mod of ``flwr.clientapp``
    (Message API) checks every message for one ArrayRecord, so a legacy ``get_properties``
    (the server's question for the node's partition id, fl_app/server/sampling.py) came back as
    an error: the nodes were then sampled in the order of their random node ids, and two runs
    of one seed trained different clients."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    return fixedclipping_mod(msg, context, call_next)


def dp_client_mods(cfg) -> tuple:
    """Flower's ``fixedclipping_mod`` with ``dp-mode = "client"``: the client clips its own update
    to the norm the strategy wrapper sends. A mod acts on one client's message, which keeps
    DP-FedAvg off the cohort path (K clients trained in one call would bypass it)."""
    return (train_only_fixedclipping_mod,) if cfg["dp-mode"] == "client" else ()


# FedAvg's step; clipping and noise are Flower's (this mod and the strategy wrapper).
UPDATE = LocalUpdate("dp-fedavg", plain_direction, client_mods=dp_client_mods, module=__name__)
