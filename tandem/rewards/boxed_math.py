r"""The ``boxed_math`` reward: 1.0 when the last ``\boxed{}`` of a response equals the gold answer.

Per item: strict extraction of the last box, or of the group of boxes that ends the response
(``extract.final_answer``: boxes that hedge between alternatives score 0 as ``wrong``), then a
verdict. Cheap items (no box,
identical text, two plain integers) are decided in this process; the rest go to a pool of worker
processes (``pool``) where each has a hard deadline, so nothing a model writes can crash or hang a
training step. Every verdict carries a reason for logging: ``correct``, ``wrong``, ``no_box``,
``unparsable`` (including answers refused as too costly to evaluate) or ``timeout``.

What this file leaves out: parsing and equivalence (``parse``, ``equivalence``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tandem.registry import REWARDS
from tandem.rewards.base import Reward, check_aligned
from tandem.rewards.extract import final_answer
from tandem.rewards.pool import VerifierPool
from tandem.rewards.verify import NO_BOX, REASONS, WRONG, Verdict, quick_verdict


@REWARDS.register("boxed_math")
class BoxedMathReward(Reward):
    """Binary reward for math answers in ``\\boxed{}``, compared by mathematical equivalence.

    Args:
        timeout: seconds each item may take in a worker before it scores 0 (``timeout``).
        workers: worker processes; they start at the first batch that needs them.
        rel_tol: relative tolerance when an answer is written with decimals (``0.333`` is not
            ``1/3``; ``0.3333333333333`` is).
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``.

    Example:
        >>> reward = BoxedMathReward()
        >>> reward.score([r"so \\boxed{\\frac{1}{2}}", "no box"], ["0.5", "1"])
        [1.0, 0.0]
    """

    def __init__(
        self,
        timeout: float = 2.0,
        workers: int = 2,
        rel_tol: float = 1e-9,
        start_method: str | None = None,
    ) -> None:
        problems = []
        if not timeout > 0:
            problems.append(f"timeout ({timeout}) must be > 0 seconds")
        if not (isinstance(workers, int) and workers >= 1):
            problems.append(f"workers ({workers}) must be an integer >= 1")
        if not 0 <= rel_tol < 1:
            problems.append(f"rel_tol ({rel_tol}) must be in [0, 1); 1e-9 is the default")
        if problems:
            raise ValueError("BoxedMathReward: " + "; ".join(problems) + ".")
        self.timeout, self.workers, self.rel_tol = timeout, workers, rel_tol
        self.start_method = start_method
        self._pool: VerifierPool | None = None
        self._pool_lock = threading.Lock()  # two threads' first batches must share one pool

    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """1.0 or 0.0 per response, in input order."""
        return [v.score for v in self.verify(responses, golds)]

    def verify(self, responses: Sequence[str], golds: Sequence[str]) -> list[Verdict]:
        """A ``Verdict(score, reason)`` per response, in input order."""
        check_aligned(responses, golds)
        verdicts: list[Verdict | None] = [None] * len(responses)
        pending: list[tuple[int, str, str]] = []
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            final = final_answer(response) if isinstance(response, str) else None
            gold = str(gold)
            if final is None:
                verdicts[i] = NO_BOX
            elif final.hedged:
                verdicts[i] = WRONG
            elif (quick := quick_verdict(final.content, gold)) is not None:
                verdicts[i] = quick
            else:
                pending.append((i, final.content, gold))
        if pending:
            pooled = self._get_pool().run([(content, gold) for _, content, gold in pending])
            for (i, _, _), verdict in zip(pending, pooled, strict=True):
                verdicts[i] = verdict
        return verdicts  # type: ignore[return-value] - every slot is filled above

    def close(self) -> None:
        """Stop the worker processes; a later call to ``score`` starts new ones."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _get_pool(self) -> VerifierPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = VerifierPool(
                    self.workers, self.timeout, self.rel_tol, self.start_method
                )
            return self._pool

    def __enter__(self) -> BoxedMathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Processes and locks do not pickle; a copy (e.g. in a DDP spawn) starts its own pool.
        state = {**self.__dict__, "_pool": None}
        del state["_pool_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()


def count_reasons(verdicts: Iterable[Verdict]) -> dict[str, int]:
    """How many verdicts had each reason, every reason present (for ``train/reward/<reason>``)."""
    counts = Counter(v.reason for v in verdicts)
    return {reason: counts.get(reason, 0) for reason in REASONS}
