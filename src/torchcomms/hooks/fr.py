"""``torchcomms.hooks.fr``: the flight recorder (re-export)."""

from torchcomms_core.pytorch.flight_recorder import FlightRecorderHook

__all__ = ["FlightRecorderHook"]
