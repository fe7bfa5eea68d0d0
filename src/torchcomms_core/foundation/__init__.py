"""What every layer may use: errors, the environment, versions, states, ``TorchWork``.

Imports nothing else of the core.
"""
