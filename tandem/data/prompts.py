"""Turning a problem into the model's input text, the same way for every model and dataset.

The instruction asks for the final answer in ``\\boxed{}``, which is what the reward verifies.
What this file leaves out: batching (the data module) and the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
