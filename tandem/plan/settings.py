"""What of a composed training config decides memory, as one frozen record.

``Settings.from_config`` reads the keys; the fixes (``tandem.plan.fixes``) change a copy
(``dataclasses.replace``) and plan it again, so a fix needs no second composition.

What this file leaves out: the bytes (``tandem.plan.memory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tandem.errors import ConfigError
from tandem.plan.shape import DTYPE_BYTES, ModelShape, model_shape
from tandem.plan.time_settings import offload_mode

FSDP2_TARGET = "tandem.modules.sharding.FSDP2Strategy"
# the LM-head chunk of tandem.modules.logprobs, the default of module.logprob_chunk_tokens
CHUNK_TOKENS = 1024
# optimizers whose state is two float32 tensors per parameter (exp_avg, exp_avg_sq)
TWO_STATE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam")


@dataclass(frozen=True)
class Settings:
    """The memory-relevant choices of one run.

    Attributes:
        senior, junior: the two models' shapes.
        model_dtype: ``model.dtype``: the junior's weights, and the senior's compute dtype
            where it is lower than float32.
        accelerator: ``gpu`` or ``cpu``.
        strategy: ``single`` (one process), ``ddp`` or ``fsdp2``.
        world: processes in all (devices x nodes); nodes: machines.
        precision: ``trainer.precision`` (``bf16-mixed``, ``32-true``, ...).
        param_dtype, reduce_dtype, offload, activation_checkpointing, rollout_gather,
            reshard_after_forward: FSDP2's keys (``trainer.strategy.*``; ``offload`` is
            ``none``, ``fsdp`` or ``between_phases``).
        junior_device: ``model.junior_device`` (None: each rank's own device).
        junior_reads: the junior reads along in training rollouts (a tandem sampler, or a KL
            term), so it holds a KV cache.
        junior_reference: the junior's reference log-probs come from a no-grad pass of the
            trainer (a KL term with trainer-side old log-probs).
        old_pass: the old log-probs come from a no-grad pass of the trainer's senior.
        batch_size, group_size, mini_batches, max_tokens_per_micro_batch, logprob_chunk_tokens,
            max_new_tokens, kv_cache_gib: the keys of the same names.
        fast_draw: the engine draws at temperature 1 without top-k or top-p, through a weights
            buffer per model kept for the whole rollout (``tandem.engine.draw.fast``).
        prompt_tokens: the prompt cap (``data.max_prompt_tokens``, or the context less
            ``generation.max_new_tokens``).
        optimizer_states: float32 tensors per parameter the optimizer keeps (2 for AdamW).
        head_tokens: positions of the largest micro-batch that go through the LM head (its
            response tokens); None: every token of it, the bound a config allows. A
            measurement sets what it saw (``benchmarks/plan_memory.py``).
        read_tokens: tokens the largest micro-batch's forward reads, its rows' prompts read
            once a prompt (``tandem.modules.logprobs.pack(share_prompts=True)``); None: as
            many as its rows hold, the bound a config allows (groups of rows share a prompt
            only where they meet in a pack). A measurement sets what it saw.
        backend: ``module.backend.name`` (only the torch engine's memory is planned).
    """

    senior: ModelShape
    junior: ModelShape
    model_dtype: str
    accelerator: str
    strategy: str
    world: int
    nodes: int
    precision: str
    param_dtype: str | None
    reduce_dtype: str | None
    offload: str
    activation_checkpointing: bool
    rollout_gather: str
    reshard_after_forward: bool
    junior_device: str | None
    junior_reads: bool
    junior_reference: bool
    old_pass: bool
    batch_size: int
    group_size: int
    mini_batches: int
    max_tokens_per_micro_batch: int | None
    logprob_chunk_tokens: int
    prompt_tokens: int
    max_new_tokens: int
    kv_cache_gib: float | None
    fast_draw: bool
    optimizer_states: int
    backend: str
    vllm_utilization: float = 0.9
    vllm_dtype: str = "float32"
    vllm_sleep: bool = True
    head_tokens: int | None = None
    read_tokens: int | None = None

    @classmethod
    def from_config(cls, cfg: DictConfig, world_size: int | None = None) -> Settings:
        """Read a composed training config (``conf/train.yaml`` and its groups).

        Args:
            cfg: the config, as ``tandem.train`` composes it.
            world_size: processes in all (None: ``trainer.devices`` x ``trainer.num_nodes``,
                1 for ``auto``).
        """
        trainer, module = _plain(cfg, "trainer"), _plain(cfg, "module")
        model, generation = _plain(cfg, "model"), _plain(cfg, "generation")
        nodes = int(trainer.get("num_nodes") or 1)
        world = world_size if world_size is not None else _devices(trainer) * nodes
        strategy, fsdp = _strategy(trainer.get("strategy"), world)
        precision = _precision(trainer.get("precision", "32-true"))
        senior = model_shape(model["name_or_path"])
        junior = model_shape(model.get("junior_name_or_path") or model["name_or_path"])
        kl = float((module.get("loss") or {}).get("kl_beta", 0.0) or 0.0)
        backend_spec = module.get("backend") or {}
        backend = backend_spec.get("name", "torch")
        engine_args = backend_spec.get("engine_args") or {}
        sampler = _plain(cfg, "sampler").get("name")
        max_new = int(generation["max_new_tokens"])
        old_pass = _old_pass(module.get("old_logprobs", "auto"), backend, model, precision)
        return cls(
            senior=senior,
            junior=junior,
            model_dtype=model.get("dtype", "float32"),
            accelerator=_accelerator(trainer.get("accelerator", "cpu")),
            strategy=strategy,
            world=world,
            nodes=nodes,
            precision=precision,
            param_dtype=fsdp.get("param_dtype"),
            reduce_dtype=fsdp.get("reduce_dtype"),
            offload=offload_mode(fsdp),
            activation_checkpointing=bool(fsdp.get("activation_checkpointing", False)),
            rollout_gather=fsdp.get("rollout_gather", "whole"),
            reshard_after_forward=bool(fsdp.get("reshard_after_forward", True)),
            junior_device=model.get("junior_device"),
            junior_reads=sampler != "solo" or kl > 0,
            junior_reference=kl > 0 and old_pass,
            old_pass=old_pass,
            batch_size=int(cfg.batch_size),
            group_size=int(cfg.group_size),
            mini_batches=int(module.get("mini_batches", 1)),
            max_tokens_per_micro_batch=module.get("max_tokens_per_micro_batch"),
            logprob_chunk_tokens=int(module.get("logprob_chunk_tokens") or CHUNK_TOKENS),
            prompt_tokens=_prompt_cap(_plain(cfg, "data"), senior, max_new),
            max_new_tokens=max_new,
            kv_cache_gib=generation.get("kv_cache_gib"),
            fast_draw=float(generation.get("temperature", 1.0)) == 1.0
            and float(generation.get("top_p", 1.0)) >= 1.0
            and not int(generation.get("top_k", 0) or 0),
            optimizer_states=_optimizer_states(module.get("optimizer") or {}),
            backend=backend,
            # vLLM's default share of its device, and VLLMBackend's default dtype
            vllm_utilization=float(engine_args.get("gpu_memory_utilization", 0.9)),
            vllm_dtype=str(backend_spec.get("dtype", "float32")),
            # VLLMBackend's sleep: None sleeps on GPUs, the only devices planned
            vllm_sleep=backend_spec.get("sleep") is not False,
        )

    # -- what the formulas read ----------------------------------------------------------------
    @property
    def shards(self) -> int:
        """Parts the senior's weights, gradients and optimizer state are split into."""
        return self.world if self.strategy == "fsdp2" else 1

    @property
    def rows_per_rank(self) -> int:
        """Rollouts each process generates and trains on (its share of ``batch_size``)."""
        return math.ceil(self.batch_size / self.world)

    @property
    def prompts_per_rank(self) -> int:
        """Prompts each process generates from (``group_size`` rows each)."""
        return math.ceil(self.rows_per_rank / max(1, self.group_size))

    @property
    def row_tokens(self) -> int:
        """The longest row: the prompt cap plus ``max_new_tokens``."""
        return self.prompt_tokens + self.max_new_tokens

    @property
    def micro_tokens(self) -> int:
        """Tokens of the largest packed micro-batch (every row at its longest): the budget, or
        a mini-batch's rows in one pack; a row longer than the budget is a pack of its own."""
        whole = math.ceil(self.rows_per_rank / self.mini_batches) * self.row_tokens
        budget = self.max_tokens_per_micro_batch
        return whole if budget is None else min(whole, max(budget, self.row_tokens))

    @property
    def accumulates(self) -> bool:
        """Whether a mini-batch can take more than one micro-batch (every row at its longest),
        so that gradients accumulate over backwards before their one reduction."""
        whole = math.ceil(self.rows_per_rank / self.mini_batches) * self.row_tokens
        return self.max_tokens_per_micro_batch is not None and whole > self.micro_tokens

    @property
    def offloaded(self) -> str:
        """The offload layout in force: ``offload`` for FSDP2 on GPUs, else ``none`` (on a CPU
        the device is the host)."""
        on_gpu = self.strategy == "fsdp2" and self.accelerator == "gpu"
        return self.offload if on_gpu else "none"

    @property
    def read_positions(self) -> int:
        """Tokens the largest micro-batch's forward reads (its rows hold ``micro_tokens``, as
        attention lays them out)."""
        t = self.micro_tokens
        return t if self.read_tokens is None else min(t, self.read_tokens)

    @property
    def head_positions(self) -> int:
        """Positions of the largest micro-batch that go through the LM head."""
        t = self.micro_tokens
        return t if self.head_tokens is None else min(t, self.head_tokens)

    @property
    def weight_bytes(self) -> int:
        """Bytes of each senior weight as held: float32 master weights, unless the trainer
        casts the module itself (``bf16-true``)."""
        return 2 if self.precision in ("bf16-true", "16-true") else 4

    @property
    def autocast(self) -> bool:
        """Whether the senior computes under autocast (its weights cast op by op)."""
        return self.precision.endswith("-mixed") and not (
            self.strategy == "fsdp2" and self.param_dtype
        )

    @property
    def compute_bytes(self) -> int:
        """Bytes of the senior's activations: FSDP2's ``param_dtype``, autocast's dtype, or
        the weights' own."""
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def compute_dtype(self) -> str:
        """The dtype the senior computes in."""
        if self.strategy == "fsdp2" and self.param_dtype:
            return self.param_dtype
        if self.autocast:
            return "float16" if self.precision.startswith("16") else "bfloat16"
        return "float32" if self.weight_bytes == 4 else "bfloat16"

    @property
    def junior_bytes(self) -> int:
        """Bytes of each junior weight (and of its activations): ``model.dtype``."""
        return DTYPE_BYTES[self.model_dtype]

    @property
    def local_ranks(self) -> int:
        """Processes on one machine (the plan is of one machine; every machine is alike)."""
        return max(1, self.world // self.nodes)


def _plain(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = cfg.get(key)
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _devices(trainer: dict[str, Any]) -> int:
    devices = trainer.get("devices", 1)
    devices = len(devices) if isinstance(devices, list | tuple) else devices
    return devices if isinstance(devices, int) and devices > 0 else 1


def _accelerator(value: Any) -> str:
    if value in ("gpu", "cuda"):
        return "gpu"
    if value == "auto":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def _strategy(spec: Any, world: int) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, dict):
        if spec.get("_target_") == FSDP2_TARGET:
            return "fsdp2", spec
        target = str(spec.get("_target_", ""))
        if "DDP" in target:
            return "ddp", {}
        raise ConfigError(
            f"trainer.strategy._target_ ({target!r}) is not a strategy the memory plan knows: it "
            f"counts one process, DDP and {FSDP2_TARGET}."
        )
    if isinstance(spec, str) and spec.startswith("ddp"):
        return "ddp", {}
    if isinstance(spec, str) and spec.startswith("fsdp"):
        raise ConfigError(
            f"trainer.strategy ({spec!r}): the memory plan counts FSDP2 through {FSDP2_TARGET} "
            "(trainer=fsdp or trainer=fsdp_gpu), not Lightning's FSDP1."
        )
    return ("single" if world == 1 else "ddp"), {}


def _precision(value: Any) -> str:
    value = str(value)
    return {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}.get(
        value, value
    )


def _old_pass(source: str, backend: str, model: dict[str, Any], precision: str) -> bool:
    """Whether the trainer recomputes the old log-probs (``module.old_logprobs``)."""
    if source in ("trainer", "engine"):
        return source == "trainer"
    return not (backend == "torch" and model.get("dtype") == "float32" and precision == "32-true")


def _prompt_cap(data: dict[str, Any], senior: ModelShape, max_new: int) -> int:
    """The prompt cap as ``tandem.data.datamodule.prompt_token_cap`` reads it (not imported:
    that module brings Lightning); a cap beyond the context is the trainer's to refuse."""
    cap = data.get("max_prompt_tokens")
    if cap is None and senior.context is not None:
        cap = senior.context - max_new
    if cap is None or cap < 1:
        raise ConfigError(
            f"data.max_prompt_tokens is null and {senior.name} leaves no known room for a prompt "
            f"(context {senior.context}, generation.max_new_tokens {max_new}): the memory plan "
            "needs the longest prompt. Set data.max_prompt_tokens."
        )
    return int(cap)


def _optimizer_states(spec: dict[str, Any]) -> int:
    name = str(spec.get("_target_", "torch.optim.AdamW")).rsplit(".", 1)[-1]
    if name in TWO_STATE_OPTIMIZERS:
        return 2
    if name == "SGD":
        return 1 if spec.get("momentum") else 0
    return 2  # unknown: count as AdamW does
