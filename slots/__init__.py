"""Pool model, worker agent, autoscaler decision and actuators."""
