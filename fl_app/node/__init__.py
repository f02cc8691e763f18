"""The node side of a run: ``NodeClient`` around a method's client (faults, attacks, state
mirror, warm-up). Imports nothing from ``fl_app.server``."""
