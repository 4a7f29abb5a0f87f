"""Checking a composed config before anything expensive starts.

Every problem is collected and reported at once, each naming the key, the value, the rule and
the fix, so that a bad sweep fails in a second instead of after a model loads. Every key of every
group is known, whether it came from a file or was added with ``+``: groups that build an object
are checked against its constructor's signature (the module, its optimizer, scheduler, loss and
backend, ``generation`` against ``SamplingParams``, the sampler, the reward, the data source, the
trainer, the loggers); the others against the keys the run reads (``conf/train.yaml`` for the
top level). A junior with a tokenizer of its own is checked as a pair (``check_pair``) from the
two tokenizers alone, before either model loads.

This module imports no model library when it loads: ``check_before_imports`` runs the checks that
read only the config (its keys, ranges, batch shape and precision) before ``tandem.train`` imports
torch, Lightning and transformers, so that a typo is refused in a second; the checks that read a
class's signature or a tokenizer import what they read, inside ``validate_train_config``.

What this file leaves out: composing the config (Hydra) and building objects from it
(``tandem.train``).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from tandem.config_keys import (
    DATA_RUN_KEYS,
    GENERATION_FROM_RUN,
    HYDRA_KEYS,
    TARGET_FROM_RUN,
    TRAINER_FROM_RUN,
    did_you_mean,
    indexed,
    key_problems,
    unknown_keys,
)
from tandem.config_models import check_models, check_pair
from tandem.config_rules import check_data_size, check_hf_rows, check_learning
from tandem.errors import ConfigError
from tandem.registry import (
    BACKENDS,
    DATASETS,
    METRICS,
    REWARDS,
    SAMPLERS,
    Registry,
    RegistryError,
    check_arguments,
)

__all__ = [
    "ConfigError",
    "check_before_imports",
    "check_component",
    "check_pair",
    "config_error_message",
    "validate_train_config",
]

CONF = Path(__file__).resolve().parents[1] / "conf"
MONITORS = ("val/tandem/accuracy", "val/solo/accuracy")
# the keys of the groups that build no object of their own: what tandem.train and the module read
VALIDATION_KEYS = (
    "every_n_steps",
    "size",
    "sampler",
    "monitor",
    "temperature",
    "top_p",
    "at_start_and_end",
)
MODEL_KEYS = ("name_or_path", "junior_name_or_path", "dtype", "junior_device")
# the module's arguments that other groups decide -> the key each must interpolate
MODULE_FROM_RUN = {
    "model": "model.name_or_path",
    "sampler": "sampler",
    "reward": "reward",
    "generation": "generation",
    "group_size": "group_size",
    "dtype": "model.dtype",
    "seed": "seed",
    "val_sampler": "validation.sampler",
    "val_temperature": "validation.temperature",
    "val_top_p": "validation.top_p",
    "metrics": "metrics",
}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


Rule = tuple[Callable[[Any], bool], str]
# the range of every numeric key the run itself reads; a feature that can be off is off with
# null, never a negative. The keys that become SamplingParams (generation, the validation's and
# the loss's temperatures) are checked by its own rules (``tandem.engine.params.RULES``).
RANGES: dict[str, Rule] = {
    "seed": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "threads": (lambda v: v is None or (_int(v) and v >= 1), "an integer >= 1, or null (torch's)"),
    "checkpoint_every_n_steps": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "module.optimizer.lr": (lambda v: _number(v) and v > 0, "a number > 0"),
    "module.optimizer.weight_decay": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "module.max_grad_norm": (
        lambda v: v is None or (_number(v) and v > 0),
        "a number > 0, or null for no clipping",
    ),
    "module.num_iterations": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "module.max_tokens_per_micro_batch": (
        lambda v: v is None or (_int(v) and v >= 1),
        "an integer >= 1 (tokens per packed micro-batch), or null for one per mini-batch",
    ),
    "module.logprob_chunk_tokens": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "module.mini_batches": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "module.rollouts_to_log": (lambda v: _int(v) and v >= 0, "an integer >= 0 (0: none)"),
    "module.rollout_log_every": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "module.drop_equal_groups": (lambda v: isinstance(v, bool), "true or false"),
    "module.mask_truncated": (lambda v: isinstance(v, bool), "true or false"),
    "validation.every_n_steps": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "validation.size": (
        lambda v: v is None or (_int(v) and v >= 1),
        "an integer >= 1, or null for the whole split",
    ),
    "data.max_prompt_tokens": (
        lambda v: v is None or (_int(v) and v >= 1),
        "an integer >= 1, or null for the model's context minus generation.max_new_tokens",
    ),
    "trainer.max_steps": (lambda v: _int(v) and v >= 1, "an integer >= 1: the run's length"),
    "trainer.devices": (
        lambda v: _devices(v),
        "an integer >= 1 (devices per node), -1 (all), 'auto', or a list of device ids",
    ),
    "trainer.num_nodes": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "trainer.log_every_n_steps": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
}


def _devices(v: Any) -> bool:
    """What Lightning's ``devices`` takes, less what selects no device (0, "0", [])."""
    if isinstance(v, str):
        v = v.strip()
        ids = [part.strip() for part in v.split(",") if part.strip()]
        return (
            v in ("auto", "-1")
            or (v.isdigit() and int(v) >= 1)
            or ("," in v and bool(ids) and all(i.isdigit() for i in ids))
        )
    if isinstance(v, list | tuple):
        return bool(v) and all(_int(i) and i >= 0 for i in v)
    return _int(v) and (v >= 1 or v == -1)


def check_before_imports(cfg: DictConfig, world_size: int = 1) -> None:
    """Raise ``ConfigError`` for the problems a config shows without any model library: its
    keys, ranges, batch shape and precision. ``validate_train_config`` checks these too; this
    subset runs before torch loads, so that a typo costs a second, not the imports."""
    problems = _problems_before_imports(OmegaConf.to_container(cfg, resolve=False), world_size)
    _raise_problems(
        problems,
        " (the model, the data and the components' own rules are checked once these are fixed)",
    )


def _problems_before_imports(c: dict, world_size: int) -> list[str]:
    return _early_checks(c, world_size)[0]


def _early_checks(c: dict, world_size: int) -> tuple[list[str], set[str]]:
    """The problems found without imports, and the components whose arguments were read."""
    problems, read = key_problems(c)
    unknown_keys(problems, "", c, _top_level_keys())
    unknown_keys(problems, "validation", c.get("validation"), VALIDATION_KEYS)
    unknown_keys(problems, "model", c.get("model"), MODEL_KEYS)
    val = c.get("validation") or {}
    if val.get("monitor") not in MONITORS:
        problems.append(
            f"validation.monitor ({val.get('monitor')!r}) must be one of {list(MONITORS)}."
        )
    _check_batch(problems, c, world_size)
    _check_ranges(problems, c)
    _check_sampling(problems, c)
    _check_precision(problems, c)
    check_learning(problems, c)
    check_data_size(problems, c)
    return problems, read


def _raise_problems(problems: list[str], note: str = "") -> None:
    if problems:
        raise ConfigError(
            f"{len(problems)} problem(s) in the config{note}:\n"
            + "\n".join(f"- {p}" for p in problems)
        )


def validate_train_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Raise ``ConfigError`` listing every problem of a training config."""
    c = OmegaConf.to_container(cfg, resolve=False)
    # what the early checks read (their keys) is not read again: only the values
    problems, read = _early_checks(c, world_size)
    check_sampler(problems, "sampler", c.get("sampler"), read="sampler" in read)
    check_component(problems, "reward", c.get("reward"), REWARDS, read="reward" in read)
    val = c.get("validation") or {}
    if val.get("sampler") is not None:
        read_val = "validation.sampler" in read
        check_sampler(problems, "validation.sampler", val["sampler"], read=read_val)
    if "metrics" not in read:
        check_metrics(problems, "metrics", c.get("metrics"))
    _check_module(problems, c.get("module") or {}, read)
    _check_target(problems, "trainer", c.get("trainer"), TRAINER_FROM_RUN, read)
    for where, spec in indexed("logger", c.get("logger")):
        _check_target(problems, where, spec, None, read)
    check_models(problems, c.get("model") or {})
    if not problems:  # both models' folders are there: their tokenizers can be read
        check_pair(problems, c)
    b, g = c.get("batch_size"), c.get("group_size")
    prompts = b // g if _int(b) and _int(g) and g > 0 else None
    _check_data(problems, _resolved(cfg, "data", c.get("data")), "data" in read, prompts)
    _raise_problems(problems)


def run_command(main: Callable[[], Any]) -> NoReturn:
    """Run a ``@hydra.main`` command so that a config problem is one message and exit status 2,
    then end the process (``tandem.runs.leave``: within a second of its last line).

    Hydra prints its own errors with a trimmed traceback and exits 1; HYDRA_FULL_ERROR makes it
    raise them instead, so that its composition errors (an override of a key that does not
    exist, an unknown option of a group) end here like the checks of this module do.
    """
    from tandem.runs.leave import leave

    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    code: int | str | None = 0
    try:
        main()
    except CompactHydraException as err:
        code = 2
        print(f"config error: {config_error_message(err)}", file=sys.stderr)
    except SystemExit as done:
        code = done.code
    leave(code)


def exit_config_error(err: Exception) -> NoReturn:
    """Print a config error as one message (problems on the lines below) and exit with 2."""
    print(f"config error: {config_error_message(err)}", file=sys.stderr)
    sys.exit(2)


def config_error_message(err: Exception) -> str:
    """The message of a config error, ours or Hydra's, for one line on the command line.

    Hydra refuses an override of a key that does not exist (``generation.temprature=1``) by
    suggesting ``+``, which would only add the typo; here it gets a did-you-mean instead.
    """
    cause = err.__cause__
    parent = getattr(cause, "parent_node", None)
    key, full = getattr(cause, "key", None), getattr(cause, "full_key", None)
    if isinstance(err, ConfigError) or parent is None or not key or not full:
        return str(err).split("\nConfig search path:")[0].strip()
    where = full[: -len(str(key))].rstrip(".")
    known = [str(k) for k in parent]
    hint = did_you_mean(where, str(key), known)
    return (
        f"{full} is not a key of {where or 'the top level'}: fix its spelling, or add a new key "
        f"with +{full}=...{hint} Known keys: {sorted(known)}."
    )


def check_component(
    problems: list[str],
    key: str,
    spec: Any,
    registry: Registry,
    skip: tuple[str, ...] = (),
    read: bool = False,
) -> None:
    """Append to ``problems`` what is wrong with the component config ``spec`` at ``key``.

    Checks the registry name, the arguments against the constructor (``skip``: arguments the
    code passes itself, such as the tokenizer) and a probability ``p`` if there is one;
    ``read``: the early checks did all this already (``tandem.config_keys``).
    """
    if read:
        return
    cls = _registered(problems, key, spec, registry)
    if cls is None:
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


def _registered(problems: list[str], key: str, spec: Any, registry: Registry) -> Any:
    """The class ``spec["name"]`` names in ``registry``, or None with the problem appended."""
    if not isinstance(spec, dict) or "name" not in spec:
        problems.append(f"{key} must be a mapping with a `name` naming a {registry.family}.")
        return None
    try:
        return registry.get(spec["name"])
    except RegistryError as err:
        problems.append(f"{key}.name: {err}")
        return None


def check_sampler(problems: list[str], key: str, spec: Any, read: bool = False) -> None:
    """``check_component`` for a sampler, then its own checks of its values (a rule or a
    boundary it does not know), by building it on a one-token stand-in vocabulary."""
    from tandem.samplers.boundaries import tables_from_surfaces

    before = len(problems)
    check_component(problems, key, spec, SAMPLERS, skip=("tokenizer",), read=read)
    if len(problems) > before or any(p.startswith((f"{key}:", f"{key}.")) for p in problems):
        return  # its name or keys are wrong already: building it would only say so again
    args = {k: v for k, v in spec.items() if k != "name"}
    try:
        SAMPLERS.build(spec["name"], tokenizer=tables_from_surfaces([b" "]), **args)
    except (TypeError, ValueError) as err:
        problems.append(f"{key}: {err}")


def check_metrics(problems: list[str], key: str, spec: Any) -> None:
    """``spec``: ``{log key: METRICS name}``, each a metric that a batch of rollouts can feed."""
    from tandem.metrics.base import ROLLOUT_INPUTS

    if not isinstance(spec, dict):
        problems.append(f"{key} must be a mapping of log keys to metric names, e.g. {{n: name}}.")
        return
    for name, metric in spec.items():
        try:
            cls = METRICS.get(metric)
        except RegistryError as err:
            problems.append(f"{key}.{name}: {err}")
            continue
        params = inspect.signature(cls.update).parameters.values()
        needs = [p.name for p in params if p.default is p.empty and p.name != "self"]
        if missing := sorted(set(needs) - set(ROLLOUT_INPUTS)):
            problems.append(
                f"{key}.{name} ({metric!r}) reads {missing}, which rollouts do not give: a metric "
                f"listed here may read {list(ROLLOUT_INPUTS)}. Remove it from {key}."
            )


@functools.cache
def _top_level_keys() -> frozenset[str]:
    """The keys ``conf/train.yaml`` declares, its config groups, and ``hydra``."""
    spec = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"), resolve=False)
    groups = {
        str(next(iter(d))).split("/")[0] for d in spec.get("defaults", []) if isinstance(d, dict)
    }
    return frozenset(set(spec) - {"defaults"} | groups | {"hydra"})


def _arguments(fn: Callable[..., Any]) -> list[str]:
    return [n for n in inspect.signature(fn).parameters if n != "self"]


def _lookup(c: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = c
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _check_ranges(problems: list[str], c: dict) -> None:
    for key, (ok, rule) in RANGES.items():
        present, value = _lookup(c, key)
        if not present or (isinstance(value, str) and value.startswith("${")):
            continue  # absent: the constructor's default; an interpolation: checked resolved
        if not ok(value):
            problems.append(f"{key} ({value!r}) must be {rule}. Set {key} to such a value.")


def sampling_params() -> Any:
    """``tandem.engine.params.SamplingParams``, without importing the ``tandem.engine`` package
    (whose ``__init__`` imports torch): the module, which imports nothing heavy, is loaded from
    its file under its own name, so that the engine's own import of it later finds this one."""
    name = "tandem.engine.params"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).parent / "engine" / "params.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].SamplingParams


# the keys that become SamplingParams fields, besides generation's own: key -> field
SAMPLING_FROM_RUN = {
    "validation.temperature": "temperature",
    "validation.top_p": "top_p",
    "module.logprob_temperature": "logprob_temperature",
}
# what null means for a key that becomes a SamplingParams field: a value of the run's own, so
# null is always taken (validation.top_p's, which SamplingParams would not take as None, is the
# rollouts' value by then)
NULL_MEANS = {
    "validation.top_p": "the rollouts' generation.top_p",
    "module.logprob_temperature": "the rollouts' generation.temperature",
}


def _check_sampling(problems: list[str], c: dict) -> None:
    """The values that become ``SamplingParams``, by its own rules; and training's one rule
    more: it samples (a greedy rollout would be each group's every rollout)."""
    params = sampling_params()
    generation = c.get("generation") if isinstance(c.get("generation"), dict) else {}
    keys = {f"generation.{k}": k for k in generation if k not in GENERATION_FROM_RUN}
    for key, field in {**keys, **SAMPLING_FROM_RUN}.items():
        present, value = _lookup(c, key)
        if not present or (isinstance(value, str) and value.startswith("${")):
            continue  # absent: the default; an interpolation: checked resolved
        if value is None and key in NULL_MEANS:
            continue
        for problem in params.problems({field: value}, prefix=key[: -len(field)], none="null"):
            meaning = f" (null: {NULL_MEANS[key]})" if key in NULL_MEANS else ""
            problems.append(f"{problem}{meaning}. Set {key} to such a value.")
    t = generation.get("temperature")
    if t == 0 and not isinstance(t, bool):
        problems.append(
            "generation.temperature (0) is greedy: every rollout of a prompt would be the same, "
            "so each group's advantages would be 0 and GRPO would learn nothing. Set "
            "generation.temperature > 0 (the paper's 1.0); greedy is for evaluation."
        )


def _check_batch(problems: list[str], c: dict, world_size: int) -> None:
    b, g = c.get("batch_size"), c.get("group_size")
    if not (_int(g) and g >= 2):
        problems.append(
            f"group_size ({g!r}) must be an integer >= 2: GRPO scores each rollout against the "
            "others of its prompt's group, so a group of one has advantage 0 and nothing is "
            "learned. Set group_size=8 (the paper's)."
        )
    if not (_int(b) and b >= 1):
        problems.append(f"batch_size ({b!r}) must be a positive integer: rollouts per step.")
    if _int(b) and _int(g) and b >= 1 and g >= 1:
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


def _check_precision(problems: list[str], c: dict) -> None:
    """The senior trains on float32 master weights: a lower ``model.dtype`` is what the
    trainer computes in, so some trainer setting must compute in it, and none may train the
    weights themselves in it."""
    dtype = (c.get("model") or {}).get("dtype", "float32")
    trainer = c.get("trainer") or {}
    precision = str(trainer.get("precision", "32-true"))
    strategy = trainer.get("strategy")
    param_dtype = strategy.get("param_dtype") if isinstance(strategy, dict) else None
    if precision.endswith("-true") and precision not in ("32-true", "64-true"):
        problems.append(
            f"trainer.precision ({precision!r}) casts the senior's weights themselves, so AdamW "
            "would update them with no float32 master copy and most small updates would round "
            "away. Set trainer.precision=bf16-mixed (float32 weights, bfloat16 compute)."
        )
    elif dtype != "float32" and precision in ("32-true", "32", "64-true") and not param_dtype:
        problems.append(
            f"model.dtype ({dtype!r}) asks the senior to compute in {dtype}, but "
            f"trainer.precision ({precision!r}) computes in float32 and no "
            "trainer.strategy.param_dtype is set. The senior's weights are float32 either way. "
            "Set trainer.precision=bf16-mixed (one device), trainer.strategy.param_dtype="
            f"{dtype} (trainer=fsdp), or model.dtype=float32."
        )


def _check_module(problems: list[str], m: dict, read: set[str] = frozenset()) -> None:
    from tandem.modules.loss import ADVANTAGE_MODES, OLD_LOGPROB_SOURCES, LossConfig

    _check_target(problems, "module", m, None, read)
    for key, source in MODULE_FROM_RUN.items():
        if m.get(key) != f"${{{source}}}":
            problems.append(
                f"module.{key} ({m.get(key, '<absent>')!r}) is set by the run itself from "
                f"{source}: set that, and leave module.{key}: ${{{source}}}."
            )
    _check_target(problems, "module.optimizer", m.get("optimizer"), TARGET_FROM_RUN, read)
    if m.get("scheduler") is not None:
        _check_target(problems, "module.scheduler", m["scheduler"], TARGET_FROM_RUN, read)
    if m.get("advantage", "std") not in ADVANTAGE_MODES:
        problems.append(
            f"module.advantage ({m.get('advantage')!r}) must be one of {list(ADVANTAGE_MODES)}."
        )
    if m.get("old_logprobs", "auto") not in OLD_LOGPROB_SOURCES:
        problems.append(
            f"module.old_logprobs ({m.get('old_logprobs')!r}) must be one of "
            f"{list(OLD_LOGPROB_SOURCES)}: where the loss's old log-probs come from."
        )
    known = set(_arguments(LossConfig))
    loss = m.get("loss") if isinstance(m.get("loss"), dict) else {}
    loss = {k: v for k, v in loss.items() if k in known}
    if isinstance(loss.get("constant"), str):  # an interpolation, checked once resolved
        loss.pop("constant")
    try:
        LossConfig(**loss)
    except (TypeError, ValueError) as err:
        problems.append(f"module.loss: {err}")
    backend = m.get("backend")
    if backend is not None:
        skip = ("senior", "junior", "tokenizer")
        read_backend = "module.backend" in read
        check_component(problems, "module.backend", backend, BACKENDS, skip, read_backend)


def _check_target(
    problems: list[str],
    where: str,
    spec: Any,
    set_by: dict[str, str] | None = None,
    read: set[str] = frozenset(),
) -> None:
    """The keys of a ``_target_`` mapping (the module, its optimizer and scheduler, the
    trainer, a logger) against the signature of what it builds, imported; ``set_by``:
    arguments the run passes itself, each with what it passes; ``read``: the mappings the early
    checks read already (``tandem.config_keys``)."""
    if where in read:
        if isinstance(spec, dict) and isinstance(spec.get("strategy"), dict):
            _check_target(problems, f"{where}.strategy", spec["strategy"], None, read)
        return
    if not isinstance(spec, dict) or "_target_" not in spec:
        problems.append(f"{where} must be a mapping with a `_target_` naming a class.")
        return
    try:
        cls = hydra.utils.get_class(spec["_target_"])
    except Exception as err:  # hydra raises several kinds for a path it cannot import
        problems.append(f"{where}._target_ ({spec['_target_']!r}) cannot be imported: {err}")
        return
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = {*_arguments(cls), *HYDRA_KEYS} - set(set_by or {})
    listed = f"the arguments of {spec['_target_']}"
    unknown_keys(problems, where, spec, known, set_by=set_by, listed=listed)
    if isinstance(spec.get("strategy"), dict):  # a strategy built from config (trainer=fsdp)
        _check_target(problems, f"{where}.strategy", spec["strategy"], None, read)


def _resolved(cfg: DictConfig, key: str, fallback: Any) -> Any:
    """``cfg[key]`` with its interpolations (``${datasets_dir}``) resolved, or ``fallback``
    (unresolved) when one cannot be: what is wrong is then reported where it is read."""
    try:
        return OmegaConf.to_container(cfg[key], resolve=True)
    except Exception:  # any resolution failure leaves the raw value
        return fallback


def _check_data(
    problems: list[str], data: Any, read: bool = False, prompts: int | None = None
) -> None:
    """The data source's keys (unless ``read``), values and files; ``prompts``: a step's."""
    from tandem.data.checks import check_hf_source

    if read and any(p.startswith(("data:", "data.")) for p in problems):
        return  # its name or keys are wrong already
    cls = _registered(problems, "data", data, DATASETS)
    if cls is None:
        return
    known = {*_arguments(cls), *DATA_RUN_KEYS, "name"}
    if not read:
        unknown_keys(problems, "data", data, known)
    args = {k: v for k, v in data.items() if k in known and k not in (*DATA_RUN_KEYS, "name")}
    try:
        check_arguments(cls, args, where="data")
    except RegistryError as err:
        if not read:
            problems.append(str(err))
        return
    try:
        cls(**args)  # sources only store and check their arguments here; loading comes later
    except (TypeError, ValueError) as err:
        problems.append(f"data: {err}")
        return
    if data["name"] == "hf":
        before = len(problems)
        check_hf_source(problems, "data", args)
        if len(problems) == before:
            check_hf_rows(problems, args, prompts)
