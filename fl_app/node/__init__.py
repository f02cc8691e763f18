"""The node side of a run: ``NodeClient`` around a method's client (faults, attacks, state
mirror, warm-up); on a cohort run's node, ``CohortClient`` (many virtual clients trained in one
``cohort_round``, each in its own ``NodeClient``) and the wire codec it shares with the server
(``cohort_wire``). Imports nothing from ``fl_app.server``."""
