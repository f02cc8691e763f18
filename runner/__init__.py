"""Developer tooling that runs outside a Flower run: the runner's plan, listing and output
filter, the local simulation and deployment launchers, and process management (``procfs``)."""
