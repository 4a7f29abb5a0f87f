"""What of a composed training config decides time beyond what decides memory, as one frozen
record (``TimeSettings.from_config``), and the two readings other work is changing:

- ``offload_mode``: ``trainer.strategy.offload`` (``none``, ``fsdp``, ``between_phases``);
- ``vllm_levers``: vLLM's CUDA graphs (on unless ``enforce_eager``; never on a CPU) and its
  sleep mode during the update (``module.backend.sleep``, or vLLM's own
  ``engine_args.enable_sleep_mode``; on by default on GPUs).

What this file leaves out: the seconds (``tandem.plan.time``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tandem.errors import ConfigError

OFFLOADS = ("none", "fsdp", "between_phases")


@dataclass(frozen=True)
class TimeSettings:
    """The time-relevant choices of one run beyond ``tandem.plan.settings.Settings``.

    Attributes:
        max_steps: ``trainer.max_steps``.
        num_iterations: ``module.num_iterations``.
        offload: ``none``, ``fsdp`` (FSDP2's CPUOffloadPolicy) or ``between_phases``.
        tandem: the junior writes (a handoff sampler), not only reads.
        tempered: the loss's temperature is not 1, so the engine records tempered log-probs
            and the trainer's passes divide the logits.
        temperatures: temperatures the trainer's old log-prob pass computes at (2 where the
            engine recorded no log-probs at the loss temperature, vLLM: it computes the raw ones
            too, to compare with the engine's).
        sync_every: the vLLM backend's weight sync interval, in training steps.
        vllm_graphs, vllm_sleep: vLLM's CUDA graphs, and its sleep during the update.
        threads: torch threads of a CPU run (None: torch's default).
        response_tokens: the mean response length the trainer's passes are planned at (None:
            ``generation.max_new_tokens``, every row at its longest).
    """

    max_steps: int
    num_iterations: int = 1
    offload: str = "none"
    tandem: bool = True
    tempered: bool = True
    temperatures: int = 1
    sync_every: int = 1
    vllm_graphs: bool = False
    vllm_sleep: bool = False
    threads: int | None = None
    response_tokens: int | None = None

    @classmethod
    def from_config(cls, cfg: DictConfig, gpu: bool) -> TimeSettings:
        """Read a composed training config; ``gpu``: it trains on GPUs."""
        trainer, module = _plain(cfg, "trainer"), _plain(cfg, "module")
        generation, sampler = _plain(cfg, "generation"), _plain(cfg, "sampler")
        backend = module.get("backend") or {}
        loss_t = module.get("logprob_temperature")
        loss_t = float(generation.get("temperature", 1.0) if loss_t is None else loss_t)
        graphs, sleep = vllm_levers(backend, gpu)
        strategy = trainer.get("strategy")
        threads = cfg.get("threads")
        return cls(
            max_steps=int(trainer.get("max_steps") or 1),
            num_iterations=int(module.get("num_iterations", 1)),
            offload=offload_mode(strategy if isinstance(strategy, dict) else {}),
            tandem=sampler.get("name") != "solo",
            tempered=loss_t != 1.0,
            temperatures=2 if backend.get("name", "torch") == "vllm" else 1,
            sync_every=int(backend.get("sync_every", 1)),
            vllm_graphs=graphs,
            vllm_sleep=sleep,
            threads=int(threads) if threads else None,
        )


def offload_mode(strategy: dict[str, Any]) -> str:
    """``trainer.strategy.offload`` (``none`` where the strategy has no such key), read with
    its older spelling ``cpu_offload`` where given: true is FSDP2's CPU offload (``fsdp``),
    false any layout but that one. The one reading of both, for the strategy and the plans."""
    mode = strategy.get("offload", "none")
    if mode not in OFFLOADS:
        raise ConfigError(
            f"trainer.strategy.offload ({mode!r}) must be one of {', '.join(OFFLOADS)}: none, "
            "FSDP2's CPU offload (fsdp), or the shards and AdamW state on the host between "
            "phases (between_phases)."
        )
    old = strategy.get("cpu_offload")
    if old is None:
        return str(mode)
    if (bool(old) and mode == "between_phases") or (not old and mode == "fsdp"):
        raise ConfigError(
            f"trainer.strategy.cpu_offload ({old}) contradicts trainer.strategy.offload "
            f"({mode!r}): cpu_offload is the older spelling of offload=fsdp. Set offload alone "
            "and leave cpu_offload null."
        )
    return "fsdp" if old else str(mode)


def vllm_levers(backend: dict[str, Any], gpu: bool) -> tuple[bool, bool]:
    """``(CUDA graphs, sleep during the update)`` of the vLLM backend (see the module)."""
    args = backend.get("engine_args") or {}
    graphs = gpu and not bool(args.get("enforce_eager", False))
    sleep = backend.get("sleep", args.get("enable_sleep_mode", gpu))
    return graphs, gpu and bool(sleep)


def _plain(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = cfg.get(key)
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
