"""Training-time augmentation (tasks/augment.py): what each op does, seeding, and that only the
local training loop uses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import fedavg
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from tasks.augment import HOLE, PAD, Augment, augment_seed, parse_augment
from tasks.catalogue import DATASETS
from tests.kit import make_client


def _augment(ops: str, dataset: str = "cifar10", seed: int = 0, partition: int = 0, rnd: int = 1) -> Augment:
    cfg = {"augment": ops, "dataset": dataset, "seed": seed}
    return Augment.for_round(cfg, torch.device("cpu"), partition, rnd)


def _batch(n: int = 64, c: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(1))


def test_parse_augment():
    assert parse_augment("none") == () and parse_augment("") == ()
    assert parse_augment("cutout, flip,crop") == ("crop", "flip", "cutout")
    with pytest.raises(ValueError, match="'rotate'.*crop, flip, cutout"):
        parse_augment("crop,rotate")
    with pytest.raises(ValueError, match="'none' cannot be combined"):
        parse_augment("none,crop")


def test_config_refuses_bad_augment():
    with pytest.raises(ConfigError, match="'augment' = 'crop,rotate'.*comma list of crop, flip, cutout"):
        validate_config({"augment": "crop,rotate"})
    with pytest.raises(ConfigError, match="'augment' = 'crop' needs an image dataset"):
        validate_config({"augment": "crop", "dataset": "synthetic", "model": "logreg"})
    assert validate_config({"augment": "crop,flip,cutout", "dataset": "cifar10"})["augment"] == "crop,flip,cutout"


@pytest.mark.parametrize("ops", ["crop", "flip", "cutout", "crop,flip,cutout"])
@pytest.mark.parametrize("dataset,c,size", [("mnist", 1, 28), ("cifar10", 3, 32)])
def test_shape_preserving_and_seeded(ops, dataset, c, size):
    x = _batch(c=c, size=size)
    out = _augment(ops, dataset)(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert not torch.equal(out, x)
    assert torch.equal(_augment(ops, dataset)(x), out)  # same seed, partition, round: same batch
    for other in ({"seed": 1}, {"partition": 1}, {"rnd": 2}):
        assert not torch.equal(_augment(ops, dataset, **other)(x), out)


def test_successive_batches_draw_fresh_randomness():
    aug, x = _augment("crop,flip,cutout"), _batch()
    assert not torch.equal(aug(x), aug(x))


def test_none_is_the_identity():
    x = _batch()
    assert _augment("none")(x) is x


def test_seed_differs_from_the_batch_order_seed():
    assert augment_seed(0, 3, 2) != hash((0, 3, 2)) & 0x7FFFFFFF
    assert len({augment_seed(s, p, r) for s in range(3) for p in range(3) for r in range(1, 4)}) == 27


def test_crop_is_a_shift_of_at_most_4_pixels_with_black_padding():
    n, size = 200, 32
    # distinct values, so every window of the padded image is recognisable
    x = torch.arange(n * 3 * size * size, dtype=torch.float32).view(n, 3, size, size)
    out = _augment("crop")(x)
    info = DATASETS["cifar10"]
    fill = -torch.tensor(info.mean) / torch.tensor(info.std)
    padded = fill.view(1, 3, 1, 1).expand(n, 3, size + 2 * PAD, size + 2 * PAD).clone()
    padded[:, :, PAD:-PAD, PAD:-PAD] = x
    shifts = []
    for i in range(n):
        matches = [(dy, dx) for dy in range(2 * PAD + 1) for dx in range(2 * PAD + 1)
                   if torch.equal(out[i], padded[i, :, dy:dy + size, dx:dx + size])]
        assert len(matches) == 1, f"sample {i} is not one shifted window"
        shifts.append(matches[0])
    # every one of the 81 offsets is possible; 200 draws reach most of them, both extremes included
    assert len(set(shifts)) > 60
    assert {dy for dy, _ in shifts} == set(range(2 * PAD + 1))


def test_flip_mirrors_about_half_the_samples():
    x = _batch(n=400)
    out = _augment("flip")(x)
    same = [torch.equal(out[i], x[i]) for i in range(len(x))]
    mirrored = [torch.equal(out[i], x[i].flip(2)) for i in range(len(x))]
    assert all(s != m for s, m in zip(same, mirrored))  # each sample is one or the other
    assert 150 < sum(mirrored) < 250


def _interval(mask_1d: np.ndarray) -> tuple[int, int]:
    idx = np.flatnonzero(mask_1d)
    assert len(idx) and np.all(np.diff(idx) == 1), "hole is not one contiguous block"
    return int(idx[0]), int(idx[-1]) + 1


def test_cutout_zeroes_one_clipped_16x16_square_in_every_channel():
    n, size = 300, 32
    x = torch.ones(n, 3, size, size)
    out = _augment("cutout")(x)
    assert set(out.unique().tolist()) == {0.0, 1.0}
    full = 0
    for i in range(n):
        hole = (out[i] == 0).numpy()
        assert (hole == hole[0]).all(), "the hole differs between channels"
        hole = hole[0]
        y0, y1 = _interval(hole.any(1))
        x0, x1 = _interval(hole.any(0))
        assert hole[y0:y1, x0:x1].all() and hole.sum() == (y1 - y0) * (x1 - x0)  # a rectangle
        for lo, hi in ((y0, y1), (x0, x1)):
            # [c - 8, c + 8) clipped, centre c in [0, size): 16 wide unless cut by a border
            assert HOLE // 2 <= hi - lo <= HOLE
            assert hi - lo == HOLE or lo == 0 or hi == size
        full += (y1 - y0, x1 - x0) == (HOLE, HOLE)
    # unclipped in both axes when the centre is in [8, 24]^2: probability (17/32)^2 = 0.28
    assert abs(full / n - (17 / 32) ** 2) < 0.1


def _client(augment: str):
    torch.manual_seed(0)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    over = {"dataset": "mnist", "model": "cnn-small", "augment": augment, "batch-size": 16, "local-epochs": 1}
    return make_client(fedavg.UPDATE, over, x, y)


def test_only_training_batches_are_augmented(monkeypatch):
    """fit augments each of its batches once; evaluate (the client's) never does, so it equals
    the unaugmented evaluation; with augmentation the trained weights differ."""
    calls = []
    original = Augment.__call__

    def spy(self, x):
        if self.ops:
            calls.append(x.shape[0])
        return original(self, x)

    monkeypatch.setattr(Augment, "__call__", spy)
    plain, augmented = _client("none"), _client("crop,flip,cutout")
    start = plain.get_parameters({})
    loss_plain = plain.evaluate(start, {})
    loss_aug = augmented.evaluate(start, {})
    assert calls == [] and loss_plain == loss_aug
    w_plain, _, _ = plain.fit(start, {"server-round": 1})
    assert calls == []
    w_aug, _, _ = augmented.fit(start, {"server-round": 1})
    assert calls == [16, 16, 16, 16]  # 64 samples, batch 16, one epoch
    assert any(not np.allclose(a, b) for a, b in zip(w_plain, w_aug))
    augmented.evaluate(w_aug, {})
    assert len(calls) == 4
