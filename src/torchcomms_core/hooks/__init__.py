"""Hooks shipped with torchcomms: ``NanCheckHook``, the ``clog`` operation log, debug handlers.

The flight recorder lives in ``torchcomms_core.hooks.flight_recorder``; the public
face ``torchcomms.hooks`` gathers all of them. Nothing is imported here, so the flight
recorder can use :mod:`._args` without a cycle.
"""
