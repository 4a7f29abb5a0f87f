"""Verifiable rewards. Importing this package registers every reward in ``REWARDS``.

What this file leaves out: everything but the imports that register the members.
"""

from __future__ import annotations

from tandem.rewards.base import Reward
from tandem.rewards.boxed_math import BoxedMathReward, count_reasons
from tandem.rewards.verify import REASONS, Verdict

__all__ = ["REASONS", "BoxedMathReward", "Reward", "Verdict", "count_reasons"]
