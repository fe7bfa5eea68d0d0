# Generated from operations/table.py by scripts/gen_face.py: do not edit, rerun it.
"""``OpName``: the operations a communicator runs, numbered as the reference does."""

from __future__ import annotations

import enum

__all__ = ["OpName"]


class OpName(enum.IntEnum):
    """Operations a communicator runs; values are the reference's.

    Written from the operation table (``operations.table.OPS``), so type checkers see the
    members.
    """

    #: The ``send`` operation (``TorchComm.send``).
    send = 0
    #: The ``recv`` operation (``TorchComm.recv``).
    recv = 1
    #: The ``broadcast`` operation (``TorchComm.broadcast``).
    broadcast = 2
    #: The ``all_reduce`` operation (``TorchComm.all_reduce``).
    all_reduce = 3
    #: The ``reduce`` operation (``TorchComm.reduce``).
    reduce = 4
    #: The ``all_gather`` operation (``TorchComm.all_gather``).
    all_gather = 5
    #: The ``all_gather_v`` operation (``TorchComm.all_gather_v``).
    all_gather_v = 6
    #: The ``all_gather_single`` operation (``TorchComm.all_gather_single``).
    all_gather_single = 7
    #: The ``reduce_scatter`` operation (``TorchComm.reduce_scatter``).
    reduce_scatter = 8
    #: The ``reduce_scatter_v`` operation (``TorchComm.reduce_scatter_v``).
    reduce_scatter_v = 9
    #: The ``reduce_scatter_single`` operation (``TorchComm.reduce_scatter_single``).
    reduce_scatter_single = 10
    #: The ``all_to_all_single`` operation (``TorchComm.all_to_all_single``).
    all_to_all_single = 11
    #: The ``all_to_all_v_single`` operation (``TorchComm.all_to_all_v_single``).
    all_to_all_v_single = 12
    #: The ``all_to_all`` operation (``TorchComm.all_to_all``).
    all_to_all = 13
    #: The ``barrier`` operation (``TorchComm.barrier``).
    barrier = 14
    #: The ``scatter`` operation (``TorchComm.scatter``).
    scatter = 15
    #: The ``gather`` operation (``TorchComm.gather``).
    gather = 16
    #: The ``gather_single`` operation (``TorchComm.gather_single``).
    gather_single = 17
    #: ``TorchComm.split``.
    split = 18
    #: ``TorchComm.new_window``.
    new_window = 19
    #: ``BatchSendRecv.issue``.
    batch_op_issue = 20
    #: ``TorchComm.finalize``.
    finalize = 21

    def __str__(self) -> str:
        return self.name
