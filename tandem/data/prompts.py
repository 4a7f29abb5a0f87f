"""Turning a problem into the model's input text, the same way for every model and dataset.

The instruction asks for the final answer in ``\\boxed{}``, which is what the reward verifies.
What this file leaves out: batching (the data module) and the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

INSTRUCTION = "Put the final answer in \\boxed{}."


def user_message(problem: str, instruction: str = INSTRUCTION, separator: str = "\n") -> str:
    """The user turn for ``problem``: the problem, ``separator``, the answer-format
    instruction (the authors' runs join them with a space)."""
    return f"{problem.strip()}{separator}{instruction}" if instruction else problem.strip()


def format_prompt(
    tokenizer: Any, problem: str, instruction: str = INSTRUCTION, separator: str = "\n"
) -> str:
    """The chat-formatted prompt text, ending where the assistant's answer begins."""
    messages = [{"role": "user", "content": user_message(problem, instruction, separator)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(
    tokenizer: Any, problems: Sequence[str], instruction: str = INSTRUCTION, separator: str = "\n"
) -> list[list[int]]:
    """Each problem's chat-formatted prompt in ``tokenizer``'s ids (its own chat template): what
    a model of that tokenizer reads, the senior or a junior of another family alike."""
    texts = [format_prompt(tokenizer, p, instruction, separator) for p in problems]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


_told: set[str] = set()


def junior_prompt_ids(
    tokenizer: Any, problems: Sequence[str], instruction: str, separator: str
) -> list[list[int]] | None:
    """``prompt_ids`` for a junior of another family, or None if its tokenizer has no chat
    template (a base model): the engine then re-tokenizes the senior's prompt text, said once."""
    if getattr(tokenizer, "chat_template", None):
        return prompt_ids(tokenizer, problems, instruction, separator)
    name = getattr(tokenizer, "name_or_path", "?")
    if name not in _told:
        _told.add(name)
        log.warning(
            "the junior's tokenizer (%s) has no chat template: it reads the prompts as the "
            "senior's chat-formatted text, re-tokenized. Give it a chat template "
            "(tokenizer.chat_template) if it was tuned on one.",
            name,
        )
    return None
