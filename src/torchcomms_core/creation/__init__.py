"""How the ranks of a communicator find each other: launcher bootstrap, self-hosted
rendezvous, the join barrier, names claimed in the store, and the record of the c10d group
being created. ``new_comm`` itself (``comm.create``) puts these together.

Imports ``spec``, ``operations`` and ``foundation``.
"""
