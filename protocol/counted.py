"""The two fit-instruction keys by which the server tells a client which of its rounds the
method counted (the server's side: ``fl_app.server.counted``; the client's:
``fl_app.node.client_state.RevertibleStore``)."""

ROLLBACK = "state-rollback"  # True in every instruction of a run that screens: the clients keep a copy to go back to
COUNTED = "state-counted-round"  # per client: the last round whose reply the method aggregated (0: none yet)
