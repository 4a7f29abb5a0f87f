"""How the vLLM backend starts its engine where it runs: the model runner, CUDA graphs, sleep
mode, the seeds and the processes, decided from the device, the run and the backend's options
before vLLM is imported (``engine_setup``: pure, so it is tested on any machine).

- **Model runner.** vLLM 0.32 runs its Model Runner V2 wherever Triton is available (every GPU)
  and its V1 runner elsewhere (its CPU build); each has its own logits-processor interface, and
  the pair brings a processor for both (``tandem.engine.vllm_processors``). V2's has been driven
  on CPU tensors only (``tests/engine/test_vllm_v2.py``), so until a GPU run shows it exact the
  backend asks for V1 on GPUs too (``VLLM_USE_V2_MODEL_RUNNER=0``, said in the log);
  ``model_runner="v2"`` runs V2 there, for that check.
- **CUDA graphs.** On GPUs vLLM's default (compiled, CUDA graphs), unless ``engine_args`` say
  ``enforce_eager``; on the CPU eager (vLLM's CPU build compiles slowly and gains little here).
- **Sleep mode.** On GPUs the engine sleeps while the trainer updates (``VLLMBackend.sleep``:
  level 1, weights and CUDA graphs backed up in host memory, the KV cache dropped) and wakes
  before the next rollout, weights first, so that the new weights are loaded before the KV
  cache comes back. vLLM's CPU build has none.
- **Seeds.** A rollout's rows must reproduce from ``SamplingParams.seed``. A seed on every
  request sends the V1 runner's sampler down a loop over the requests' own generators (and
  keeps FlashInfer's sampler off); ``seeds="batch"`` seeds the device's generator once per
  ``generate`` instead, which reproduces the batch, not each row alone. V2 draws from
  per-request seeds in one kernel, so it keeps them (``seeds="request"``).
- **Processes.** Under a multi-process trainer every rank runs its own engine over its own
  prompts (vLLM's ``external_launcher``, tensor parallel 1, as TRL's colocated mode does). A
  tensor, pipeline or data parallel engine is refused: the pen processor and the weight sync
  run in the trainer's process.

Also here: reading the model folders the engine starts from, and the log of these choices.

What this file leaves out: the engine itself (``tandem.engine.vllm_backend``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("tandem.engine.vllm_backend")  # said as the backend's
_said: set[str] = set()
RUNNERS = ("v1", "v2")
SEEDS = ("auto", "batch", "request")
PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


@dataclass(frozen=True)
class EngineSetup:
    """What the backend starts its engines with.

    Attributes:
        args: ``vllm.LLM`` keyword arguments (besides the model and the processor).
        env: environment variables set before an engine starts.
        v2: whether vLLM runs its Model Runner V2 (the pair then gets the V2 processor).
        sleep: whether the engine sleeps while the trainer updates.
        seeds: ``batch`` (one seed per ``generate``) or ``request`` (one per request).
        notes: what the log says once about these choices.
    """

    args: dict[str, Any]
    env: dict[str, str]
    v2: bool
    sleep: bool
    seeds: str
    notes: tuple[str, ...]


def engine_setup(
    *,
    gpu: bool,
    world: int,
    rank: int,
    local_rank: int,
    engine_args: dict[str, Any] | None = None,
    model_runner: str = "v1",
    sleep: bool | None = None,
    seeds: str = "auto",
    kv_cache_gib: float = 1.0,
) -> EngineSetup:
    """The engine's settings (see the module).

    Args:
        gpu: whether vLLM runs on a GPU (else its CPU build).
        world, rank, local_rank: the trainer's processes (1, 0, 0 for one).
        engine_args: the user's ``vllm.LLM`` arguments, which win where they say something.
        model_runner: ``v1`` or ``v2`` on GPUs (the CPU build runs V1 only).
        sleep: sleep during the update (None: where vLLM can, on GPUs).
        seeds: ``batch``, ``request`` or ``auto`` (batch on V1, request on V2).
        kv_cache_gib: the KV cache's host memory on the CPU (on GPUs vLLM takes
            ``gpu_memory_utilization`` of the device instead).
    """
    user = dict(engine_args or {})
    _refuse(gpu, user, model_runner, sleep, seeds)
    v2 = gpu and model_runner == "v2"
    notes = [
        f"vLLM's Model Runner {'V2' if v2 else 'V1'}"
        + (
            ""
            if v2 or not gpu
            else " (VLLM_USE_V2_MODEL_RUNNER=0: the pair's V2 processor awaits a GPU run "
            "showing it exact; model_runner=v2 runs it)"
        )
    ]
    args: dict[str, Any] = {}
    if not gpu:
        args["enforce_eager"] = True
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        notes.append("eager on the CPU (no compile, no CUDA graphs), no sleep mode")
    sleeps = gpu if sleep is None else sleep
    if sleeps:
        args["enable_sleep_mode"] = True
        args["sleep_mode_offload_cudagraph"] = not user.get("enforce_eager", False)
        notes.append("sleep mode: the engine sleeps while the trainer updates")
    if gpu:
        eager = user.get("enforce_eager", False)
        notes.append("eager (engine_args.enforce_eager)" if eager else "CUDA graphs on")
    chosen = ("request" if v2 else "batch") if seeds == "auto" else seeds
    notes.append(f"seeds: one per {'request' if chosen == 'request' else 'generate call'}")
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1" if v2 else "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if world > 1:
        args["distributed_executor_backend"] = "external_launcher"
        env |= {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world)}
        notes.append(f"one engine per rank: rank {rank} of {world} (external_launcher)")
    return EngineSetup(args | user, env, v2, sleeps, chosen, tuple(notes))


def _refuse(gpu: bool, user: dict[str, Any], runner: str, sleep: bool | None, seeds: str) -> None:
    """Every problem with these options at once, before any engine starts."""
    problems = []
    for key in PARALLEL:
        if int(user.get(key, 1) or 1) > 1:
            problems.append(
                f"engine_args.{key} ({user[key]}) must be 1: the pair's pen processor and the "
                "weight sync run in the trainer's process, one engine per rank. Scale out with "
                "more ranks (trainer.devices), each running its own engine."
            )
    if runner not in RUNNERS:
        problems.append(f"model_runner ({runner!r}) must be one of {RUNNERS}.")
    elif runner == "v2" and not gpu:
        problems.append(
            "model_runner='v2' needs a GPU: vLLM's Model Runner V2 runs on Triton, which "
            "vLLM's CPU build lacks. Use model_runner=v1 on the CPU."
        )
    if sleep and not gpu:
        problems.append("sleep=true needs a GPU: vLLM's CPU build has no sleep mode. Unset it.")
    if seeds not in SEEDS:
        problems.append(f"seeds ({seeds!r}) must be one of {SEEDS}.")
    elif seeds == "batch" and runner == "v2" and gpu:
        problems.append(
            "seeds='batch' needs the V1 runner: Model Runner V2 draws from per-request seeds "
            "(no per-request loop there). Use seeds=request or seeds=auto."
        )
    if problems:
        raise ValueError("The vLLM backend's options:\n- " + "\n- ".join(problems))


def processes() -> tuple[int, int, int]:
    """(world size, rank, local rank) of the trainer's processes, (1, 0, 0) for one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 1, 0, 0
    rank = dist.get_rank()
    return dist.get_world_size(), rank, int(os.environ.get("LOCAL_RANK", rank))


def on_gpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def set_environment(env: dict[str, str]) -> None:
    """Set what vLLM reads from the environment when an engine starts."""
    multi = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if multi != "0":
        raise RuntimeError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is not 0: the backend loads new weights into the "
            "engine in-process and its logits processor reads tables from this process. "
            "Unset it or set it to 0."
        )
    os.environ.update(env)


def folder_config(path: str) -> dict[str, Any]:
    """A model folder's config, with the defaults its class fills in."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).to_dict()


def folder_tokenizer(path: str) -> Any:
    """The model folder's tokenizer, padding with EOS where it names no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def eos_sources(path: str) -> list[Any]:
    """A model folder's generation config (where it has one) and config: where it names its
    EOS ids, read in that order as the torch engine reads them."""
    from transformers import AutoConfig, GenerationConfig

    sources = []
    if Path(path, "generation_config.json").is_file():
        sources.append(GenerationConfig.from_pretrained(path))
    return [*sources, AutoConfig.from_pretrained(path)]


def say_once(notes: Sequence[str]) -> None:
    """Log each of ``notes`` the first time this process starts an engine with it."""
    for note in notes:
        if note not in _said:
            _said.add(note)
            log.info("vllm: %s", note)
