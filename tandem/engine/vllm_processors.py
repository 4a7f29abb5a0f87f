"""The pen processors: vLLM logits processors that map an engine's batch rows to their ``Pens``.

vLLM has two model runners, each with its own logits-processor interface, and the pair engine
brings one processor for each:

- ``PenProcessorV1`` (``vllm.v1.sample.logits_processor.LogitsProcessor``; vLLM's CPU build, and
  GPUs until a GPU run shows the other exact, see ``tandem.engine.vllm_engine``): vLLM calls
  ``update_state`` before every forward with the batch's changes (``BatchUpdate``: rows added,
  removed, moved). There it reads the token each row wrote at the last step from the request's
  own output list (a live reference, kept across preemptions), and ``apply`` then writes the
  step's authors' logits.
- ``PenProcessorV2`` (``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``: Model
  Runner V2, vLLM's default wherever Triton runs): keyed by the request's persistent slot
  (``add_request`` when a request enters the batch, again after a preemption), with everything
  else in ``apply``, which sees the step's layout (``LogitsContext``): each row's slot, its
  position and the token fed at it, which is the token the row wrote at its last step.

Both call the same ``Pens.feed`` and ``Pens.choose`` (``tandem.engine.vllm_pens``); neither
holds a rule of its own. Rows of a batch no longer in flight (a ``generate`` that failed) are
forgotten at the next step.

The classes are made on first use (``pen_processor``), so that this module imports without
vLLM (the backend registry imports every module of ``tandem.engine``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from tandem.engine.vllm_pair import BOARDS, Board
from tandem.engine.vllm_pens import PENS, Pens, pens_of


@functools.cache
def pen_processor(v2: bool) -> type:
    """The pen processor for vLLM's Model Runner V2 (``v2``) or its V1 runner."""
    return _v2() if v2 else _v1()


def follow_batch(rows: dict[int, Any], update: Any, take: Callable[[Any, list[int]], Any]) -> None:
    """Apply one V1 ``BatchUpdate`` to a processor's ``rows`` (batch row -> what it keeps for
    that request), in the order vLLM defines: removed, added (``take(params, output)``: what to
    keep, or None for a request the processor leaves alone), moved."""
    from vllm.v1.sample.logits_processor import MoveDirectionality

    for i in update.removed:
        rows.pop(i, None)
    for i, params, _, output in update.added:
        rows.pop(i, None)
        kept = take(params, output)
        if kept is not None:
            rows[i] = kept
    for a, b, how in update.moved:
        ra, rb = rows.pop(a, None), rows.pop(b, None)
        if ra is not None:
            rows[b] = ra
        if how == MoveDirectionality.SWAP and rb is not None:
            rows[a] = rb


def _board(vllm_config: Any) -> Board:
    key = getattr(vllm_config.model_config.hf_config, "tandem_board", "")
    return BOARDS.setdefault(key, Board())


def _groups(rows: Iterable[tuple[Any, Pens, int]]) -> list[tuple[Pens, list[Any], list[int]]]:
    """``(what, pens, its row)`` triples grouped by batch: ``(pens, whats, rows)``."""
    groups: dict[int, tuple[Pens, list[Any], list[int]]] = {}
    for at, pens, row in rows:
        group = groups.setdefault(id(pens), (pens, [], []))
        group[1].append(at)
        group[2].append(row)
    return list(groups.values())


def _live(pens: Pens) -> bool:
    return any(p is pens for p in PENS.values())


def _count(pens: Pens, row: int, position: int) -> int:
    """Response tokens of ``row`` whose last is fed at ``position``."""
    return position + 1 - pens.prompts[row]


def _v1() -> type:
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class PenProcessorV1(LogitsProcessor):
        """The pen processor of vLLM's V1 model runner (see the module)."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.board = _board(vllm_config)
            self.rows: dict[int, tuple[Pens, int, list[int]]] = {}  # batch row -> (pens, row, out)

        def is_argmax_invariant(self) -> bool:
            return False  # it forces and restricts tokens, greedy requests included

        def update_state(self, batch_update: Any) -> None:
            self.rows = {k: v for k, v in self.rows.items() if _live(v[0])}
            for pens, outs, rows in _groups((out, p, r) for p, r, out in self.rows.values()):
                pairs = zip(outs, rows, strict=True)
                grew = [(r, out) for out, r in pairs if pens.grew(r, len(out))]
                pens.feed([r for r, _ in grew], [out[-1] for _, out in grew])
            if batch_update is not None:
                follow_batch(self.rows, batch_update, self._take)

        @staticmethod
        def _take(params: Any, output: list[int]) -> tuple[Pens, int, list[int]] | None:
            got = pens_of(params)
            return None if got is None else (*got, output)

        def apply(self, logits: Tensor) -> Tensor:
            step = self.board.step
            if step is None or step.rows != logits.shape[0]:
                return logits  # a warm-up run
            for pens, at, rows in _groups((k, p, r) for k, (p, r, _) in self.rows.items()):
                pens.choose(logits, step, at, rows)
            return logits

    return PenProcessorV1


def _v2() -> type:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

    class PenProcessorV2(LogitsProcessor):
        """The pen processor of vLLM's Model Runner V2 (see the module)."""

        def __init__(self, vllm_config: Any, req_states: Any) -> None:
            self.board = _board(vllm_config)
            self.slots: dict[int, tuple[Pens, int]] = {}  # request slot -> (pens, row)
            self.last: list[tuple[Pens, int]] = []  # the rows of the last step

        def add_request(self, req_idx: int, sampling_params: Any) -> bool:
            got = pens_of(sampling_params)
            if got is None:
                self.slots.pop(req_idx, None)  # a slot's last occupant may have been ours
                return False
            self.slots[req_idx] = got
            return True

        def apply(self, logits: Tensor, ctx: Any) -> Tensor:
            step = self.board.step
            if step is None or step.rows != logits.shape[0]:
                return logits  # a warm-up run
            slots = ctx.expanded_idx_mapping.tolist()  # [R] each row's request slot
            mine = [(r, *self.slots[s]) for r, s in enumerate(slots) if s in self.slots]
            mine = [(r, pens, i) for r, pens, i in mine if _live(pens)]
            if mine:
                fed = ctx.input_ids.tolist()  # [R] the token each row wrote at its last step
                pos = ctx.pos.tolist()  # [R] its position
                for pens, at, rows in _groups(mine):
                    pairs = zip(at, rows, strict=True)
                    grew = [(r, i) for r, i in pairs if pens.grew(i, _count(pens, i, pos[r]))]
                    pens.feed([i for _, i in grew], [fed[r] for r, _ in grew])
                    pens.choose(logits, step, at, rows)
            self._keep([(pens, i) for _, pens, i in mine], step)
            return logits

        def _keep(self, now: list[tuple[Pens, int]], step: Any) -> None:
            """Rows of the last step that are not in this one (finished, or preempted) keep
            their one row of its logits, so that the rest of that step can be freed."""
            here = {(id(p), i) for p, i in now}
            for pens, i in self.last:
                entry = pens.unread[i]
                if (id(pens), i) not in here and entry is not None and entry[0] is not step:
                    pens.unread[i] = (entry[0].keep(entry[1]), 0)
            self.last = now

    return PenProcessorV2
