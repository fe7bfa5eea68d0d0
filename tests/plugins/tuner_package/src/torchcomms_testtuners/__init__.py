"""Tuners that misbehave, each in its own way, for torchcomms' tests (#45)."""

from __future__ import annotations

from torchcomms_core.plugin import Choice, Query, Tuner, TunerContext


class RaisingTuner(Tuner):
    """Raises on every question."""

    def choose(self, query: Query) -> Choice | None:
        raise RuntimeError(f"tuner exploded on {query.op}")


class NonsenseTuner(Tuner):
    """Answers an algorithm no backend has, and a string instead of a Choice for
    all_to_all_single."""

    def choose(self, query: Query) -> Choice | None:
        if query.op == "all_to_all_single":
            return "fast"  # type: ignore[return-value]
        return Choice("warp-drive", {"factor": 9})


class BadParamsTuner(Tuner):
    """Answers a real algorithm with a parameter it does not take."""

    def choose(self, query: Query) -> Choice | None:
        return Choice("chunked", {"turbo": True})


class BrokenInitTuner(Tuner):
    """Fails to start."""

    def __init__(self, context: TunerContext) -> None:
        raise OSError("cannot open /nonexistent/tuner.db")

    def choose(self, query: Query) -> Choice | None:  # pragma: no cover - never made
        return None
