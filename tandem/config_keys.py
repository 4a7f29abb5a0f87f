"""The keys of every object a training config builds, checked before any model library loads.

Each component's keys (``+`` keys included) are checked against its constructor's arguments as
``tandem.signatures`` reads them from the source or its table, so that a typo anywhere is
refused in a second: a registry member's arguments (the samplers, the reward, the data source,
the backend) and its name, a ``_target_``'s arguments (the module, its optimizer and scheduler,
the trainer and its strategy, the loggers), ``generation`` against ``SamplingParams``,
``module.loss`` against ``LossConfig``, and what each metric's ``update`` reads. A registry
name is looked up among the members the family's files register, as the registry's own first
lookup imports them. What cannot be read without an import (a class of another package outside
the table) is left to ``tandem.config.validate_train_config``, which reads it once imported.

What this file leaves out: the values (``tandem.config``: ranges here, the rest once the classes
are imported).
"""

from __future__ import annotations

import difflib
from typing import Any

from tandem.registry import BACKENDS, DATASETS, METRICS, REWARDS, SAMPLERS, Registry
from tandem.signatures import method_arguments, registered, signature

# the module's, the optimizer's, the scheduler's and the trainer's arguments the run passes itself
TARGET_FROM_RUN = {
    "params": "the senior's parameters",
    "optimizer": "the module's optimizer",
}
TRAINER_FROM_RUN = {
    "callbacks": "the run's own callbacks",
    "logger": "logger",
    "default_root_dir": "output_dir",
    "val_check_interval": "validation.every_n_steps",
    "check_val_every_n_epoch": "validation.every_n_steps",
    # the module optimises by hand (several optimizer steps per batch of rollouts)
    "gradient_clip_val": "module.max_grad_norm",
    "accumulate_grad_batches": "module.mini_batches",
}
# SamplingParams arguments that the module sets per rollout -> the key that decides them
GENERATION_FROM_RUN = {
    "seed": "seed (with the batch and the pass)",
    "samples_per_prompt": "group_size",
    "logprob_temperature": "module.logprob_temperature",
}
# Hydra's own keys of a `_target_` mapping
HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
# keys of the data group that are the run's, not the source's
DATA_RUN_KEYS = ("max_prompt_tokens",)
# what a metric's update may read of a batch of rollouts (tandem.metrics.base.ROLLOUT_INPUTS,
# which tests/test_config_keys.py compares with this)
ROLLOUT_INPUTS = ("authors", "rewards", "stop_reasons")
# top-level words a user may reach for, and the key that means them
ALIASES = {
    "junior": "model.junior_name_or_path",
    "junior_name_or_path": "model.junior_name_or_path",
    "senior": "model.name_or_path",
    "model_name_or_path": "model.name_or_path",
    "name_or_path": "model.name_or_path",
    "lr": "module.optimizer.lr",
    "learning_rate": "module.optimizer.lr",
    "steps": "trainer.max_steps",
    "max_steps": "trainer.max_steps",
    "devices": "trainer.devices",
    "temperature": "generation.temperature",
    "max_new_tokens": "generation.max_new_tokens",
    "p": "sampler.p",
}
VARIABLES = {
    id(r): name
    for name, r in {
        "SAMPLERS": SAMPLERS,
        "REWARDS": REWARDS,
        "METRICS": METRICS,
        "DATASETS": DATASETS,
        "BACKENDS": BACKENDS,
    }.items()
}


def key_problems(c: dict) -> tuple[list[str], set[str]]:
    """Every key problem of the components of the config ``c`` (unresolved) that can be found
    without imports, and the keys of the components whose arguments were read (the others are
    for ``validate_train_config``)."""
    problems: list[str] = []
    read: set[str] = set()
    m = c.get("module") if isinstance(c.get("module"), dict) else {}
    val = c.get("validation") if isinstance(c.get("validation"), dict) else {}
    components = [("sampler", c.get("sampler"), SAMPLERS, ("tokenizer",))]
    if val.get("sampler") is not None:
        components.append(("validation.sampler", val["sampler"], SAMPLERS, ("tokenizer",)))
    components.append(("reward", c.get("reward"), REWARDS, ()))
    if m.get("backend") is not None:
        components.append(
            ("module.backend", m["backend"], BACKENDS, ("senior", "junior", "tokenizer"))
        )
    for key, spec, family, skip in components:
        if member_keys(problems, key, spec, family, skip):
            read.add(key)
    if data_keys(problems, c.get("data")):
        read.add("data")
    targets = [("module", m, None), ("module.optimizer", m.get("optimizer"), TARGET_FROM_RUN)]
    if m.get("scheduler") is not None:
        targets.append(("module.scheduler", m["scheduler"], TARGET_FROM_RUN))
    trainer = c.get("trainer")
    targets.append(("trainer", trainer, TRAINER_FROM_RUN))
    if isinstance(trainer, dict) and isinstance(trainer.get("strategy"), dict):
        targets.append(("trainer.strategy", trainer["strategy"], None))
    targets += [(where, spec, None) for where, spec in indexed("logger", c.get("logger"))]
    for where, spec, set_by in targets:
        if target_keys(problems, where, spec, set_by):
            read.add(where)
    if metric_keys(problems, "metrics", c.get("metrics")):
        read.add("metrics")
    generation = signature("tandem.engine.params.SamplingParams")
    known = set(generation.arguments) - set(GENERATION_FROM_RUN)
    listed = "the arguments of tandem.engine.SamplingParams"
    unknown_keys(problems, "generation", c.get("generation"), known, GENERATION_FROM_RUN, listed)
    loss = signature("tandem.modules.loss.LossConfig")
    unknown_keys(problems, "module.loss", m.get("loss"), loss.arguments)
    return problems, read


def member(
    problems: list[str], key: str, spec: Any, family: Registry, label: str | None = None
) -> str | None:
    """The class (dotted) that ``spec["name"]`` names among ``family``'s members, or None with
    the problem appended (``label``: the key it names, ``<key>.name`` by default)."""
    if not isinstance(spec, dict) or "name" not in spec:
        problems.append(f"{key} must be a mapping with a `name` naming a {family.family}.")
        return None
    members = registered(family.package, VARIABLES[id(family)])
    name = spec["name"]
    if isinstance(name, str) and name in members:
        return members[name]
    close = difflib.get_close_matches(str(name), list(members), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    problems.append(
        f"{label or key + '.name'}: unknown {family.family} {name!r}. Known {family.family}s: "
        f"{sorted(members)}.{hint}"
    )
    return None


def member_keys(
    problems: list[str], key: str, spec: Any, family: Registry, skip: tuple[str, ...] = ()
) -> bool:
    """Check a registry member's name and arguments; whether its arguments could be read."""
    before = len(problems)
    dotted = member(problems, key, spec, family)
    sig = signature(dotted) if dotted else None
    if sig is None:
        return len(problems) > before  # a wrong name or shape is the whole answer
    args = {k: v for k, v in spec.items() if k != "name"}
    problems += sig.problems({**args, **dict.fromkeys(skip)}, key)
    p = args.get("p")
    if p is not None and not (
        isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1
    ):
        problems.append(
            f"{key}.p ({p!r}) must be a probability in [0, 1]: the chance the coin picks the "
            f"senior. Set {key}.p=0.5 for the paper's setting."
        )
    return True


def data_keys(problems: list[str], data: Any) -> bool:
    """The data source's name and keys (its own and the run's); whether they could be read."""
    before = len(problems)
    dotted = member(problems, "data", data, DATASETS)
    sig = signature(dotted) if dotted else None
    if sig is None:
        return len(problems) > before
    known = {*sig.arguments, *DATA_RUN_KEYS, "name"}
    unknown_keys(problems, "data", data, known)
    args = {k: v for k, v in data.items() if k in known and k not in (*DATA_RUN_KEYS, "name")}
    problems += [p for p in sig.problems(args, "data") if "missing required" in p]
    return True


def target_keys(
    problems: list[str], where: str, spec: Any, set_by: dict[str, str] | None = None
) -> bool:
    """The keys of a ``_target_`` mapping against what it builds; whether they could be read.
    ``set_by``: arguments the run passes itself, each with what it passes."""
    if not isinstance(spec, dict) or "_target_" not in spec:
        problems.append(f"{where} must be a mapping with a `_target_` naming a class.")
        return True
    sig = signature(str(spec["_target_"]))
    if sig is None:
        return False
    if not sig.any_keyword:
        known = {*sig.arguments, *HYDRA_KEYS} - set(set_by or {})
        listed = f"the arguments of {spec['_target_']}"
        unknown_keys(problems, where, spec, known, set_by, listed)
    return True


def metric_keys(problems: list[str], key: str, spec: Any) -> bool:
    """``{log key: METRICS name}``, each a metric a batch of rollouts can feed; whether every
    one could be read."""
    if not isinstance(spec, dict):
        problems.append(f"{key} must be a mapping of log keys to metric names, e.g. {{n: name}}.")
        return True
    members = registered(METRICS.package, "METRICS")
    for name, metric in spec.items():
        dotted = member(problems, key, {"name": metric}, METRICS, label=f"{key}.{name}")
        if dotted is None:
            continue
        needs = method_arguments(members[metric], "update")
        if needs is None:
            return False
        if missing := sorted(set(needs) - set(ROLLOUT_INPUTS)):
            problems.append(
                f"{key}.{name} ({metric!r}) reads {missing}, which rollouts do not give: a metric "
                f"listed here may read {list(ROLLOUT_INPUTS)}. Remove it from {key}."
            )
    return True


def indexed(group: str, spec: Any) -> list[tuple[str, Any]]:
    """The entries of a group that may be a list, a mapping of entries or one entry."""
    if isinstance(spec, list):
        return [(f"{group}.{i}", s) for i, s in enumerate(spec)]
    if isinstance(spec, dict) and "_target_" not in spec:
        return [(f"{group}.{k}", s) for k, s in spec.items()]
    return [(group, spec)]


def unknown_keys(
    problems: list[str],
    where: str,
    given: Any,
    known: Any,
    set_by: dict[str, str] | None = None,
    listed: str | None = None,
) -> None:
    """Append a problem for every key of ``given`` (the group at ``where``) not in ``known``.

    ``set_by``: keys the run sets itself, each with the key to set instead. ``listed``: how to
    name the known keys when there are too many to list.
    """
    if not isinstance(given, dict):
        return
    known = sorted(set(known))
    for key in given:
        full = f"{where}.{key}" if where else str(key)
        if key in known:
            continue
        if set_by and key in set_by:
            problems.append(f"{full} is set by the run itself from {set_by[key]}: set that.")
            continue
        problems.append(
            f"{full} is not a key of {where or 'the top level'}: fix its spelling or remove it."
            f"{did_you_mean(where, str(key), known)} Known keys: {listed or known}."
        )


def did_you_mean(where: str, key: str, known: list[str]) -> str:
    """`` Did you mean <key>?`` for a misspelt key of ``where``, or a top-level word's key."""
    if not where and key in ALIASES:
        return f" Did you mean {ALIASES[key]}?"
    close = difflib.get_close_matches(key, known, n=1)
    return f" Did you mean {where + '.' if where else ''}{close[0]}?" if close else ""
