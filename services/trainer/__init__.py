"""The trainer worker: takes training jobs off the bus, trains, publishes checkpoints."""
