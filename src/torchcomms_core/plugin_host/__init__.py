"""The plugin host: the pluggy manager, hookspecs, built-ins and the entry-point registries.

Imports ``engines``, ``creation``, ``spec``, ``operations`` and ``foundation``; never
the communicator.
"""
