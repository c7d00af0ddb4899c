"""The supply side: the worker agent and reference worker (`worker`), the pool and its autoscaler
(`autoscaler`) and actuators (`actuators`)."""
