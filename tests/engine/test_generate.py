"""generate(): caches, log-probs, alignment, seeds and sampling parameters, on the tiny world."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import PAD, SENIOR, Rollouts, SamplingParams, StopReason, generate
from tandem.samplers import (
    SentenceSampler,
    SoloSampler,
    StepSampler,
    TokenSampler,
    WordSampler,
)
from tandem.samplers.boundaries import step_end, word_onset

SAMPLERS = {
    "solo": lambda tok: SoloSampler(),
    "token": lambda tok: TokenSampler(p=0.5),
    "word": lambda tok: WordSampler(tok, p=0.5),
    "word_after_boundary": lambda tok: WordSampler(tok, p=0.5, rule="after_boundary"),
    "sentence": lambda tok: SentenceSampler(tok),
    "step": lambda tok: StepSampler(tok),
}


def teacher_forced(model, r: Rollouts) -> torch.Tensor:
    """``[N, T]`` each response token's log-prob, recomputed in one pass over prompt+response."""
    ids, mask = r.sequences()
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    p = r.prompt_tokens.shape[1]
    lp = logits[:, p - 1 : -1].float().log_softmax(-1)
    return torch.where(r.mask, lp.gather(-1, r.tokens[..., None]).squeeze(-1), 0.0)


def check_alignment(r: Rollouts, prompts, params: SamplingParams, eos, tokenizer) -> None:
    """Tokens, authors and log-probs line up: padding, EOS and max length."""
    n, t = r.tokens.shape
    g = params.samples_per_prompt
    assert n == len(prompts) * g and t == int(r.lengths.max()) <= params.max_new_tokens
    for i in range(n):
        k = int(r.lengths[i])
        assert k >= 1
        assert ((r.authors[i, :k] == 0) | (r.authors[i, :k] == 1)).all()
        assert (r.authors[i, k:] == PAD).all() and (r.tokens[i, k:] == r.pad_token_id).all()
        for lp in (r.senior_logprobs, r.junior_logprobs):
            if lp is not None:
                assert (lp[i, k:] == 0).all() and torch.isfinite(lp[i, :k]).all()
                assert (lp[i, :k] <= 1e-6).all()
        is_eos = torch.isin(r.tokens[i, :k], torch.tensor(eos))
        assert not is_eos[:-1].any(), "a row went on after an EOS"
        if r.stop_reasons[i] == StopReason.EOS:
            assert is_eos[-1]
        else:
            assert r.stop_reasons[i] == StopReason.LENGTH and k == params.max_new_tokens
        prompt = prompts[i // g]
        assert int(r.prompt_index[i]) == i // g and int(r.prompt_lengths[i]) == len(prompt)
        assert r.prompt_tokens[i, -len(prompt) :].tolist() == list(prompt)
        assert (r.prompt_tokens[i, : -len(prompt)] == r.pad_token_id).all()
        text = tokenizer.decode(r.tokens[i, :k].tolist(), skip_special_tokens=True)
        assert r.texts[i] == text


@pytest.fixture(scope="module")
def early_eos(senior, prompts, tokenizer):
    """EOS ids that stop some rows early and let others run, whatever the weights: tokens the
    senior writes in a few of its rows, and every tenth id that it does not write often."""
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2, seed=5, eos_token_ids=())
    r = generate(senior, None, prompts, None, params)
    rows_with = {}
    for i, row in enumerate(r.tokens.tolist()):
        for token in set(row):
            rows_with.setdefault(token, set()).add(i)
    rare = [t for t, rows in rows_with.items() if len(rows) <= 3]
    sparse = [t for t in range(7, len(tokenizer), 10) if len(rows_with.get(t, ())) <= 4]
    return tuple(sorted({2, *rare[:4], *sparse}))


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_logprobs_match_teacher_forcing(name, senior, junior, prompts, tokenizer, early_eos):
    params = SamplingParams(
        max_new_tokens=24, samples_per_prompt=2, seed=5, eos_token_ids=early_eos
    )
    r = generate(senior, junior, prompts, SAMPLERS[name](tokenizer), params, tokenizer=tokenizer)
    check_alignment(r, prompts, params, early_eos, tokenizer)
    assert (r.stop_reasons == StopReason.EOS).any() and (r.lengths < 24).any()
    assert r.lengths.max() >= 8, "the EOS ids stop every row too early to test the caches"
    for model, recorded in ((senior, r.senior_logprobs), (junior, r.junior_logprobs)):
        assert (recorded - teacher_forced(model, r)).abs().max() < 1e-4
    # the two models really differ, so a swapped cache would have shown
    assert (r.senior_logprobs - r.junior_logprobs)[r.mask].abs().max() > 0.1
    if name in ("token", "word", "word_after_boundary"):
        assert r.junior_mask.any() and r.senior_mask.any()


@pytest.mark.parametrize(
    "knobs", [dict(temperature=0.7), dict(temperature=0.7, top_k=20, top_p=0.9), dict(top_p=0.8)]
)
def test_word_handoffs_under_sampling_knobs(knobs, senior, junior, prompts, tokenizer):
    sampler = WordSampler(tokenizer, p=0.5)
    params = SamplingParams(max_new_tokens=20, samples_per_prompt=2, seed=3, **knobs)
    r = generate(senior, junior, prompts, sampler, params, tokenizer=tokenizer)
    for model, recorded in ((senior, r.senior_logprobs), (junior, r.junior_logprobs)):
        assert (recorded - teacher_forced(model, r)).abs().max() < 1e-4
    prev = torch.cat([r.prompt_tokens[:, -1:], r.tokens[:, :-1]], dim=1)
    onset = word_onset(sampler.tables, r.tokens, prev)[:, 1:]
    changed = (r.authors[:, 1:] != r.authors[:, :-1]) & r.mask[:, 1:]
    assert changed.any() and not (changed & ~onset).any()


def test_solo_without_a_junior(senior, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=12, samples_per_prompt=2)
    r = generate(senior, None, prompts, None, params, tokenizer=tokenizer)
    assert r.junior_logprobs is None and (r.authors[r.mask] == SENIOR).all()
    assert (r.senior_logprobs - teacher_forced(senior, r)).abs().max() < 1e-4
    assert torch.equal(r.author_logprobs, r.senior_logprobs)


@pytest.mark.parametrize("name", ["word", "word_after_boundary", "token"])
def test_p1_tandem_equals_solo(name, senior, junior, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=20, samples_per_prompt=2)
    solo = generate(senior, None, prompts, None, params)
    sampler = SAMPLERS[name](tokenizer)
    sampler.p = 1.0
    tandem = generate(senior, junior, prompts, sampler, params)
    assert torch.equal(tandem.tokens, solo.tokens)
    assert torch.equal(tandem.lengths, solo.lengths)
    assert (tandem.authors[tandem.mask] == SENIOR).all()
    assert torch.allclose(tandem.senior_logprobs, solo.senior_logprobs, atol=1e-6)
    with_junior = generate(senior, junior, prompts, SoloSampler(), params)
    assert torch.equal(with_junior.tokens, solo.tokens)


def test_same_seed_same_rollouts(senior, junior, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=16)

    def run(sampler, p=params):
        return generate(senior, junior, prompts, sampler, p)

    # the sampler holds no state between calls: the seed alone decides tokens and coins
    sampler = WordSampler(tokenizer)
    a, b = run(sampler), run(sampler)
    for field in ("tokens", "authors", "senior_logprobs", "junior_logprobs", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    other = run(sampler, SamplingParams(max_new_tokens=16, seed=4))
    assert not torch.equal(other.tokens, a.tokens)
    assert not torch.equal(other.authors, a.authors)


def test_samples_per_prompt_share_the_prefill(senior, junior, prompts, tokenizer):
    grouped = SamplingParams(max_new_tokens=12, samples_per_prompt=3)
    flat = SamplingParams(max_new_tokens=12, samples_per_prompt=1)
    repeated = [p for p in prompts for _ in range(3)]
    a = generate(senior, junior, prompts, WordSampler(tokenizer), grouped)
    b = generate(senior, junior, repeated, WordSampler(tokenizer), flat)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.authors, b.authors)
    assert torch.allclose(a.junior_logprobs, b.junior_logprobs, atol=1e-5)
    assert torch.equal(a.prompt_index, torch.arange(len(prompts)).repeat_interleave(3))


def test_greedy_and_truncation(senior, prompts):
    def solo(**kw):
        params = SamplingParams(max_new_tokens=12, seed=4, eos_token_ids=(), **kw)
        r = generate(senior, None, prompts, None, params)
        ids, mask = r.sequences()
        with torch.inference_mode():
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            logits = senior(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        p = r.prompt_tokens.shape[1]
        return r, logits[:, p - 1 : -1].float()  # [N, T, V] the logits each token was drawn from

    greedy, logits = solo(temperature=0.0)
    chosen = logits.gather(-1, greedy.tokens[..., None]).squeeze(-1)
    assert (chosen >= logits.amax(-1) - 1e-5).all()
    assert torch.equal(solo(top_k=1)[0].tokens, greedy.tokens)
    r, logits = solo(top_k=5)
    rank = (logits > logits.gather(-1, r.tokens[..., None])).sum(-1)
    assert (rank < 5).all()
    r, logits = solo(top_p=0.6, temperature=0.7)
    probs = (logits / 0.7).softmax(-1)
    mine = probs.gather(-1, r.tokens[..., None])
    before = (probs * (probs > mine)).sum(-1)  # mass of the tokens more likely than the drawn one
    assert (before < 0.6 + 1e-5).all()


def test_word_statistics_in_generation(senior, junior, prompts, tokenizer):
    sampler = WordSampler(tokenizer, p=0.5)
    params = SamplingParams(max_new_tokens=40, samples_per_prompt=8, seed=6, eos_token_ids=())
    r = generate(senior, junior, prompts, sampler, params)
    tables = sampler.tables
    prev = torch.cat([r.prompt_tokens[:, -1:], r.tokens[:, :-1]], dim=1)
    onset = word_onset(tables, r.tokens, prev)[:, 1:]  # [N, T-1], positions 1.. T-1
    changed = r.authors[:, 1:] != r.authors[:, :-1]
    since, forced = torch.ones(r.num_rows, dtype=torch.long), torch.zeros_like(onset)
    for t in range(onset.shape[1]):  # replay the gap counter to find coins without onsets
        forced[:, t] = ~onset[:, t] & (since >= 32)
        since = torch.where(onset[:, t] | forced[:, t], 1, since + 1)
    assert not (changed & ~onset & ~forced).any(), "the author changed inside a word"
    n = int(onset.sum())
    assert n > 300
    spread = 3.29 * (n * 0.25) ** 0.5 + 1
    assert abs(int(changed[onset].sum()) - n / 2) <= spread
    assert abs(int((r.authors[:, 1:][onset] == SENIOR).sum()) - n / 2) <= spread


def test_step_alternation_in_generation(senior, junior, prompts, tokenizer):
    sampler = StepSampler(tokenizer)
    params = SamplingParams(max_new_tokens=64, samples_per_prompt=2, seed=8, eos_token_ids=())
    r = generate(senior, junior, prompts, sampler, params)
    prev = torch.cat([r.prompt_tokens[:, -1:], r.tokens[:, :-1]], dim=1)
    ended = step_end(sampler.tables, r.tokens, prev)[:, :-1]
    assert (r.authors[:, 0] == SENIOR).all()
    assert torch.equal(r.authors[:, 1:] != r.authors[:, :-1], ended)


def test_errors_name_the_fix(senior, junior, prompts, tokenizer):
    with pytest.raises(ValueError, match="junior is None"):
        generate(senior, None, prompts, WordSampler(tokenizer), SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="non-empty"):
        generate(senior, None, [[]], None, SamplingParams(max_new_tokens=2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_junior_on_another_device(senior, junior, prompts, tokenizer):
    import copy

    far = copy.deepcopy(junior).to("cuda")
    params = SamplingParams(max_new_tokens=16, samples_per_prompt=2)
    r = generate(senior, far, prompts, WordSampler(tokenizer), params)
    assert (r.senior_logprobs - teacher_forced(senior, r)).abs().max() < 1e-4
    assert (r.junior_logprobs - teacher_forced(junior, r)).abs().max() < 1e-3


def test_context_limit_shortens_rows_with_long_prompts(senior, prompts, tokenizer):
    short, long = prompts[0], prompts[1] + prompts[2]  # two prompts of different lengths
    limit = len(long) + 6
    params = SamplingParams(max_new_tokens=20, seed=2, eos_token_ids=(), context_limit=limit)
    r = generate(senior, None, [short, long], None, params, tokenizer=tokenizer)
    # the authors' shared budget: min(max_new_tokens, context - prompt)
    assert r.lengths.tolist() == [min(20, limit - len(short)), 6]
    assert (r.stop_reasons == StopReason.LENGTH).all()
    assert params.budget(limit + 50) == 1, "a prompt past the limit still gets one token"


def test_step_rounds_cap_ends_rows(senior, junior, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=120, seed=4, samples_per_prompt=2)
    free = generate(senior, junior, prompts[:4], StepSampler(tokenizer), params)
    capped = StepSampler(tokenizer, max_rounds=1)
    cut = generate(senior, junior, prompts[:4], capped, params)
    prev = torch.cat([free.prompt_tokens[:, -1:], free.tokens[:, :-1]], dim=1)
    ends = step_end(capped.tables, free.tokens, prev) & free.mask  # [N, T]
    assert (ends.sum(1) >= 2).any(), "the uncapped rows must hold several steps"
    for i in range(free.num_rows):
        n = int(cut.lengths[i])
        # the same tokens as the uncapped row, up to the end of its first step (or its EOS)
        assert torch.equal(cut.tokens[i, :n], free.tokens[i, :n])
        first_end = int(ends[i].nonzero()[0]) + 1 if ends[i].any() else int(free.lengths[i])
        assert n == first_end
    assert (cut.authors[cut.mask] == SENIOR).all(), "the junior never got a turn"


class _OtherProcess:
    """A ``Lockstep`` with a second process simulated: its rows fit its KV budget in one pass,
    its prompts fill ``chunks`` prefill chunks and its rows write ``steps + 1`` tokens; records
    what this process passes."""

    def __init__(self, chunks: int, steps: int) -> None:
        self.values, self.passed = [1, chunks] + [1] * steps, []

    def __call__(self, value: int) -> int:
        self.passed.append(value)
        return max(value, self.values.pop(0) if self.values else 0)


def test_lockstep_keeps_stepping_the_senior_until_every_process_is_done(
    senior, junior, prompts, tokenizer
):
    # every row's budget is at most 12 tokens: this process is done long before the other
    limit = min(len(p) for p in prompts) + 12
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2, context_limit=limit)
    forwards = {"senior": 0, "junior": 0}
    hooks = [
        model.register_forward_pre_hook(
            lambda *_, name=name: forwards.update({name: forwards[name] + 1})
        )
        for name, model in (("senior", senior), ("junior", junior))
    ]
    try:
        alone = generate(senior, junior, prompts, WordSampler(tokenizer), params)
        counted_alone = dict(forwards)
        forwards.update(senior=0, junior=0)
        other = _OtherProcess(chunks=3, steps=23)
        r = generate(senior, junior, prompts, WordSampler(tokenizer), params, lockstep=other)
    finally:
        for hook in hooks:
            hook.remove()
    for field in ("tokens", "authors", "senior_logprobs", "junior_logprobs", "lengths"):
        assert torch.equal(getattr(r, field), getattr(alone, field)), field
    own = int(r.lengths.max()) - 1  # this process's steps after the prefill
    assert own <= 11 and counted_alone == {"senior": 1 + own, "junior": 1 + own}
    # the senior makes the other's 3 prefill forwards and 23 steps; the junior only its own
    assert forwards == {"senior": 3 + 23, "junior": 1 + own}
    # one pass under the KV budget and one prefill chunk here, then "still writing" at each of
    # its steps, then "done"
    assert other.passed == [1, 1] + [1] * own + [0] * (23 - own + 1)
