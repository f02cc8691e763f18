"""Client side of each method: a NumPyClient subclass doing the method's local update."""
