"""Models and prompts for the engine tests: the tiny world model as senior, and a copy with
perturbed weights as junior, so that a swapped cache or log-prob would show."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.data.arithmetic import make_splits
from tandem.data.prompts import format_prompt


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """Run the tiny model single-threaded, then restore the setting.

    Its matrices are too small to gain from threads, and on a machine whose cores are busy with
    other work, threads that wait for each other make each step many times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


@pytest.fixture(scope="session")
def senior():
    return AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def junior(senior):
    model = copy.deepcopy(senior)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std().clamp(min=1e-3))
    return model


@pytest.fixture(scope="session")
def prompts(tokenizer):
    """Six chat prompts of different lengths, as token ids."""
    rows = make_splits(0, sizes={"train": 4, "validation": 4, "test": 6})["test"]
    ids = [tokenizer(format_prompt(tokenizer, r["prompt"]))["input_ids"] for r in rows]
    assert len({len(i) for i in ids}) > 2, "the prompts should be ragged"
    return ids


@pytest.fixture(scope="session")
def junior_folder(junior, tokenizer, tmp_path_factory):
    """The junior saved as a model folder, for engines that load folders (vLLM)."""
    folder = tmp_path_factory.mktemp("junior")
    junior.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
