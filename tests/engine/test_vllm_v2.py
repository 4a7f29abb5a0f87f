"""The pair's Model Runner V2 processor on CPU tensors (runs where vLLM is installed, in
``.ci/vllm``): vLLM's CPU build runs the V1 runner only, so the V2 processor is loaded by
vLLM's own V2 loader and driven with vLLM's own V2 dataclasses (``LogitsContext``), step by
step, over the very batch a V1 run of the pair wrote.

The V1 run is recorded at every sampling step: both models' logits, the batch's rows, how many
tokens each row had written, and the logits the V1 processor handed vLLM's sampler. The V2
processor then sees the same steps as V2 lays them out (request slots from a free list, each
row's position and the token fed at it, a preempted request re-added on a new slot) and must
hand the sampler the same logits, and end with the same authors, tokens and log-probs, row
for row.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.vllm_engine import engine_setup
from tandem.samplers import WordSampler
from tests.engine.test_vllm_backend import TEST_ENGINE, kept

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")

from vllm import SamplingParams as VSamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import (
    LogitsContext,
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)

from tandem.engine import vllm_processors
from tandem.engine.vllm_backend import VLLMBackend
from tandem.engine.vllm_pens import KEY, PENS, Pens
from tandem.engine.vllm_processors import pen_processor

PenProcessorV1, PenProcessorV2 = pen_processor(False), pen_processor(True)

BOARD = "v2-drive"


def load_v2(classes: list[type]) -> list:
    """vLLM's V2 loader on ``classes``, with a request state of CPU stand-ins (V2's own
    pins host memory, which needs an accelerator)."""
    hf_config = SimpleNamespace(tandem_board=BOARD)
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config))
    states = SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=64,
        vocab_size=1110,
        all_token_ids=None,
        prompt_len=None,
        prefill_len=None,
        total_len=None,
    )
    return build_custom_logits_processors(config, states, False, classes)


def test_vllms_v2_loader_takes_the_processor_the_backend_builds_for_v2():
    setup = engine_setup(gpu=True, world=1, rank=0, local_rank=0, model_runner="v2")
    chosen = pen_processor(setup.v2)
    assert chosen is PenProcessorV2 and chosen.__name__ == "PenProcessorV2"
    (processor,) = load_v2([chosen])
    assert isinstance(processor, PenProcessorV2)
    validate = build_custom_logits_processors_params_validator([chosen])
    validate(VSamplingParams(extra_args={KEY: "0:0"}))
    # the V1 processor is what the V2 loader refuses (the engine would not start)
    with pytest.raises(ValueError, match="is not a subclass"):
        load_v2([pen_processor(False)])


class Recorder:
    """Every V1 sampling step of the pair: its logits, rows and the sampler's input."""

    def __init__(self, monkeypatch) -> None:
        self.steps: list[dict] = []
        self.pens: Pens | None = None
        real = PenProcessorV1.apply

        def apply(processor, logits):
            step = processor.board.step
            rows = [(at, pens, i, pens.fed[i]) for at, (pens, i, _) in processor.rows.items()]
            out = real(processor, logits)
            if rows and step is not None and step.rows == logits.shape[0]:
                self.pens = rows[0][1]
                order = sorted((at, i, fed) for at, _, i, fed in rows)
                self.steps.append({"step": step, "rows": order, "logits": out.clone()})
            return out

        monkeypatch.setattr(PenProcessorV1, "apply", apply)


def drive_v2(recorded: Recorder, v1: Pens, prompts: list[list[int]]) -> tuple[Pens, int]:
    """The recorded steps through a V2 processor; its ``Pens`` and how many steps' logits
    it handed the sampler unlike V1's."""
    pens = Pens(v1.sampler, v1.params, v1.context, v1.prompts, v1.steps, v1.stop)
    PENS["drive"] = pens
    (processor,) = load_v2([PenProcessorV2])
    board = vllm_processors.BOARDS[BOARD]
    free, slot, differ = list(range(64)), {}, 0
    tokens = [[w[0] for w in written] for written in v1.written]
    for record in recorded.steps:
        here = {i for _, i, _ in record["rows"]}
        for i in [i for i in slot if i not in here]:  # finished or preempted: the slot is free
            free.append(slot.pop(i))
        for _, i, _ in record["rows"]:
            if i not in slot:  # new, or back after a preemption: V2 adds it again
                slot[i] = free.pop()
                params = VSamplingParams(extra_args={KEY: f"drive:{i}"})
                assert processor.add_request(slot[i], params)
        fed = [prompts[i][-1] if n == 0 else tokens[i][n - 1] for _, i, n in record["rows"]]
        pos = [pens.prompts[i] + n - 1 for _, i, n in record["rows"]]
        slots = torch.tensor([slot[i] for _, i, _ in record["rows"]])
        ctx = LogitsContext(
            expanded_idx_mapping=slots,
            idx_mapping=slots,
            idx_mapping_np=slots.numpy(),
            expanded_local_pos=torch.zeros_like(slots),
            input_ids=torch.tensor(fed),
            pos=torch.tensor(pos),
            seq_lens_upper_bound_np=np.array(pos) + 1,
        )
        board.step = record["step"]
        logits = record["step"].senior.clone()  # what the pair model hands vLLM
        out = processor.apply(logits, ctx)
        differ += int(not torch.equal(out, record["logits"]))
        # rows that left the batch keep one row of their step's logits, not the whole step
        kept_steps = {id(e[0]) for e in pens.unread if e is not None and e[0].rows > 1}
        assert kept_steps <= {id(record["step"])}, "a finished row holds a whole step"
    pens.finish(tokens)
    PENS.pop("drive")
    return pens, differ


def test_the_v2_processor_writes_what_v1_wrote(junior_folder, prompts, tokenizer, monkeypatch):
    """A batch with retractions, early stops and preemptions (a KV cache of 10 blocks of 128
    positions for 24 rows)."""
    recorded = Recorder(monkeypatch)
    small = VLLMBackend(
        "tiny",
        junior_folder,
        tokenizer,
        **TEST_ENGINE,
        engine_args={"num_gpu_blocks_override": 10},
    )
    sampler = WordSampler(tokenizer, p=0.5, max_gap_tokens=4)
    params = SamplingParams(max_new_tokens=200, samples_per_prompt=4, eos_token_ids=(2,), seed=7)
    r = kept(small).generate(prompts, sampler, params)
    v1 = recorded.pens
    assert small.resumed > 0 and len(set(r.lengths.tolist())) > 1, "no preemption, no early stop"
    forced = sum(int((s["logits"].isfinite().sum(-1) == 1).sum()) for s in recorded.steps)
    assert forced > 0, "no step forced a token: the onset rule's proposals went untested"
    rows = [list(p) for p in prompts for _ in range(params.samples_per_prompt)]
    v2, differ = drive_v2(recorded, v1, rows)
    print(f"{len(recorded.steps)} steps, {small.resumed} resumed, {forced} forced rows")
    assert differ == 0, f"the V2 processor handed the sampler other logits at {differ} steps"
    assert v2.written == v1.written and v2.cut == v1.cut
    assert v2.resumed == v1.resumed
