"""fl-drift Flower app: ServerApp, ClientApp, run config and the method registry."""
