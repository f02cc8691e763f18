"""Reading finished runs: comparison tables, paired statistics and plots (used by the runner
and scripts/make_results.py; the run folder's files are read through ``fl_app.common.run_files``)."""
