"""``torchcomms.hooks.fr``: the flight recorder (re-export)."""

from torchcomms_core.hooks.flight_recorder import FlightRecorderHook

__all__ = ["FlightRecorderHook"]
