"""One mini-batch's gradient, accumulated over packed micro-batches.

``accumulate`` is the body of every optimizer step of ``TandemGRPO.update``: for each micro-batch
(rows packed without padding under a token budget, ``tandem.modules.logprobs.micro_batches``) one
forward of the senior (the rows of one prompt reading one copy of it), its share of the
mini-batch's loss (each token weighted as the whole mini-batch weighs it, ``LossWeights``) and
one backward. The summed gradient is the one a single
pass over the whole mini-batch would give, at any budget; a micro-batch with a share of 0 (a
repeat that keeps the ranks of a distributed run in step) adds nothing. A sharded senior's
gradients stay unreduced on its device until the mini-batch's last micro-batch, whose backward
reduces them once (FSDP2's ``set_requires_gradient_sync``), as verl and TRL accumulate.

What this file leaves out: the optimizer step, the schedule of passes and mini-batches
(``tandem.modules.grpo``) and the objective's algebra (``tandem.modules.loss``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from tandem.modules.logprobs import (
    CHUNK_TOKENS,
    lays_out_rows,
    pack,
    packed_logprobs,
    rows_attention_for,
)
from tandem.modules.loss import LossConfig, LossWeights, grpo_loss
from tandem.modules.sharding import gradient_sync
from tandem.runs.stop import stop_point


@dataclass(frozen=True)
class UpdateBatch:
    """What the loss reads of a batch of rollouts, all rows aligned.

    Attributes:
        ids: ``[N, P + T]`` left-padded prompts then right-padded responses.
        mask: ``[N, P + T]`` 1 on real tokens.
        start: ``P``, where responses begin.
        old: ``[N, T]`` the old log-probs of the ratio.
        ref: ``[N, T]`` the reference's (the junior's) log-probs, or None without a KL term.
        advantages: ``[N]``.
        senior_mask: ``[N, T]`` the tokens of the policy and KL terms.
        junior_mask: ``[N, T]`` the tokens of the imitation term.
    """

    ids: Tensor  # [N, P+T] long
    mask: Tensor  # [N, P+T] long
    start: int
    old: Tensor  # [N, T] float32
    ref: Tensor | None  # [N, T] float32
    advantages: Tensor  # [N] float32
    senior_mask: Tensor  # [N, T] bool
    junior_mask: Tensor  # [N, T] bool


def accumulate(
    model: nn.Module,
    batch: UpdateBatch,
    mini_batch: Tensor,
    parts: list[tuple[Tensor, float]],
    cfg: LossConfig,
    temperature: float,
    backward: Callable[[Tensor], None],
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[dict[str, Tensor], list[Tensor]]:
    """Backward the loss of the rows ``mini_batch`` over its micro-batches ``parts``.

    Args:
        model: the senior.
        batch: the rollouts' tensors.
        mini_batch: ``[n]`` the mini-batch's rows of ``batch``.
        parts: ``(rows, share)`` per micro-batch: rows of ``batch`` (all in ``mini_batch``)
            and the share of their loss to backward (1, or 0 for a repeat).
        cfg: the objective.
        temperature: the loss's log-prob temperature.
        backward: called with each micro-batch's loss (``LightningModule.manual_backward``).
        chunk_tokens: positions per LM-head chunk.

    Returns:
        The mini-batch's statistics (``grpo_loss``'s, summed over its micro-batches) and each
        micro-batch's log-probs ``[len(rows), T]``, detached.
    """
    weights = LossWeights.of(batch.senior_mask[mini_batch], batch.junior_mask[mini_batch], cfg)
    # where each row of the batch sits in the mini-batch
    local = {int(r): i for i, r in enumerate(mini_batch.tolist())}
    totals: dict[str, Tensor] = {}
    seen = []
    share_prompts = lays_out_rows(model)
    device = next(model.parameters()).device
    for k, (rows, share) in enumerate(parts):
        stop_point()  # a signal stops the run here, between micro-batches
        packed = pack(batch.ids[rows], batch.mask[rows], batch.start, share_prompts)
        # the backward inside the block: a checkpointed layer's recomputation reads the rows
        # attention too. Gradients are reduced once a mini-batch, after its last micro-batch
        with rows_attention_for(model, packed, device), gradient_sync(model, k == len(parts) - 1):
            (logp,) = packed_logprobs(model, packed, [temperature], chunk_tokens)  # [n, T]
            loss, stats = grpo_loss(
                logp,
                batch.old[rows].to(device),
                None if batch.ref is None else batch.ref[rows].to(device),
                batch.advantages[rows].to(device),
                batch.senior_mask[rows].to(device),
                batch.junior_mask[rows].to(device),
                cfg,
                weights.rows(rows.new_tensor([local[int(r)] for r in rows.tolist()])),
            )
            backward(loss * share)
        for key, value in stats.items():
            totals[key] = totals.get(key, 0) + value * share
        seen.append(logp.detach())
    return totals, seen
