"""A junior of another vocabulary (``tandem.engine.cross``): the tiny world's base as senior and
``tiny-bpe-small`` (its own BPE, a third of the vocabulary) as junior.

What is checked: the shared text is each model's decoded sequence; both models' recorded
log-probs are what teacher forcing on their own sequences gives; cutting the text before a space
tokenizes it as a whole; words change hands as often as the coin says; the authors' schedule
changes author only where its rule, replayed over each model's own tokens, draws a coin; every
sampler writes across vocabularies; a character cut by the pen passes byte for byte; a packed read
and a block read each equal reading token by token, and models read in blocks write the same
rollouts; and pairs that cannot share words are refused with a message that says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cross_tokenizers import trailing_space_tokenizer
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import TINY_BPE_SMALL
from tandem.data.arithmetic import make_splits
from tandem.engine import JUNIOR, PAD, SENIOR, SamplingParams, StopReason, generate
from tandem.engine.block import BlockReader
from tandem.engine.cross import CrossRollouts, generate_cross, split_problem
from tandem.engine.layout import Prompts
from tandem.engine.packed import PackedReader, packable
from tandem.engine.reader import Reader
from tandem.engine.vocabulary import vocabulary
from tandem.modules.logprobs import sequence_logprobs
from tandem.registry import SAMPLERS
from tandem.samplers import WordSampler

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def junior_tokenizer():
    return AutoTokenizer.from_pretrained(TINY_BPE_SMALL)


@pytest.fixture(scope="module")
def small_junior():
    return AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL, dtype=torch.float32).eval()


def cowrite(senior, small_junior, prompts, tokenizer, junior_tokenizer, p=0.5, sampler=None, **kw):
    """Rollouts of the pair; the sampler is by default the word schedule at space-led onsets."""
    params = SamplingParams(
        max_new_tokens=kw.pop("max_new_tokens", 96),
        seed=kw.pop("seed", 3),
        samples_per_prompt=kw.pop("samples", 2),
        logprob_temperature=0.7,
        **kw,
    )
    return generate_cross(
        senior,
        small_junior,
        prompts,
        sampler or WordSampler(tokenizer, p=p, boundary="leading_space"),
        params,
        tokenizer=tokenizer,
        junior_tokenizer=junior_tokenizer,
    )


@pytest.fixture(scope="module")
def rollouts(senior, small_junior, prompts, tokenizer, junior_tokenizer) -> CrossRollouts:
    return cowrite(senior, small_junior, prompts, tokenizer, junior_tokenizer)


def test_the_pair_really_has_two_vocabularies(tokenizer, junior_tokenizer) -> None:
    text = " Multiplying by 4 gives 164 toy cars."
    assert len(junior_tokenizer) < len(tokenizer) / 2
    assert tokenizer(text)["input_ids"] != junior_tokenizer(text)["input_ids"]
    assert len(junior_tokenizer(text)["input_ids"]) > len(tokenizer(text)["input_ids"])


def test_both_write_and_the_shared_text_is_each_models_decoded_sequence(
    rollouts, tokenizer, junior_tokenizer
) -> None:
    j = rollouts.junior
    both = rollouts.senior_mask.any(1) & rollouts.junior_mask.any(1)
    assert bool(both.any()), "both authors wrote in some row"
    assert rollouts.texts == j.texts
    for i in range(rollouts.num_rows):
        ids = rollouts.tokens[i, : rollouts.lengths[i]].tolist()
        jids = j.tokens[i, : j.lengths[i]].tolist()
        assert tokenizer.decode(ids, skip_special_tokens=True) == rollouts.texts[i]
        assert junior_tokenizer.decode(jids, skip_special_tokens=True) == rollouts.texts[i]
    # each model's sequence marks the same text to the same author: the senior's words, in
    # bytes, are the same in both sequences
    for i in range(rollouts.num_rows):
        senior_text = tokenizer.decode(
            rollouts.tokens[i][rollouts.authors[i] == SENIOR].tolist(), skip_special_tokens=True
        )
        junior_view = junior_tokenizer.decode(
            j.tokens[i][j.authors[i] == SENIOR].tolist(), skip_special_tokens=True
        )
        assert senior_text == junior_view


def test_rows_stop_on_eos_with_each_models_own_eos(rollouts, senior, small_junior) -> None:
    j = rollouts.junior
    eos = rollouts.stop_reasons == StopReason.EOS
    assert bool(eos.any())
    ends = senior.generation_config.eos_token_id, small_junior.generation_config.eos_token_id
    for i in eos.nonzero().squeeze(1).tolist():
        assert int(rollouts.tokens[i, rollouts.lengths[i] - 1]) in ends[0]
        assert int(j.tokens[i, j.lengths[i] - 1]) in ends[1]
    assert bool((rollouts.lengths <= 96).all()), "the senior's sequence keeps its budget"
    past = torch.arange(rollouts.tokens.shape[1]) >= rollouts.lengths[:, None]
    assert bool((rollouts.authors[past] == PAD).all())


def test_recorded_logprobs_are_teacher_forcing_on_each_models_own_tokens(
    rollouts, senior, small_junior
) -> None:
    ids, mask = rollouts.sequences()
    start = rollouts.prompt_tokens.shape[1]
    raw, tempered = sequence_logprobs(senior, ids, mask, start, [1.0, 0.7])
    real = rollouts.mask
    assert bool(rollouts.junior_mask.any()), "junior words, re-tokenized, are in the senior's"
    assert torch.allclose(raw[real], rollouts.senior_logprobs[real], atol=1e-4)
    assert torch.allclose(tempered[real], rollouts.old_logprobs[real], atol=1e-4)
    j = rollouts.junior
    pl = j.prompt_tokens.shape[1]
    p_mask = torch.arange(pl) >= (pl - j.prompt_lengths)[:, None]
    j_real = j.authors != PAD
    j_ids = torch.cat([j.prompt_tokens, j.tokens], 1)
    j_lp = sequence_logprobs(small_junior, j_ids, torch.cat([p_mask, j_real], 1), pl)
    assert bool((j.authors == JUNIOR).any()) and bool((j.authors == SENIOR).any())
    assert torch.allclose(j_lp[j_real], j.logprobs[j_real], atol=1e-4)


def test_cutting_before_a_space_tokenizes_as_the_whole(tokenizer, junior_tokenizer) -> None:
    rows = make_splits(0, sizes={"train": 1, "validation": 1, "test": 50})["test"]
    for tok in (tokenizer, junior_tokenizer):
        assert split_problem(tok, list(rows["solution"])) is None


def test_the_same_seed_gives_the_same_rollouts(
    rollouts, senior, small_junior, prompts, tokenizer, junior_tokenizer
) -> None:
    again = cowrite(senior, small_junior, prompts, tokenizer, junior_tokenizer)
    assert torch.equal(again.tokens, rollouts.tokens)
    assert torch.equal(again.junior.tokens, rollouts.junior.tokens)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_words_change_hands_as_the_coin_says(
    p, senior, small_junior, prompts, tokenizer, junior_tokenizer
) -> None:
    out = cowrite(
        senior, small_junior, prompts, tokenizer, junior_tokenizer, p=p, samples=6, seed=11
    )
    # every space-led token of the senior's sequence begins a word whose author a coin chose
    spaced = torch.tensor([tokenizer.decode([i]).startswith(" ") for i in range(len(tokenizer))])
    onsets = spaced[out.tokens.clamp(max=len(tokenizer) - 1)] & out.mask  # [N, T]
    words = int(onsets.sum())
    senior_words = int((onsets & out.senior_mask).sum())
    assert words > 300
    # binomial: the standard error is at most 0.5 / sqrt(300) < 0.03
    assert abs(senior_words / words - p) < 0.09, (senior_words / words, p)
    # the pen changes between consecutive words with chance 2p(1-p)
    changes = (out.authors[:, 1:] != out.authors[:, :-1]) & out.mask[:, 1:] & out.mask[:, :-1]
    rate = int(changes.sum()) / words
    assert abs(rate - 2 * p * (1 - p)) < 0.1, (rate, p)


def _stream(out: CrossRollouts, row: int) -> list[tuple[int, int]]:
    """Row ``row`` as it was written: ``(author, token)`` pairs, each token in its writer's own
    vocabulary (the senior's runs from its sequence, the junior's from the junior's)."""
    runs = []
    for seq in (out, out.junior):
        k = int(seq.lengths[row])
        tokens, authors = seq.tokens[row, :k].tolist(), seq.authors[row, :k].tolist()
        mine: list[list[tuple[int, int]]] = []
        for a, t in zip(authors, tokens, strict=True):
            if not mine or mine[-1][0][0] != a:
                mine.append([])
            mine[-1].append((a, t))
        runs.append(mine)
    senior_runs, junior_runs = runs
    assert [r[0][0] for r in senior_runs] == [r[0][0] for r in junior_runs], "same turns"
    return [
        pair
        for s_run, j_run in zip(senior_runs, junior_runs, strict=True)
        for pair in (s_run if s_run[0][0] == SENIOR else j_run)
    ]


@pytest.mark.parametrize("max_gap_tokens", [32, 3])
def test_word_authors_changes_author_only_where_the_after_boundary_rule_draws_a_coin(
    max_gap_tokens, senior, small_junior, prompts, tokenizer, junior_tokenizer
) -> None:
    """The authors' schedule (``conf/sampler/word_authors.yaml``) with a junior of another
    vocabulary: replayed token by token over what each model wrote, in its own ids, the rule
    draws a coin after every space-led token and after ``max_gap_tokens`` without one; the
    author changes at no other place, and at about half of those (p = 0.5)."""
    spec = OmegaConf.to_container(OmegaConf.load(CONF / "sampler" / "word_authors.yaml"))
    spec["max_gap_tokens"] = max_gap_tokens
    sampler = SAMPLERS.build(spec.pop("name"), tokenizer=tokenizer, **spec)
    assert sampler.rule == "after_boundary" and sampler.boundary == "leading_space"
    out = cowrite(
        senior, small_junior, prompts, tokenizer, junior_tokenizer, sampler=sampler, samples=4
    )
    spaced = {
        code: vocabulary(tok).tables.leading_space
        for code, tok in ((SENIOR, tokenizer), (JUNIOR, junior_tokenizer))
    }
    coins = changes = inside_words = 0
    for row in range(out.num_rows):
        stream = _stream(out, row)
        since, coin_after = 0, []
        for author, token in stream:  # the scalar rule: a coin after a boundary, or a long gap
            since = 1 if not coin_after or coin_after[-1] else since + 1
            coin_after.append(bool(spaced[author][token]) or since >= max_gap_tokens)
        for t in range(1, len(stream)):
            if stream[t][0] != stream[t - 1][0]:
                assert coin_after[t - 1], (row, t, "the author changed where no coin fell")
                changes += 1
                inside_words += not bool(spaced[stream[t][0]][stream[t][1]])
        coins += sum(coin_after[:-1])
    assert coins > 200
    assert abs(changes / coins - 0.5) < 0.1, (changes, coins)
    assert inside_words > 0, "the new author takes over one token into the word"
    # the two sequences still spell one text, cut wherever the schedule passed the pen
    assert out.texts == out.junior.texts


@pytest.mark.parametrize(
    "name, options",
    [
        ("word", {}),
        ("token", {}),
        ("sentence", {"first": "junior"}),
        ("step", {"alternate": False, "max_rounds": 2}),
        ("solo", {}),
    ],
)
def test_every_sampler_writes_across_vocabularies(
    name, options, senior, small_junior, prompts, tokenizer, junior_tokenizer
) -> None:
    """``generate`` hands a cross pair to the cross engine, which steps whatever sampler it is
    given: each sequence spells the shared text, and the authors are the schedule's."""
    sampler = SAMPLERS.build(name, tokenizer=tokenizer, **options)
    params = SamplingParams(max_new_tokens=40, seed=5, samples_per_prompt=2)
    out = generate(
        senior,
        small_junior,
        prompts,
        sampler,
        params,
        tokenizer=tokenizer,
        junior_tokenizer=junior_tokenizer,
    )
    assert isinstance(out, CrossRollouts) and out.texts == out.junior.texts
    for i in range(out.num_rows):
        jids = out.junior.tokens[i, : out.junior.lengths[i]].tolist()
        assert junior_tokenizer.decode(jids, skip_special_tokens=True) == out.texts[i]
    assert bool(out.junior_mask.any()) == (name != "solo"), "the junior writes unless solo"
    if name == "token":  # a coin at every token: the pen changes inside words too
        changes = (out.authors[:, 1:] != out.authors[:, :-1]) & out.mask[:, 1:]
        assert int(changes.sum()) > 0.3 * int(out.mask[:, 1:].sum())
    if name == "sentence":
        assert bool((out.authors[:, 0] == JUNIOR).all()), "the junior writes the first sentence"


def test_a_character_cut_by_the_pen_passes_byte_for_byte(tokenizer, junior_tokenizer) -> None:
    """A change of pen may fall inside a character: each piece reaches the other model as its
    own bytes, and the two pieces decode to the character again."""
    text = "caf\u00e9 = 3 \u2192 \u2211"
    data = text.encode()
    cut = data.index(b"\xa9")  # between the two bytes of the e-acute
    for tok in (tokenizer, junior_tokenizer):
        vocab = vocabulary(tok)
        first, rest = vocab.encode([data[:cut], data[cut:]])
        assert vocab.byte_ids[data[cut - 1]] == first[-1]
        assert vocab.spelt(first + rest) == data
        assert tok.decode(first + rest) == text


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_block_read_equals_reading_token_by_token(senior, prompts, attention) -> None:
    model = senior.__class__.from_pretrained(senior.name_or_path, attn_implementation=attention)
    ids = torch.tensor(prompts[0])[None].repeat(3, 1)
    mask = torch.ones_like(ids)
    block = torch.tensor([[5, 6, 7], [8, 0, 0], [0, 0, 0]])
    valid = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    one, steps = BlockReader(model), BlockReader(model)
    nine = torch.tensor([[9], [9], [9]])
    with torch.inference_mode():
        one.prefill(ids, mask, 1, 8)
        got = one.feed_block(block, valid)  # [3, 3, V]
        after = one.feed_block(nine, torch.ones(3, 1, dtype=torch.bool))[:, 0]  # [3, V]
        steps.prefill(ids, mask, 1, 8)
        for k in range(3):
            want = steps.step(block[:, k], valid[:, k])
            rows = valid[:, k]
            assert torch.allclose(got[rows, k], want[rows], atol=1e-4)
        # what each row would give had it read only its valid tokens, then the 9
        for row in range(3):
            alone = BlockReader(model)
            alone.prefill(ids[:1], mask[:1], 1, 8)
            for token in block[row][valid[row]].tolist():
                alone.step(torch.tensor([token]), torch.ones(1, dtype=torch.bool))
            want = alone.step(torch.tensor([9]), torch.ones(1, dtype=torch.bool))[0]
            assert torch.allclose(after[row], want, atol=1e-4), "padded columns stay hidden"


@pytest.mark.parametrize("reading", ["every row", "most rows", "few rows"])
def test_a_packed_read_equals_reading_token_by_token(senior, prompts, reading) -> None:
    """Rows read different numbers of tokens (none, one, a catch-up) in one packed forward: each
    token's logits, and what every row reads next, equal reading its tokens one by one."""
    n = 6
    batch = Prompts.of(prompts[:n], 0)
    ids, mask = batch.ids, batch.mask
    reads = {  # every row: the caches read in place; fewer: the reading rows' gathered
        "every row": [[5, 6, 7], [8], [4], [9, 10], [11], [12]],
        "most rows": [[5, 6, 7], [8], [], [9, 10], [11], [12]],
        "few rows": [[5, 6, 7], [], [], [], [], [8]],
    }
    reads = reads[reading]
    packed = PackedReader(senior)
    alone = [Reader(senior) for _ in range(n)]
    with torch.inference_mode():
        packed.prefill(ids, mask, 1, 4)
        rows = torch.tensor([i for i in range(n) if reads[i]])
        tokens = torch.tensor([t for r in reads for t in r])
        counts = torch.tensor([len(r) for r in reads if r])
        got = packed.feed(rows, tokens, counts)  # [M, V]
        after = packed.feed(torch.arange(n), torch.full((n,), 13), torch.ones(n, dtype=torch.long))
        at = 0
        for i in range(n):
            alone[i].prefill(
                ids[i : i + 1, -int(mask[i].sum()) :], mask[i : i + 1, -int(mask[i].sum()) :], 1, 8
            )
            for token in reads[i]:
                want = alone[i].step(torch.tensor([token]), torch.ones(1, dtype=torch.bool))[0]
                assert torch.allclose(got[at], want, atol=1e-4), (reading, i, token)
                at += 1
            want = alone[i].step(torch.tensor([13]), torch.ones(1, dtype=torch.bool))[0]
            assert torch.allclose(after[i], want, atol=1e-4), "each row's cache holds what it read"
    assert senior.config._attn_implementation == "sdpa", "the model's attention is put back"


def test_models_read_in_blocks_give_the_same_rollouts_as_packed_ones(
    senior, small_junior, prompts, tokenizer, junior_tokenizer
) -> None:
    """Eager attention cannot be read packed: the block reader serves it, and the rollouts are
    the packed ones (same draws, log-probs within float rounding)."""
    eager = [
        m.__class__.from_pretrained(m.name_or_path, attn_implementation="eager").eval()
        for m in (senior, small_junior)
    ]
    assert not packable(eager[0]) and packable(senior)
    packed = cowrite(senior, small_junior, prompts, tokenizer, junior_tokenizer)
    blocks = cowrite(*eager, prompts, tokenizer, junior_tokenizer)
    assert blocks.texts == packed.texts
    assert torch.equal(blocks.tokens, packed.tokens)
    assert torch.allclose(blocks.senior_logprobs, packed.senior_logprobs, atol=1e-4)
    assert torch.allclose(blocks.junior.logprobs, packed.junior.logprobs, atol=1e-4)


def test_a_tokenizer_that_cannot_cut_before_a_space_is_named() -> None:
    why = split_problem(trailing_space_tokenizer())
    assert why is not None and "pre-tokenizer does not split before a space" in why


def test_vllm_refuses_a_cross_pair_and_names_the_fix(
    senior, small_junior, tokenizer, junior_tokenizer, monkeypatch
) -> None:
    import importlib.util

    from tandem.engine import build_backend

    # as if vLLM were installed: the refusal comes before any vLLM engine is built
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    with pytest.raises(ValueError, match=r"module\.backend\.name=torch"):
        build_backend("vllm", senior, small_junior, tokenizer, junior_tokenizer=junior_tokenizer)
