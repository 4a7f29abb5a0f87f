"""Checking a composed config before anything expensive starts.

Every problem is collected and reported at once, each naming the key, the value, the rule and
the fix, so that a bad sweep fails in a second instead of after a model loads.

What this file leaves out: composing the config (Hydra) and building objects from it
(``tandem.train``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tandem.modules.loss import ADVANTAGE_MODES, OLD_LOGPROB_SOURCES, LossConfig
from tandem.modules.models import check_model_path
from tandem.registry import (
    BACKENDS,
    REWARDS,
    SAMPLERS,
    Registry,
    RegistryError,
    check_arguments,
)

MONITORS = ("val/tandem/accuracy", "val/solo/accuracy")


class ConfigError(ValueError):
    """One or more problems with a composed config."""


def validate_train_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Raise ``ConfigError`` listing every problem of a training config."""
    c = OmegaConf.to_container(cfg, resolve=False)
    problems: list[str] = []
    check_component(problems, "sampler", c.get("sampler"), SAMPLERS, skip=("tokenizer",))
    check_component(problems, "reward", c.get("reward"), REWARDS)
    val = c.get("validation") or {}
    if val.get("sampler") is not None:
        check_component(
            problems, "validation.sampler", val["sampler"], SAMPLERS, skip=("tokenizer",)
        )
    _check_batch(problems, c, world_size)
    _check_generation(problems, c.get("generation") or {})
    _check_module(problems, c.get("module") or {})
    backend = (c.get("module") or {}).get("backend")
    if backend is not None:
        check_component(
            problems, "module.backend", backend, BACKENDS, skip=("senior", "junior", "tokenizer")
        )
    for key in ("name_or_path", "junior_name_or_path"):
        value = (c.get("model") or {}).get(key)
        if value is not None:
            msg = check_model_path(value, f"model.{key}")
            if msg:
                problems.append(msg)
    if val.get("monitor") not in MONITORS:
        problems.append(
            f"validation.monitor ({val.get('monitor')!r}) must be one of {list(MONITORS)}."
        )
    if problems:
        raise ConfigError(
            f"{len(problems)} problem(s) in the config:\n" + "\n".join(f"- {p}" for p in problems)
        )


def check_component(
    problems: list[str], key: str, spec: Any, registry: Registry, skip: tuple[str, ...] = ()
) -> None:
    """Append to ``problems`` what is wrong with the component config ``spec`` at ``key``.

    Checks the registry name, the arguments against the constructor (``skip``: arguments the
    code passes itself, such as the tokenizer) and a probability ``p`` if there is one.
    """
    if not isinstance(spec, dict) or "name" not in spec:
        problems.append(f"{key} must be a mapping with a `name` naming a {registry.family}.")
        return
    try:
        cls = registry.get(spec["name"])
    except RegistryError as err:
        problems.append(f"{key}.name: {err}")
        return
    args = {k: v for k, v in spec.items() if k != "name"}
    try:
        check_arguments(cls, {**args, **dict.fromkeys(skip)}, where=key)
    except RegistryError as err:
        problems.append(str(err))
    p = args.get("p")
    if p is not None and not (isinstance(p, int | float) and 0.0 <= p <= 1.0):
        problems.append(
            f"{key}.p ({p!r}) must be a probability in [0, 1]: the chance the coin picks the "
            f"senior. Set {key}.p=0.5 for the paper's setting."
        )


def _check_batch(problems: list[str], c: dict, world_size: int) -> None:
    b, g = c.get("batch_size"), c.get("group_size")
    if not _positive_int(g):
        problems.append(f"group_size ({g!r}) must be a positive integer: rollouts per prompt.")
    if not _positive_int(b):
        problems.append(f"batch_size ({b!r}) must be a positive integer: rollouts per step.")
    if _positive_int(b) and _positive_int(g):
        if b % g:
            problems.append(
                f"batch_size ({b}) must be divisible by group_size ({g}): GRPO normalises "
                f"within whole groups. Set batch_size to a multiple of {g}."
            )
        elif (b // g) % world_size:
            problems.append(
                f"batch_size / group_size ({b // g} prompts) must be divisible by the number of "
                f"processes ({world_size}) so each rank gets whole groups. Set batch_size to a "
                f"multiple of {g * world_size}."
            )


def _check_generation(problems: list[str], g: dict) -> None:
    rules: dict[str, tuple[Callable[[Any], bool], str]] = {
        "temperature": (lambda v: isinstance(v, int | float) and v > 0, "a number > 0"),
        "top_p": (lambda v: isinstance(v, int | float) and 0 < v <= 1, "in (0, 1]"),
        "top_k": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0: off)"),
        "max_new_tokens": (_positive_int, "a positive integer"),
    }
    for key, (ok, rule) in rules.items():
        if key in g and not ok(g[key]):
            problems.append(f"generation.{key} ({g[key]!r}) must be {rule}.")


def _check_module(problems: list[str], m: dict) -> None:
    if m.get("advantage", "std") not in ADVANTAGE_MODES:
        problems.append(
            f"module.advantage ({m.get('advantage')!r}) must be one of {list(ADVANTAGE_MODES)}."
        )
    for key in ("num_iterations", "mini_batches"):
        if key in m and not _positive_int(m[key]):
            problems.append(f"module.{key} ({m[key]!r}) must be a positive integer.")
    t = m.get("logprob_temperature")
    if t is not None and not (isinstance(t, int | float) and not isinstance(t, bool) and t > 0):
        problems.append(
            f"module.logprob_temperature ({t!r}) must be a number > 0, or null for the rollout "
            "temperature."
        )
    if m.get("old_logprobs", "auto") not in OLD_LOGPROB_SOURCES:
        problems.append(
            f"module.old_logprobs ({m.get('old_logprobs')!r}) must be one of "
            f"{list(OLD_LOGPROB_SOURCES)}: where the loss's old log-probs come from."
        )
    if "lr" in m and not (isinstance(m["lr"], int | float) and m["lr"] > 0):
        problems.append(f"module.lr ({m['lr']!r}) must be a number > 0.")
    loss = dict(m.get("loss") or {})
    if isinstance(loss.get("constant"), str):  # an interpolation, checked once resolved
        loss.pop("constant")
    try:
        LossConfig(**loss)
    except (TypeError, ValueError) as err:
        problems.append(f"module.loss: {err}")


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
