"""References for the vLLM pair's pens that need no vLLM: the sampler's scalar replay over a
rollout's own tokens with the batch's coins (``replay``), and ``Pens`` driven over a script of
tokens with logits made up (``pens_authors``), the way the pen processors drive it."""

from __future__ import annotations

import torch

from tandem.engine import Rollouts, SamplingParams
from tandem.engine.vllm_pair import Step
from tandem.engine.vllm_pens import FORCED, Pens, coins


def replay(sampler, r: Rollouts, params: SamplingParams) -> tuple[torch.Tensor, list[int]]:
    """``[N, T]`` the authors a scalar replay of ``sampler`` gives the rollout's own tokens,
    row by row, with the batch's coins; and where each row's schedule ended (its length if
    never). A retraction is replayed on the token that replaced the proposal: a withdrawn
    proposal leaves the same state whichever onset it was, and the redraw is an onset too."""
    n, t = r.tokens.shape
    budget = max(params.budget(int(k)) for k in r.prompt_lengths)
    first, coin, _ = coins(n, budget, params.seed)
    authors = torch.full((n, t), -1)
    ends = []
    for i in range(n):
        state = sampler.start(r.prompt_tokens[i, -1:], first[i : i + 1]).state
        end = int(r.lengths[i])
        for j in range(int(r.lengths[i])):
            token = r.tokens[i, j : j + 1]
            h = sampler.step(state, token, coin[i, j, 0].view(1))
            if h.retract is not None and bool(h.retract[0]):
                state = h.state  # the new author redraws position j
                h = sampler.step(state, token, coin[i, j, 1].view(1))
            authors[i, j] = int(state["author"][0])
            state = h.state
            if h.done is not None and bool(h.done[0]):
                end = j + 1
                break
        ends.append(end)
    return authors, ends


def pens_authors(sampler, context: int, script: list[int], seed: int, vocab: int) -> list[int]:
    """The authors ``Pens`` gives one row writing ``script`` after ``context`` (a proposal the
    pen forces replaces the script's token there), stepped as a processor steps it."""
    params = SamplingParams(max_new_tokens=len(script), eos_token_ids=(), seed=seed)
    pens = Pens(sampler, params, torch.tensor([context]), [1], len(script), stop=0)
    for token in script:
        logits = torch.zeros(1, vocab)  # [1, V]: every token as likely, for both models
        pens.choose(logits, Step.of(logits, logits.clone()), [0], [0])
        written = int(pens.proposal[0]) if int(pens.pending[0]) == FORCED else token
        pens.feed([0], [written])
    return [author for _, author, _, _ in pens.written[0]]
