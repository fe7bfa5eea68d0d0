"""Communicator hooks shipped with torchcomms (the flight recorder).

Re-exports only; the code lives in ``torchcomms_core.pytorch.flight_recorder``.
"""

from torchcomms_core.pytorch.flight_recorder import FlightRecorderHook

__all__ = ["FlightRecorderHook"]
