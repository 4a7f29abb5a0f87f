"""The tiny world's tokenizer: byte-level BPE trained on the task's corpus.

It is built the way Qwen's is, so that what we learn about boundaries on it carries over:
- the pre-tokenizer is Qwen's regex, so a word that follows a space starts with the space
  (``Ġapples``: the word-onset marker), numbers split into single digits (a tiny model learns
  arithmetic far faster that way), and a run of newlines is one token (``ĊĊ`` ends a step);
- the special tokens are Qwen's chat tokens: ``<|endoftext|>`` (padding), ``<|im_start|>``,
  ``<|im_end|>`` (end of a turn, the EOS), with Qwen's chat template.

The vocabulary is as large as the corpus supports: merges go on while any pair occurs at least
``min_frequency`` times, so every frequent word becomes one token.

What this file leaves out: the model (``tandem.assets.build``) and the boundary tables built from
a tokenizer (``tandem.samplers``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Qwen2/Qwen3's pre-tokenizer pattern: contractions, words with an optional leading
# non-letter (the space), single digits, punctuation runs, newline runs, other whitespace.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)

# Qwen's chat template without tools or thinking blocks: the tiny world has neither.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for ``transformers``.

    Args:
        texts: the training corpus.
        vocab_size: upper bound on the vocabulary (special tokens included); training stops
            earlier when no pair reaches ``min_frequency``.
        min_frequency: fewest occurrences for a merge.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
