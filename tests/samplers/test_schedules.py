"""Handoff schedules driven by scripted proposals on a small synthetic vocabulary.

The driver plays the engine's part (start, draw, step, redraw, step) with random tokens,
so each schedule's rules and statistics are checked over thousands of steps in well under a
second, independently of any model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

import tandem.samplers  # noqa: F401  (registers the samplers)
from tandem.registry import SAMPLERS, RegistryError
from tandem.samplers import JUNIOR, SENIOR, SentenceSampler, StepSampler, TokenSampler, WordSampler
from tandem.samplers.boundaries import sentence_end, step_end, tables_from_surfaces, word_onset

# id: surface.  0 is special; 1 and 7 begin words; 3 and 5 end in whitespace; 4 ends a step.
SURFACES = [None, b" w", b"x", b" ", b".\n\n", b"\n", b"y", b" z"]
TABLES = tables_from_surfaces(SURFACES)
V = len(SURFACES)
CONTEXT = 5  # prompts end in a newline, as chat templates do
# Each author has its own taste, so that statistics cannot pass by symmetry.
TASTE = {
    SENIOR: torch.tensor([0, 4, 3, 1, 1, 1, 3, 2], dtype=torch.float),
    JUNIOR: torch.tensor([0, 1, 2, 2, 1, 1, 2, 4], dtype=torch.float),
}
NO_ONSETS = torch.tensor([0, 0, 1, 0, 0, 0, 1, 0], dtype=torch.float)


def drive(sampler, rows: int, steps: int, seed: int = 0, taste=None, context: int = CONTEXT):
    """Play the engine's part (start, draw, step, redraw a retracted token, step again) with
    random tokens; returns ``tokens``, ``authors`` and ``redrawn`` ``[rows, steps]``."""
    g = torch.Generator().manual_seed(seed)
    taste = taste or TASTE
    sampler.bind(V, "cpu")
    handoff = sampler.start(torch.full((rows,), context), torch.rand(rows, generator=g))
    tokens, authors, redrawn = [], [], []
    for _ in range(steps):
        author = handoff.author
        weights = torch.stack([taste[int(w)] for w in author])
        token = torch.multinomial(weights, 1, generator=g).squeeze(1)
        handoff = sampler.step(handoff.state, token, torch.rand(rows, generator=g))
        retract = handoff.retract if handoff.retract is not None else torch.zeros_like(token) > 0
        if retract.any():
            again = retract.nonzero().squeeze(1)
            allowed = sampler.allowed({k: v[again] for k, v in handoff.state.items()})
            assert allowed.shape == (again.shape[0], V)
            token = token.clone()
            token[again] = torch.multinomial(allowed.float(), 1, generator=g).squeeze(1)
            author = torch.where(retract, handoff.author, author)
            second = sampler.step(handoff.state, token, torch.rand(rows, generator=g))
            assert second.retract is None or not second.retract[again].any()
            state = {k: torch.where(retract, v, handoff.state[k]) for k, v in second.state.items()}
            handoff = type(handoff)(state)
        tokens.append(token)
        authors.append(author)
        redrawn.append(retract)
    return torch.stack(tokens, 1), torch.stack(authors, 1), torch.stack(redrawn, 1)


def within_binomial(successes: int, trials: int, p: float) -> bool:
    """Inside the two-sided 99.9% interval of Binomial(trials, p) (normal approximation)."""
    assert trials > 200, f"too few trials ({trials}) for the normal approximation"
    spread = 3.29 * math.sqrt(trials * p * (1 - p)) + 1
    return abs(successes - trials * p) <= spread


def previous(tokens: torch.Tensor) -> torch.Tensor:
    """``[N, T]``: the token before each position (the context before the first)."""
    return torch.cat([torch.full_like(tokens[:, :1], CONTEXT), tokens[:, :-1]], dim=1)


def changed(authors: torch.Tensor) -> torch.Tensor:
    """``[N, T-1]``: whether the author of position t differs from position t-1 (t >= 1)."""
    return authors[:, 1:] != authors[:, :-1]


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_token_share_is_binomial(p):
    _, authors, _ = drive(TokenSampler(p=p), rows=64, steps=64)
    assert within_binomial(int((authors == SENIOR).sum()), authors.numel(), p)
    assert within_binomial(int(changed(authors).sum()), changed(authors).numel(), 2 * p * (1 - p))


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_word_onset_rule(p):
    tokens, authors, redrawn = drive(WordSampler(TABLES, p=p, max_gap_tokens=10_000), 64, 64)
    onset = word_onset(TABLES, tokens, previous(tokens))  # [N, T] emitted onsets
    # the author changes only where a word begins, and the new author writes an onset there
    assert not (changed(authors) & ~onset[:, 1:]).any()
    assert onset[redrawn].all() and redrawn.any()
    # each word's author is a fresh coin: a change at p(1-p) + (1-p)p of the onsets
    at = onset[:, 1:]
    assert within_binomial(int(changed(authors)[at].sum()), int(at.sum()), 2 * p * (1 - p))
    assert within_binomial(int((authors[onset] == SENIOR).sum()), int(onset.sum()), p)


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_word_after_boundary_rule(p):
    sampler = WordSampler(TABLES, p=p, max_gap_tokens=10_000, rule="after_boundary")
    tokens, authors, redrawn = drive(sampler, 64, 64)
    assert not redrawn.any(), "the reference rule never replaces a proposal"
    after = word_onset(TABLES, tokens, previous(tokens))[:, :-1]  # position t-1 began a word
    assert not (changed(authors) & ~after).any()
    assert within_binomial(int(changed(authors)[after].sum()), int(after.sum()), 2 * p * (1 - p))


@pytest.mark.parametrize("rule", ["onset", "after_boundary"])
def test_max_gap_draws_the_coin_without_onsets(rule):
    gap = 5
    taste = {SENIOR: NO_ONSETS, JUNIOR: NO_ONSETS}
    sampler = WordSampler(TABLES, p=0.5, max_gap_tokens=gap, rule=rule)
    # a context that does not end in whitespace, so that the first token begins no word
    _, authors, _ = drive(sampler, rows=256, steps=4 * gap + 1, taste=taste, context=2)
    steps = changed(authors)  # column t-1 is position t
    at = torch.tensor([t % gap == 0 for t in range(1, authors.shape[1])])
    assert not steps[:, ~at].any(), "the author changed between coins"
    assert steps[:, at].any(0).all(), "some gap coin never changed an author"
    assert within_binomial(int(steps[:, at].sum()), int(steps[:, at].numel()), 0.5)


def test_max_gap_counts_from_the_last_coin():
    gap = 3
    tokens, authors, _ = drive(WordSampler(TABLES, p=0.5, max_gap_tokens=gap), 256, 40)
    onset = word_onset(TABLES, tokens, previous(tokens))
    coin = torch.zeros_like(onset)  # where the rule says coins fall, replayed
    since = torch.zeros(tokens.shape[0], dtype=torch.long)
    for t in range(tokens.shape[1]):
        coin[:, t] = onset[:, t] | (since >= gap) | (t == 0)
        since = torch.where(coin[:, t], 1, since + 1)
    assert not (changed(authors) & ~coin[:, 1:]).any()
    forced = coin[:, 1:] & ~onset[:, 1:]
    assert forced.sum() > 200
    assert within_binomial(int(changed(authors)[forced].sum()), int(forced.sum()), 0.5)


@pytest.mark.parametrize("cls", [WordSampler, TokenSampler])
def test_certain_coins(cls):
    for p, who in [(1.0, SENIOR), (0.0, JUNIOR)]:
        sampler = cls(TABLES, p=p) if cls is WordSampler else cls(p=p)
        _, authors, redrawn = drive(sampler, 8, 50)
        assert (authors == who).all() and not redrawn.any()


@pytest.mark.parametrize(
    ("sampler", "boundary", "first"),
    [
        (SentenceSampler(TABLES), sentence_end, SENIOR),
        (SentenceSampler(TABLES, first="junior"), sentence_end, JUNIOR),
        (StepSampler(TABLES), step_end, SENIOR),
        (StepSampler(TABLES, first="junior"), step_end, JUNIOR),
    ],
)
def test_alternation_is_exact(sampler, boundary, first):
    tokens, authors, _ = drive(sampler, 32, 80)
    ended = boundary(TABLES, tokens, previous(tokens))[:, :-1]  # position t-1 ended a unit
    assert (authors[:, 0] == first).all()
    assert torch.equal(changed(authors), ended)
    assert ended.sum() > 100


def test_step_coin_schedule():
    sampler = StepSampler(TABLES, first="coin", alternate=False, p=0.3)
    tokens, authors, _ = drive(sampler, 256, 40)
    ended = step_end(TABLES, tokens, previous(tokens))[:, :-1]
    assert not (changed(authors) & ~ended).any()
    starts = torch.cat([torch.ones_like(ended[:, :1]), ended], dim=1)  # each step's first token
    assert within_binomial(int((authors[starts] == SENIOR).sum()), int(starts.sum()), 0.3)


def test_a_schedule_is_a_value():
    """The coins decide the schedule, and stepping a state neither changes it nor depends on
    anything else, so a caller that keeps the state and reseeds the coins replays it exactly."""

    def run(sampler, seed):
        return drive(sampler, 16, 30, seed=seed)[1]

    assert torch.equal(run(WordSampler(TABLES), 3), run(WordSampler(TABLES), 3))
    assert not torch.equal(run(WordSampler(TABLES), 3), run(WordSampler(TABLES), 4))
    sampler = WordSampler(TABLES, max_gap_tokens=3)
    sampler.bind(V, "cpu")
    state = sampler.start(torch.full((8,), CONTEXT), torch.rand(8)).state
    kept = {k: v.clone() for k, v in state.items()}
    token, coins = torch.randint(0, V, (8,)), torch.rand(8)
    first, second = sampler.step(state, token, coins), sampler.step(state, token, coins)
    assert all(torch.equal(state[k], kept[k]) for k in kept), "step changed its input state"
    assert all(torch.equal(first.state[k], second.state[k]) for k in kept)


CONF = Path(__file__).resolve().parents[2] / "conf" / "sampler"


@pytest.mark.parametrize("name", ["solo", "token", "word", "sentence", "step"])
def test_configs_build_their_sampler(name, tiny_tokenizer):
    config = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    assert config.pop("name") == name
    sampler = SAMPLERS.build(name, tokenizer=tiny_tokenizer, **config)
    assert sampler.registry_name == name
    for key, value in config.items():
        assert getattr(sampler, key) == value
    if sampler.needs_tables:
        assert sampler.tables.size == len(tiny_tokenizer)


def test_bad_arguments_are_named(tiny_tokenizer):
    with pytest.raises(RegistryError, match="max_gap"):
        SAMPLERS.build("word", tokenizer=tiny_tokenizer, max_gap=3)
    with pytest.raises(ValueError, match="rule"):
        WordSampler(tiny_tokenizer, rule="before")
    with pytest.raises(ValueError, match=r"p \(1.5\)"):
        TokenSampler(p=1.5)
    with pytest.raises(ValueError, match="tokenizer"):
        WordSampler(None)


@pytest.mark.parametrize("rule", ["onset", "after_boundary"])
def test_may_retract_is_exactly_where_some_token_would_be_withdrawn(rule, tiny_tokenizer):
    """An engine that lets another library sample trusts ``may_retract``: where it says no, no
    token of the vocabulary may be withdrawn; where it says yes, some token is."""
    sampler = WordSampler(tiny_tokenizer, p=0.5, rule=rule, max_gap_tokens=3)
    vocab = sampler.tables.size
    g = torch.Generator().manual_seed(0)
    n = 64
    state = sampler.start(torch.randint(vocab, (n,), generator=g), torch.rand(n, generator=g)).state
    checked = {True: 0, False: 0}
    for _ in range(12):
        coins = torch.rand(n, generator=g)
        may = sampler.may_retract(state, coins)
        for i in range(n):
            every = {k: v[i].repeat(vocab) for k, v in state.items()}  # row i, each next token
            h = sampler.step(every, torch.arange(vocab), coins[i].repeat(vocab))
            withdrawn = h.retract is not None and bool(h.retract.any())
            assert withdrawn == bool(may[i]), (rule, i)
            checked[bool(may[i])] += 1
        token = torch.randint(vocab, (n,), generator=g)
        h = sampler.step(state, token, torch.rand(n, generator=g))
        state = h.state
    assert checked[False] > 0 and (checked[True] > 0 or rule == "after_boundary")
    assert TokenSampler(p=0.5).may_retract({}, torch.rand(4)).sum() == 0
