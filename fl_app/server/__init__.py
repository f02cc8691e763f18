"""The server side of a run: fl-drift's Flower server (``server.py``, its round loop) and the
parts its steps call (reply checks and records, screening, participation, drift, checkpoints,
tracking), and the start-up."""
