"""The c10d bridge: torchcomms communicators serving ``torch.distributed`` as ProcessGroups.

The ProcessGroup wrapper, c10d ops and their arguments, works, profiling, groups, the
monitored barrier, p2p batching and the engine lane of the flight recorder. Nothing is
imported here: ``torch.distributed`` imports parts of this package while it is itself
half-initialised, so each module is imported on its own, when needed.
"""
