"""Training-time data augmentation: random crop, horizontal flip and cutout, per batch on the device.

The run-config key ``augment`` is ``"none"`` (the default) or a comma list of

- ``crop``: pad 4 pixels on every side, then cut a window of the original size at a uniform
  offset in [0, 8]^2 (a shift of at most 4 pixels each way); the padding is the normalised
  value of a black pixel, (0 - mean) / std per channel, because torchvision's
  ``RandomCrop(size, padding=4)`` pads the raw image with zeros before normalisation;
- ``flip``: mirror left-right with probability 1/2;
- ``cutout``: zero one 16x16 square (DeVries and Taylor 2017), its centre uniform over the
  image and the square clipped at the borders (so holes near an edge are smaller), applied
  after normalisation as in the FedSOL authors' code.

The ops run in that order (crop, flip, cutout) whatever the order in the list.

The feature noise of NIID-Bench's code (``noise-sigma`` with ``noise-reading = "code"``,
``tasks/feature_noise.py``) is drawn here too, as one more op, ``noise``, that the key
``augment`` does not name: Gaussian noise of the client's pixel-unit std (sigma * p / (N - 1)
for partition p of N) over the dataset's per-channel std, drawn anew for every batch, after
crop and flip (NIID-Bench's transform adds it after its random crop and flip) and before cutout. The papers'
recipes: FedSOL (Lee et al., CVPR 2024, Appendix B) CIFAR-10 ``crop,flip,cutout``, MNIST
``crop,flip`` (its code adds cutout on MNIST too); a flipped digit is another glyph, so
``crop`` alone is the safer choice for digits.

Every sample of a batch draws its own offsets, flip and hole with tensor ops on the batch's
device (no per-sample Python loop), from a ``torch.Generator`` on that device seeded from the
run seed, the partition and the round, so a run is reproducible. Only training batches are
augmented (``fl_app/node/drift_client.py`` applies it in the local loop); evaluation never is.
"""

from __future__ import annotations

import torch

AUGMENTATIONS = ("crop", "flip", "cutout")
PAD = 4  # crop padding (pixels per side)
HOLE = 16  # cutout side (pixels)


def parse_augment(text: str) -> tuple[str, ...]:
    """``"none"`` or ``""`` -> (); ``"flip, crop"`` -> ("crop", "flip") (canonical order).

    Raises ValueError naming the unknown entry and the valid choices.
    """
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["none"]:
        return ()
    if "none" in items:
        raise ValueError(f"'none' cannot be combined with other augmentations (got {text!r})")
    for item in items:
        if item not in AUGMENTATIONS:
            raise ValueError(
                f"unknown augmentation {item!r}; valid: 'none' or a comma list of {', '.join(AUGMENTATIONS)}"
            )
    return tuple(op for op in AUGMENTATIONS if op in items)


def augment_seed(seed: int, partition_id: int, server_round: int) -> int:
    """A seed for one client's round, distinct from the batch-order seed of the same round."""
    return hash((seed, partition_id, server_round, 0xA5)) & 0x7FFFFFFF


class Augment:
    """Callable that augments an NCHW batch; the identity when no op is chosen."""

    def __init__(self, ops: tuple[str, ...], fill: torch.Tensor, generator: torch.Generator | None,
                 noise: torch.Tensor | None = None):
        self.ops = ops
        self.fill = fill.view(1, -1, 1, 1)  # per-channel padding value for crop
        self.generator = generator
        self.noise = noise.view(1, -1, 1, 1) if noise is not None else None  # op "noise": per-channel std

    @classmethod
    def for_round(cls, cfg: dict, device: torch.device, partition_id: int, server_round: int,
                  num_partitions: int | None = None) -> Augment:
        """The run's ``augment`` ops for one client's round, seeded from (seed, partition, round),
        and the op ``noise`` when the run draws the code's feature noise per batch
        (``noise-reading = "code"``, ``noise-sigma`` > 0) for a partition of ``num_partitions``
        (None: the client trains on data of its own, ``data-path``, which gets no noise)."""
        ops = parse_augment(cfg["augment"])
        std = 0.0
        if num_partitions is not None and cfg.get("noise-reading", "paper") == "code" and cfg.get("noise-sigma"):
            from tasks.feature_noise import noise_std

            std = noise_std(float(cfg["noise-sigma"]), "code", partition_id, num_partitions)
        if std > 0:  # partition 0 is clean under the code's reading: no op
            ops = (*ops, "noise")
        if not ops:
            return cls((), torch.zeros(1), None)
        from tasks.catalogue import DATASETS

        info = DATASETS[cfg["dataset"]]
        fill = -torch.tensor(info.mean) / torch.tensor(info.std)
        noise = (std / torch.tensor(info.std)).to(device) if std > 0 else None
        generator = torch.Generator(device=device)
        generator.manual_seed(augment_seed(cfg["seed"], partition_id, server_round))
        return cls(ops, fill.to(device), generator, noise)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ops:
            return x
        if x.dim() != 4:
            raise ValueError(f"augmentation needs NCHW image batches, got shape {tuple(x.shape)}")
        if "crop" in self.ops:
            x = self.crop(x)
        if "flip" in self.ops:
            x = self.flip(x)
        if "noise" in self.ops:
            x = self.add_noise(x)
        if "cutout" in self.ops:
            x = self.cutout(x)
        return x

    def _randint(self, high: int, n: int, device: torch.device) -> torch.Tensor:
        return torch.randint(0, high, (n,), generator=self.generator, device=device)

    def crop(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        hp, wp = h + 2 * PAD, w + 2 * PAD
        padded = self.fill.to(x.dtype).expand(n, c, hp, wp).clone()
        padded[:, :, PAD:PAD + h, PAD:PAD + w] = x
        dy = self._randint(2 * PAD + 1, n, x.device)
        dx = self._randint(2 * PAD + 1, n, x.device)
        rows = dy[:, None] + torch.arange(h, device=x.device)  # N x H
        cols = dx[:, None] + torch.arange(w, device=x.device)  # N x W
        # one gather over the flattened padded image (5x faster on CPU than 4-D indexing)
        idx = (rows[:, :, None] * wp + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
        return padded.view(n, c, hp * wp).gather(2, idx).view(n, c, h, w)

    def add_noise(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus fresh Gaussian noise of the client's per-channel std (op ``noise``)."""
        return x + torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype) * self.noise

    def flip(self, x: torch.Tensor) -> torch.Tensor:
        flip = torch.rand(x.shape[0], generator=self.generator, device=x.device) < 0.5
        return torch.where(flip[:, None, None, None], x.flip(3), x)

    def cutout(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        cy = self._randint(h, n, x.device)
        cx = self._randint(w, n, x.device)
        ys = torch.arange(h, device=x.device)
        xs = torch.arange(w, device=x.device)
        # [c - 8, c + 8) clipped to the image, as the FedSOL authors' Cutout(16)
        in_rows = (ys >= cy[:, None] - HOLE // 2) & (ys < cy[:, None] + HOLE // 2)  # N x H
        in_cols = (xs >= cx[:, None] - HOLE // 2) & (xs < cx[:, None] + HOLE // 2)  # N x W
        hole = in_rows[:, :, None] & in_cols[:, None, :]
        return x.masked_fill(hole[:, None], 0.0)
