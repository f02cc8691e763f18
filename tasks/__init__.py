"""Models, data loading and partitioning, and the train/eval loops."""
