"""The node side of a run: ``NodeClient`` around a method's client (faults and attacks,
``attacks``; where its state lives between rounds, ``client_state``; warm-up); on a cohort run's
node, ``CohortClient`` (many virtual clients trained in one ``cohort_round``, through the same
functions and stores), which speaks the wire codec it shares with the server
(``protocol.cohort``). Imports nothing from ``fl_app.server``."""
