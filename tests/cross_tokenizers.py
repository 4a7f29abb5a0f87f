"""A tokenizer that cannot share words with a partner of another vocabulary, for the tests of
the cross-vocabulary engine and of its pair check."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tandem.engine.cross import PROBE_TEXTS


def trailing_space_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE whose words carry the space *after* them (``We `` ``begin``): text cut
    before a space tokenizes differently from the whole."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\S+\s*"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(PROBE_TEXTS) * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)
