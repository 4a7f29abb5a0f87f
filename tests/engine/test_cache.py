"""The reserved KV cache gives the same logits as a plain forward, past its capacity too."""

from __future__ import annotations

import torch

from tandem.engine.cache import new_cache


def test_reserved_cache_matches_a_full_forward(senior):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (3, 12), generator=g)
    cache = new_cache(senior, capacity=4)  # too small on purpose: storage must grow
    assert all(type(layer).__name__ == "ReservedLayer" for layer in cache.layers)
    with torch.inference_mode():
        full = senior(input_ids=ids).logits
        out = senior(input_ids=ids[:, :3], cache=cache, use_cache=True).logits
        steps = [out[:, -1]]
        cache.batch_repeat_interleave(2)  # rows 0,0,1,1,2,2 ...
        cache.batch_select_indices(torch.tensor([0, 2, 4]))  # ... and back to 0,1,2
        for t in range(3, 12):
            pos = torch.full((3, 1), t)
            out = senior(input_ids=ids[:, t : t + 1], position_ids=pos, cache=cache).logits
            steps.append(out[:, -1])
    assert cache.get_seq_length() == 12
    assert torch.allclose(torch.stack(steps, 1), full[:, 2:], atol=1e-4)
