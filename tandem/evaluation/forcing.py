"""Teacher forcing: every model's full next-token distribution at every response position.

Drift (KL to the base) and legibility (the junior's cross-entropy and overlap) compare whole
distributions at the positions of a text that was already written, so they need one forward
pass per model over ``[prompt | response]``, not new sampling. Rows are left-padded prompts and
right-padded responses (as ``Rollouts`` hold them); explicit positions count real tokens only,
so padding never shifts a row. Work runs in chunks of rows, each trimmed to its longest response;
the forward stops before the LM head (its last hidden states), and the logits are taken a window
of about ``chunk_tokens`` positions at a time, so a 151k vocabulary never holds
``[rows, 3,000 tokens, vocabulary]``.

A junior of another vocabulary cannot be forced on the senior's tokens: ``junior_logprobs``
re-tokenizes each row's prompt and response text into the junior's own tokens and forces it on
those, for legibility per byte (``tandem.metrics.per_byte``).

What this file leaves out: what is computed from the distributions (``tandem.metrics``) and the
log-probs of the policy update (``tandem.modules.logprobs``, which keeps only emitted tokens).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.modules.logprobs import CHUNK_TOKENS, head_swapped


@dataclass(frozen=True)
class Forced:
    """A window of rows and response columns with every model's distributions at its positions.

    Attributes:
        rows: which rows of the input this window holds.
        cols: which response columns (``tokens`` and ``mask`` are the input's at ``cols``).
        tokens: response ids.
        mask: real response tokens.
        logits: one ``[n, t, V]`` tensor per model, in the order the models were given.
    """

    rows: Tensor  # [n] long
    cols: slice
    tokens: Tensor  # [n, t] long
    mask: Tensor  # [n, t] bool
    logits: list[Tensor]  # each [n, t, V]


def response_hidden(
    model: torch.nn.Module, prompt_tokens: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor
) -> Tensor:
    """``[N, T, H]`` the last hidden states that predict each response token (what the LM head
    reads), so that the logits can be taken a window of positions at a time.

    Args:
        model: a Hugging Face causal LM.
        prompt_tokens: ``[N, P]`` left-padded prompt ids.
        prompt_mask: ``[N, P]`` 1 on real prompt tokens.
        tokens: ``[N, T]`` right-padded response ids.
        mask: ``[N, T]`` 1 on real response tokens.
    """
    device = next(model.parameters()).device
    ids = torch.cat([prompt_tokens, tokens], dim=1).to(device)  # [N, P+T]
    attention = torch.cat([prompt_mask, mask], dim=1).to(device).long()  # [N, P+T]
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # [N, P+T]
    with torch.inference_mode(), head_swapped(model, torch.nn.Identity()):
        hidden = model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False
        ).logits
    p = prompt_tokens.shape[1]
    # the state at position i predicts token i+1: responses start after the last prompt token
    return hidden[:, p - 1 : -1]  # [N, T, H]


def forced_chunks(
    models: Sequence[torch.nn.Module],
    prompt_tokens: Tensor,
    prompt_mask: Tensor,
    tokens: Tensor,
    mask: Tensor,
    batch_size: int,
    chunk_tokens: int = CHUNK_TOKENS,
) -> Iterator[Forced]:
    """Teacher-force every model on the same rows, ``batch_size`` rows a forward, the logits of
    at most about ``chunk_tokens`` positions at once (never ``[rows, tokens, vocabulary]``).

    Args:
        models: the models to compare (e.g. senior and junior); logits come back in this order,
            on each model's own device.
        prompt_tokens, prompt_mask: ``[N, P]`` left-padded prompts and their mask.
        tokens, mask: ``[N, T]`` right-padded responses and their mask.
        batch_size: rows per forward pass.
        chunk_tokens: positions (rows x columns) whose logits are held at once.
    """
    assert batch_size >= 1, f"batch_size ({batch_size}) must be a positive number of rows"
    mask = mask.bool()
    lengths = mask.sum(1)  # [N]
    for lo in range(0, tokens.shape[0], batch_size):
        rows = torch.arange(lo, min(lo + batch_size, tokens.shape[0]))  # [n]
        t = max(1, int(lengths[rows].max()))
        chunk = (prompt_tokens[rows], prompt_mask[rows], tokens[rows, :t], mask[rows, :t])
        hidden = [response_hidden(m, *chunk) for m in models]  # each [n, t, H]
        width = max(1, chunk_tokens // len(rows))
        for c in range(0, t, width):
            cols = slice(c, min(c + width, t))
            with torch.inference_mode():
                pairs = zip(models, hidden, strict=True)
                logits = [m.get_output_embeddings()(h[:, cols]) for m, h in pairs]
            yield Forced(rows, cols, chunk[2][:, cols], chunk[3][:, cols], logits)


def junior_logprobs(
    junior: torch.nn.Module,
    junior_tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[str],
    batch_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The junior's log-prob of each of its own tokens of ``responses`` after ``prompts`` (in
    its own ids and chat format).

    Returns:
        ``logprobs [N, T']``, the junior's response ids ``[N, T']`` and their mask ``[N, T']``.
    """
    enc = lambda texts: junior_tokenizer(list(texts), add_special_tokens=False)["input_ids"]  # noqa: E731
    p_ids, r_ids = [list(p) for p in prompts], enc(responses)
    prompt_tokens, prompt_mask = _pad(p_ids, left=True)  # [N, P']
    tokens, mask = _pad(r_ids, left=False)  # [N, T']
    out = torch.zeros(tokens.shape)
    for chunk in forced_chunks([junior], prompt_tokens, prompt_mask, tokens, mask, batch_size):
        logits = chunk.logits[0].float()  # [n, t, V]
        picked = logits.log_softmax(-1).gather(-1, chunk.tokens.to(logits.device)[..., None])
        out[chunk.rows, chunk.cols] = torch.where(chunk.mask, picked.squeeze(-1).cpu(), 0.0)
    return out, tokens, mask


def _pad(rows: Sequence[Sequence[int]], left: bool) -> tuple[Tensor, Tensor]:
    """``ids [N, W]`` padded with 0 (left or right) and their ``mask [N, W]`` (bool)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, cols] = torch.tensor(r, dtype=torch.long)
        mask[i, cols] = True
    return ids, mask
