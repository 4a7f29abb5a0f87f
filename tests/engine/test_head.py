"""The LM head writing a step's logits into the reader's buffer (``tandem.engine.head``): the same
logits bit for bit as the model's own head, and only where it can be done exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem.engine.head import HeadInto, _linear_into
from tandem.engine.layout import Prompts
from tandem.engine.reader import Reader


@pytest.mark.parametrize("shape", [(64, 1, 128), (16, 1, 64), (3, 1, 64), (7, 64)])
@pytest.mark.parametrize("strided", [False, True])
def test_the_product_into_the_buffer_is_f_linear_bit_for_bit(shape, strided) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(5003, shape[-1], generator=g) * 0.05
    # a prefill's last position, hidden[:, -1]: rows not contiguous, which F.linear may
    # multiply otherwise (other bits), so it is left to F.linear
    x = torch.randn(shape[0], 9, *shape[1:], generator=g)[:, -1] if strided else None
    x = torch.randn(*shape, generator=g) if x is None else x
    rows = x.numel() // x.shape[-1]
    out = torch.empty(rows, weight.shape[0])
    got = _linear_into(x, weight, out)
    assert got.shape == (*shape[:-1], weight.shape[0])
    assert (got.data_ptr() == out.data_ptr()) == (not strided)
    assert torch.equal(got, F.linear(x, weight))


def steps(model, prompts, buffered: bool, autocast: bool = False) -> list[torch.Tensor]:
    """The logits of four steps of a reader (copied as they come), its head buffered or not."""
    batch = Prompts.of(prompts, 0)
    reader = Reader(model)
    if not buffered:
        reader._head = HeadInto.__new__(HeadInto)
        reader._head.head = None
    out = []
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        reader.prefill(batch.ids, batch.mask, 2, 4)
        n = reader.position.shape[0]
        live = torch.ones(n, dtype=torch.bool)
        for t in range(4):
            logits = reader.step(torch.arange(n) * 5 + t, live)
            buffer = reader._head.buffer if buffered else None
            out.append(
                (logits.clone(), buffer is not None and logits.data_ptr() == buffer.data_ptr())
            )
    return out


def test_a_readers_steps_are_the_models_own_logits_written_into_its_buffer(senior, prompts):
    mine = steps(senior, prompts, buffered=True)
    theirs = steps(senior, prompts, buffered=False)
    assert all(in_buffer for _, in_buffer in mine), "the steps' logits are the buffer's"
    for (a, _), (b, _) in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)


def test_under_autocast_and_with_a_biased_head_the_head_computes_as_always(senior, prompts):
    assert not any(in_buffer for _, in_buffer in steps(senior, prompts, True, autocast=True))
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: torch.nn.Linear(8, 11, bias=True)
    assert HeadInto(model).head is None
