"""``PartitionSpec``: everything a partitioning of a dataset depends on, read from the run
config. Shared by the partitioning, its on-disk cache and the synthetic dataset."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.datasets import resolve_data_dir


@dataclass(frozen=True)
class PartitionSpec:
    """How the training split is cut into client partitions (hashable: a cache key)."""

    dataset: str
    num_partitions: int
    partitioner: str = "dirichlet"
    alpha: float = 0.3
    shards_per_client: int = 2
    min_partition_size: int = 10
    seed: int = 0
    data_dir: str = ""
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    validation_fraction: float = 0.0  # held out of the training split before it is partitioned
    classes_per_client: int = 2  # pathological: the k of NIID-Bench's #C = k
    size_sigma: float = 0.0  # inner-dirichlet: lognormal spread of the client sizes (0 = equal)
    noise_sigma: float = 0.0  # feature noise: client i of N gets variance noise_sigma * (i + 1) / N
    noise_reading: str = "paper"  # feature noise: the paper's words or NIID-Bench's code (tasks/feature_noise.py)
    dirichlet_balance: bool = False  # dirichlet: NIID-Bench's balancing (tasks.partitioners.balanced_dirichlet_indices)

    @classmethod
    def from_config(cls, cfg: dict, num_partitions: int) -> PartitionSpec:
        return cls(
            dataset=cfg["dataset"],
            num_partitions=num_partitions,
            partitioner=cfg["partitioner"],
            alpha=cfg["alpha"],
            shards_per_client=cfg["shards-per-client"],
            min_partition_size=cfg["min-partition-size"],
            seed=cfg["seed"],
            data_dir=resolve_data_dir(cfg["data-dir"]),
            synthetic_alpha=cfg["synthetic-alpha"],
            synthetic_beta=cfg["synthetic-beta"],
            validation_fraction=cfg["validation-fraction"],
            # keys added later: a config recorded before them (an old summary.json) reads as their default
            classes_per_client=cfg.get("classes-per-client", cls.classes_per_client),
            size_sigma=cfg.get("size-sigma", cls.size_sigma),
            noise_sigma=cfg.get("noise-sigma", cls.noise_sigma),
            noise_reading=cfg.get("noise-reading", cls.noise_reading),
            dirichlet_balance=cfg.get("dirichlet-balance", cls.dirichlet_balance),
        )

    def identity(self) -> dict:
        """The fields that decide which examples each client gets, under their run-config key
        names: the data folder is left out (a machine path: the data's own fingerprint, in
        ``fl_app/server/provenance.py``, stands for it), and so are the keys this partitioner
        does not read (``alpha`` for ``iid``, say), so two runs that cut the same partitions
        have the same identity. ``num-partitions`` counts the clients the data is cut for."""
        out: dict = {"dataset": self.dataset, "num-partitions": self.num_partitions, "seed": self.seed}
        if self.dataset == "synthetic":  # generated per device: the partitioner is not used
            return {**out, "synthetic-alpha": float(self.synthetic_alpha),
                    "synthetic-beta": float(self.synthetic_beta)}
        out["partitioner"] = self.partitioner
        if self.validation_fraction:  # left out at 0, so runs made before the key keep their identity
            out["validation-fraction"] = float(self.validation_fraction)
        if self.noise_sigma:  # left out at 0, as validation-fraction
            out["noise-sigma"] = float(self.noise_sigma)
            if self.noise_reading != "paper":  # left out at its default, so kept runs keep their identity
                out["noise-reading"] = self.noise_reading
        if self.partitioner in ("dirichlet", "quantity"):
            out.update({"alpha": float(self.alpha), "min-partition-size": self.min_partition_size})
            if self.partitioner == "dirichlet" and self.dirichlet_balance:  # left out when off, as noise-sigma
                out["dirichlet-balance"] = True
        elif self.partitioner == "shard":
            out["shards-per-client"] = self.shards_per_client
        elif self.partitioner == "pathological":
            out["classes-per-client"] = self.classes_per_client
        elif self.partitioner == "inner-dirichlet":
            out.update({"alpha": float(self.alpha), "size-sigma": float(self.size_sigma)})
        return out
