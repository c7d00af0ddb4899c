"""Actuators: what starts and stops workers for the autoscaler loop (local processes by default,
the Kubernetes scale subresource, or a dry run that only logs). See `base.py` for the contract."""

from slots.actuators.base import (
    Actuator,
    ActuatorError,
    DecisionRecorder,
    ScaleNote,
    WorkerInfo,
    WorkerPhase,
)

__all__ = ["Actuator", "ActuatorError", "DecisionRecorder", "ScaleNote", "WorkerInfo", "WorkerPhase"]
