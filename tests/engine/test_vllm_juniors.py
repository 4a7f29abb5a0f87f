"""Juniors of their own configs in the pair engine (runs where vLLM is installed, in
``.ci/vllm``): each half of the engine is built from its own model's config, so a junior of
another rope or norm setting, of another depth, width and KV shape, or of another family with
the senior's vocabulary, is served as it is.

References: Hugging Face teacher forcing of each model on its own folder, and the sampler's
scalar replay of the authors; a junior served with the senior's config would be off by many
nats (the models are made so that the configs matter: asserted too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from tandem.assets import TINY_WORLD
from tandem.engine import Rollouts, SamplingParams
from tandem.samplers import WordSampler
from tests.engine.test_vllm_backend import TEST_ENGINE, TOLERANCE, kept
from tests.engine.test_vllm_pair import replay

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")

from tandem.engine.vllm_backend import VLLMBackend


def tiny_config(**changes):
    config = AutoConfig.from_pretrained(TINY_WORLD)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def rope_and_norm(junior):
    """The perturbed junior's weights, read with another rope base and a norm epsilon that
    moves every logit: served with the senior's config, it is another model."""
    return junior, tiny_config(
        rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, rms_norm_eps=0.5
    )


def smaller(_):
    """Half the depth and width of the tiny world, one KV head (KV pages of another shape)."""
    config = tiny_config(
        num_hidden_layers=2,
        hidden_size=96,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        layer_types=["full_attention"] * 2,
        initializer_range=0.2,  # peaked distributions, so that log-probs tell models apart
    )
    return None, config


def other_family(_):
    """A Llama of the tiny world's vocabulary: another architecture class in the pair."""
    tiny = tiny_config()
    config = LlamaConfig(
        vocab_size=tiny.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=tiny.eos_token_id,
        pad_token_id=tiny.pad_token_id,
    )
    return None, config


JUNIORS = {"rope_and_norm": rope_and_norm, "smaller": smaller, "other_family": other_family}


@pytest.fixture(scope="module", params=list(JUNIORS))
def own(request, junior, tokenizer, tmp_path_factory):
    """(the junior's folder, the junior as Hugging Face reads it there)."""
    weights, config = JUNIORS[request.param](junior)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    if weights is not None:
        model.load_state_dict(weights.state_dict())
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def plain_forced(model, r: Rollouts) -> torch.Tensor:
    """``[N, T]`` each response token's log-prob under ``model``, one unpadded row at a time
    through its plain Hugging Face forward."""
    out = torch.zeros(r.tokens.shape)
    with torch.inference_mode():
        for i in range(r.num_rows):
            p, n = int(r.prompt_lengths[i]), int(r.lengths[i])
            ids = torch.cat([r.prompt_tokens[i, -p:], r.tokens[i, :n]])[None]  # [1, p + n]
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)  # [p + n, V]
            out[i, :n] = logprobs[p - 1 : p - 1 + n].gather(1, ids[0, p:, None])[:, 0]
    return out


def test_a_junior_is_served_from_its_own_config(own, senior, prompts, tokenizer):
    folder, model = own
    pair = kept(VLLMBackend("tiny", folder, tokenizer, **TEST_ENGINE))
    sampler = WordSampler(tokenizer, p=0.5, max_gap_tokens=3)
    params = SamplingParams(max_new_tokens=40, samples_per_prompt=2, eos_token_ids=(), seed=4)
    r = pair.generate(prompts, sampler, params)
    assert r.senior_mask.any() and r.junior_mask.any()
    assert torch.equal(r.authors, replay(sampler, r, params)[0])
    mine, seniors = plain_forced(model, r), plain_forced(senior, r)
    assert (r.junior_logprobs - mine)[r.mask].abs().max() < TOLERANCE
    assert (r.senior_logprobs - seniors)[r.mask].abs().max() < TOLERANCE
    # the two configs read differently: a junior served with the senior's would have shown
    assert (mine - seniors)[r.mask].abs().max() > 1.0


def test_pairs_that_cannot_share_a_block_table_are_refused(tmp_path: Path, tokenizer):
    """Before any engine starts, with the keys and the fix."""
    sliding = tiny_config(layer_types=["sliding_attention"] * 4, sliding_window=64)
    wider = tiny_config(vocab_size=1200)
    for name, config, says in (
        ("sliding", sliding, r"layer_types / sliding_window.*module.backend.name=torch"),
        ("wider", wider, r"vocab_size differs \(senior 1110, junior 1200\)"),
    ):
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        with pytest.raises(ValueError, match=says):
            VLLMBackend("tiny", str(tmp_path / name), tokenizer, **TEST_ENGINE)
