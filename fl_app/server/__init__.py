"""The server side of a run: the recording wrapper around a method's strategy and what it
runs each round (screening, participation, drift, checkpoints, tracking), and the start-up."""
