"""What an operation is: the op table, argument objects, validation, options, reduce ops, hints.

Imports only ``foundation``.
"""
