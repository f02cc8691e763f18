"""The runner: what launches runs and writes their reports, outside any Flower run (the
experiment plan, the local simulation and deployment launchers, process management, listing,
the output filter), and ``runner.results``, which reads finished runs. Nothing in ``fl_app``
imports it."""
