"""Redis as the bus: the embedded server, and the per-task log of labelled examples."""
