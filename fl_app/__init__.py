"""fl-drift's Flower app, what runs inside a Flower run: the ServerApp and ClientApp (entry
points), the run config, the server (``server/``), the node (``node/``), the method registry and
the shared bottom room (``common/``); ``api.py`` is its one public entry for code outside a
Flower run. The runner that launches runs and writes reports is ``runner``, which this package
never imports."""
