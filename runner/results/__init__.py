"""Reading finished runs: comparison tables, paired statistics and plots (used by the
ServerApp at the end of a run, the runner and scripts/make_results.py)."""
