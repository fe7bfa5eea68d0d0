"""The plugin host: everything that finds, loads and checks plugins.

- :mod:`.registry`: one entry-point registry class (in-process registrations, lazy
  entry-point discovery, conflicts between distributions, the validation of a loaded
  class, the listing of every name with its source and load status, one family of errors:
  ``BackendNotFoundError`` and ``BackendLoadError``);
- :mod:`.backends`: the backends by name (``torchcomms.backends``), on that registry;
- :mod:`.transports`: the transports by name (``torchcomms.transports``), on that registry,
  and the one transport provider the process uses;
- :mod:`.tuners`: the tuners by name (``torchcomms.tuners``), on that registry, and each
  communicator's tuning;
- :mod:`.manager`, :mod:`.hookspecs`, :mod:`.builtins`, :mod:`.collective`: the pluggy
  manager of collective plugins, their hook specifications, the built-in collectives, and
  the description a collective plugin gives of its operation.

Imports ``engines``, ``creation``, ``spec``, ``operations`` and ``foundation``; never
the communicator.
"""
