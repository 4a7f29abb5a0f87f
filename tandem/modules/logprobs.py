"""Teacher-forced log-probs of rollout tokens under a model, for the policy update.

The rollout carries its prompt as left-padded ids and its response as right-padded ids, so one
forward over ``[prompt | response]`` with explicit positions reads every row correctly whatever
its padding. Log-softmax runs in chunks of rows so that a 151k vocabulary does not hold a
``[N, T, V]`` float32 tensor in memory at once.

What this file leaves out: sampling (``tandem.engine``) and the loss (``tandem.modules.loss``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def sequence_logprobs(
    model: torch.nn.Module,
    ids: Tensor,
    mask: Tensor,
    response_start: int,
    temperature: float | Sequence[float] = 1.0,
) -> Tensor | list[Tensor]:
    """Log-prob of each response token given everything before it.

    Args:
        model: a Hugging Face causal LM.
        ids: ``[N, P + T]`` left-padded prompts followed by right-padded responses
            (``Rollouts.sequences()``).
        mask: ``[N, P + T]`` 1 on real tokens.
        response_start: ``P``, where responses begin.
        temperature: divides the logits first (1: the model's own distribution). A sequence of
            temperatures gives one result each from the same forward pass.

    Returns:
        ``[N, T]`` float32 log-probs, 0 where the response is padding (a list of them, one per
        temperature, when ``temperature`` is a sequence).
    """
    temps = [temperature] if isinstance(temperature, int | float) else list(temperature)
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device).long()  # [N, P+T]
    # positions count real tokens only, so left padding does not shift the prompt
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [N, P+T]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    # the logit at position i predicts token i+1: responses start after the last prompt token
    logits = logits[:, response_start - 1 : -1]  # [N, T, V]
    targets = ids[:, response_start:]  # [N, T]
    outs = [torch.empty(targets.shape, dtype=torch.float32, device=device) for _ in temps]
    rows = max(1, (1 << 24) // max(1, logits.shape[1] * logits.shape[2]))
    for lo in range(0, targets.shape[0], rows):
        chunk = logits[lo : lo + rows].float()  # [n, T, V]
        picked_ids = targets[lo : lo + rows].unsqueeze(-1)  # [n, T, 1]
        for out, t in zip(outs, temps, strict=True):
            scaled = chunk if t == 1.0 else chunk / t
            out[lo : lo + rows] = scaled.log_softmax(-1).gather(-1, picked_ids).squeeze(-1)
    response_mask = mask[:, response_start:]
    outs = [out * response_mask for out in outs]
    return outs[0] if isinstance(temperature, int | float) else outs
