"""``torchcomms-exampletuner``: a complete tuner plugin, in the style of UCC's score maps.

The tuner ``scoremap`` reads rules from the communicator hint ``tuner.scoremap`` or, without it,
the environment variable ``TORCHCOMM_SCOREMAP``::

    TORCHCOMM_SCOREMAP="shm:all_reduce:0-64K:chunked;shm:all_to_all_single:1M-:direct"

Each rule is ``backend:op:range:algorithm[:param=value,...]``; a range is ``lo-hi`` with
``K``/``M``/``G`` suffixes, either end may be left open. The first rule whose backend and
operation match and whose range holds the query's size bucket answers; no rule: ``None``
(the backend's default rule). The rules text is the fingerprint, so ranks given different
rules fall back to the default rules together.

Install it (``pip install examples/tuner_plugin``) and select it with
``TORCHCOMM_TUNER=scoremap`` or the hint ``tuner=scoremap``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torchcomms_core.plugin import Choice, Query, Tuner, TunerContext

__all__ = ["ENV", "Rule", "ScoreMapTuner", "parse_rules"]

#: The environment variable holding the rules when the communicator has no hint.
ENV = "TORCHCOMM_SCOREMAP"

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Rule:
    """One rule: where it applies and what it answers."""

    backend: str
    op: str
    lo: int
    hi: int | None
    choice: Choice


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in _SUFFIX else ""
    return int(text[: len(text) - len(unit)]) * _SUFFIX[unit]


def _value(text: str) -> int | float | str | bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_rules(text: str) -> list[Rule]:
    """The rules of ``text`` (``;``-separated).

    Raises:
        ValueError: a rule that does not read as ``backend:op:range:algorithm[:params]``.
    """
    rules = []
    for raw in filter(None, (r.strip() for r in text.split(";"))):
        parts = raw.split(":")
        if len(parts) not in (4, 5):
            raise ValueError(
                f"scoremap rule {raw!r}: expected backend:op:range:algorithm[:k=v,...]"
            )
        backend, op, span, algorithm = parts[:4]
        lo_text, _, hi_text = span.partition("-")
        params = {}
        if len(parts) == 5:
            for item in filter(None, parts[4].split(",")):
                key, _, value = item.partition("=")
                params[key.strip()] = _value(value.strip())
        rules.append(
            Rule(
                backend.strip(),
                op.strip(),
                _size(lo_text) if lo_text.strip() else 0,
                _size(hi_text) if hi_text.strip() else None,
                Choice(algorithm.strip(), params),
            )
        )
    return rules


class ScoreMapTuner(Tuner):
    """Answers from the rules of the hint ``tuner.scoremap`` or ``TORCHCOMM_SCOREMAP``."""

    def __init__(self, context: TunerContext) -> None:
        super().__init__(context)
        self.text = context.hints.get("tuner.scoremap") or os.environ.get(ENV, "")
        # A malformed map raises here: the core reports it once and uses the defaults.
        self.rules = [r for r in parse_rules(self.text) if r.backend == context.backend]

    def choose(self, query: Query) -> Choice | None:
        """The first rule of the query's operation whose range holds its size bucket."""
        for rule in self.rules:
            if (
                rule.op == query.op
                and rule.lo <= query.nbytes
                and (rule.hi is None or query.nbytes <= rule.hi)
            ):
                return rule.choice
        return None

    def fingerprint(self) -> str:
        """The rules' text: ranks with other rules would answer otherwise."""
        return self.text
