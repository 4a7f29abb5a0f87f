"""The two models' forward passes of a step are queued without the host waiting in between.

On two GPUs that is what lets the junior's forward overlap the senior's. A CPU cannot show the
overlap, but it can show the cause of losing it: any read of a tensor's value by the host (a
``bool``, ``.item()``, ``.tolist()``, ``.cpu()``, ...) from the start of the senior's step to
the end of the junior's. The engine's own code must make none; this test fails if it does.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tandem.engine import SamplingParams, generate
from tandem.engine.reader import Reader
from tandem.samplers.word import WordSampler

# what makes the host wait for a device's queue
SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def host_reads_between_forwards():
    """Yield ``(reads, windows)``: the host reads made while a step's forwards were being queued
    (from the senior reader's ``step`` call to the end of the junior's), and how many such
    windows there were."""
    reads, windows, inside = [], [0], [False]
    real_step = Reader.step
    first = []

    def step(self, tokens, live):
        first[:] = first or [self]  # the senior's reader is the first to step
        if self is first[0]:
            inside[0] = True
            windows[0] += 1
            return real_step(self, tokens, live)
        out = real_step(self, tokens, live)
        inside[0] = False
        return out

    def spy(real, name):
        def wrapped(self, *args, **kwargs):
            if inside[0]:
                reads.append(name)
            return real(self, *args, **kwargs)

        return wrapped

    saved = {name: getattr(torch.Tensor, name) for name in SYNCS}
    for name, real in saved.items():
        setattr(torch.Tensor, name, spy(real, name))
    Reader.step = step
    try:
        yield reads, windows
    finally:
        Reader.step = real_step
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)


@pytest.mark.parametrize("junior_device", [None, "cpu"])
def test_no_host_read_between_the_two_forwards(senior, junior, prompts, tokenizer, junior_device):
    far = junior if junior_device is None else junior.to(junior_device)
    params = SamplingParams(max_new_tokens=12, samples_per_prompt=2, seed=1)
    expected = generate(senior, far, prompts, WordSampler(tokenizer), params)
    with host_reads_between_forwards() as (reads, windows):
        r = generate(senior, far, prompts, WordSampler(tokenizer), params)
    assert windows[0] == params.max_new_tokens - 1, "one window per step after the prefill"
    assert reads == [], f"host reads between the senior's and the junior's forward: {reads}"
    # and the spying changed nothing
    assert torch.equal(r.tokens, expected.tokens) and torch.equal(r.authors, expected.authors)
