"""``python -m tandem.train`` with every rollout the vLLM backend samples saved, for
``tests/engine/test_vllm_ranks.py``: Lightning starts the other ranks with this same script, so
each rank writes its own ``<TANDEM_ROLLOUTS>/rank<r>-<n>.pt`` (the prompts' rollouts, the
sampler and the sampling parameters), which the test replays."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import torch

from tandem.engine.vllm_backend import VLLMBackend

_generate = VLLMBackend.generate
_calls = [0]


def _saved(self, prompts, sampler=None, params=None, *, junior=None):
    rollouts = _generate(self, prompts, sampler, params, junior=junior)
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    folder = Path(os.environ["TANDEM_ROLLOUTS"])
    folder.mkdir(parents=True, exist_ok=True)
    record = {"rollouts": rollouts, "sampler": sampler, "params": params, "step": self.weights_step}
    torch.save(record, folder / f"rank{rank}-{_calls[0]}.pt")
    _calls[0] += 1
    return rollouts


if __name__ == "__main__":
    VLLMBackend.generate = _saved
    # tandem.train as ``python -m`` runs it (Hydra finds conf/ beside it), while this script
    # stays the process's main module, which Lightning starts again for the other rank
    runpy.run_module("tandem.train", run_name="__main__", alter_sys=False)
