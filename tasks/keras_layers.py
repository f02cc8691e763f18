"""A model's layers as a Keras ``Sequential`` lists them (``model.layers``), for rules written
against Keras layer indices: FedPGVC's released code (``pgvc-variant = "authors"``), whose
client and server both call ``pgvc_code_layers`` (the client to rescale, the server to refuse a
model the rule does not fit before any training).

Keras folds a layer's activation into the layer (``Dense(120, activation='relu')``) and has no
identity layers, while PyTorch writes activations as modules of their own. So the list is the
model's leaf modules in definition order (the forward order of the project's ``Sequential``
bodies followed by the head) without ``nn.Identity`` and activation modules: every Conv,
pooling, Flatten, Linear, BatchNorm and Dropout module is one layer, as in Keras. The
project's ``lenet`` lists as conv 6, max-pool, conv 16, max-pool, Flatten, FC 120, FC 84, head:
the eight layers of the authors' CIFAR model (``create_cnn_model`` in their ``Models.py``),
which it equals apart from padding and input size.
"""

from __future__ import annotations

from torch import nn

# Activation modules: a Keras layer carries its activation, so they are not layers of their own.
ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.LeakyReLU, nn.ELU, nn.SiLU, nn.Softmax)

# FedPGVC.py's mask over ``local_model.layers``: p = [0, 0, 0, 0, 1, 1, 1, 1] (its comment says
# "last two layers"; it marks the last four, Keras indices 4-7).
PGVC_CODE_MASK = (0, 0, 0, 0, 1, 1, 1, 1)


def keras_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each layer Keras would list, in order (module docstring)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if next(m.children(), None) is None and not isinstance(m, (nn.Identity, *ACTIVATIONS))
    ]


def pgvc_code_layers(model: nn.Module) -> list[tuple[int, list[str]]]:
    """(j, parameter names) for each layer FedPGVC's released code rescales that has
    parameters: j is its Keras layer index under ``PGVC_CODE_MASK``. The code takes that layer's
    factor from ``rho_i[j]``, the product of sample j's loss and the mean gradient of the j-th
    trainable tensor, so j indexes the model's parameter list too (clients/fedpgvc.py).

    For ``lenet``: j = 5, 6, 7, the layers ``body.9`` (FC 120), ``body.12`` (FC 84) and
    ``head``; layer 4 is the Flatten. Raises ValueError unless the model has exactly the eight
    layers the mask covers (the code raises on a ninth) and a j-th parameter tensor for every
    such j."""
    layers = keras_layers(model)
    if len(layers) != len(PGVC_CODE_MASK):
        raise ValueError(
            f"the released code's mask covers {len(PGVC_CODE_MASK)} layers in Keras order; the model"
            f" has {len(layers)} ({', '.join(type(m).__name__ for _, m in layers)})"
        )
    n_tensors = sum(1 for _ in model.parameters())
    out = []
    for j, (name, module) in enumerate(layers):
        names = [f"{name}.{p}" for p, _ in module.named_parameters(recurse=False)]
        if not PGVC_CODE_MASK[j] or not names:
            continue
        if j >= n_tensors:
            raise ValueError(f"layer {j} ({name}) takes rho from parameter tensor {j}; the model has {n_tensors}")
        out.append((j, names))
    return out
