"""The reward interface: a batch of response texts and their gold answers in, one float each out.

A reward is what the training step calls between generation and the group advantages. It must be
deterministic, bounded in time per item, and it must never raise on what a model wrote: a
malformed response scores 0. What this file leaves out: any particular reward (``boxed_math``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class Reward(ABC):
    """Scores model responses against gold answers."""

    @abstractmethod
    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """One reward per response, in input order.

        Args:
            responses: the model's full response texts.
            golds: the gold answer for each response, aligned with ``responses``.

        Returns:
            ``len(responses)`` floats.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, most rewards hold no resources
        """Release processes or files the reward holds. Calling it twice is harmless."""


def check_aligned(responses: Sequence[str], golds: Sequence[str]) -> None:
    """Raise if the two batches cannot be paired item by item.

    A length mismatch is a bug in the caller (the data module's gold expansion), not model output,
    so it raises instead of scoring 0.
    """
    if len(responses) != len(golds):
        raise ValueError(
            f"got {len(responses)} responses but {len(golds)} golds: a reward scores each "
            "response against its own gold. Repeat each prompt's gold once per rollout."
        )
