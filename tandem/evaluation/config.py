"""Checking a composed evaluation config before any model loads or any dataset downloads.

Every problem is collected and reported at once, naming the key, the value, the rule and the fix.
A junior with a tokenizer of its own is checked as a pair from the two tokenizers alone.

What this file leaves out: the training config's checks (``tandem.config``, whose component
check is reused here for the sampler and the reward).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tandem.config import ConfigError, check_component, check_metrics, check_sampler
from tandem.config_models import cross_vocabulary_pair
from tandem.evaluation.models import is_checkpoint, senior_base
from tandem.metrics.per_byte import cross_vocabulary_problem
from tandem.modules.models import check_model_path
from tandem.registry import DATASETS, REWARDS

SAMPLING = {
    "temperature": (lambda v: _number(v) and v >= 0, "a number >= 0 (0: greedy)"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: _int(v) and v >= 0, "an integer >= 0 (0: off)"),
    "max_new_tokens": (lambda v: _int(v) and v > 0, "a positive integer"),
}


def validate_eval_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` listing every problem of an evaluation config."""
    problems = [
        f"{key} is required but missing (???): set it on the command line ({key}=...)."
        for key in OmegaConf.missing_keys(cfg)
    ]
    c = OmegaConf.to_container(cfg, resolve=False)
    check_sampler(problems, "sampler", c.get("sampler"))
    _check_rounds(problems, c)
    check_component(problems, "reward", c.get("reward"), REWARDS)
    check_metrics(problems, "metrics", c.get("metrics"))
    _check_models(problems, c)
    if not problems:
        _check_cross_pair(problems, c)
    for key in ("batch_size", "forcing_batch_size"):
        if not (_int(c.get(key)) and c[key] > 0):
            problems.append(f"{key} ({c.get(key)!r}) must be a positive integer.")
    threads = c.get("threads")
    if threads is not None and not (_int(threads) and threads > 0):
        problems.append(f"threads ({threads!r}) must be a positive integer or null (torch's).")
    if not (c.get("solo") or c.get("handoff")):
        problems.append("solo and handoff are both false: nothing to evaluate. Set one to true.")
    if c.get("drift") and not c.get("solo"):
        problems.append(
            "drift=true needs solo=true: drift and legibility are measured on the senior's "
            "solo outputs. Set solo=true or drift=false."
        )
    sets = _resolved_sets(problems, cfg) if isinstance(c.get("eval"), dict) else c.get("eval")
    if not isinstance(sets, dict) or not sets:
        problems.append("eval names no eval set: choose some, e.g. eval=[tiny] or eval=[aime24].")
    else:
        for name, spec in sets.items():
            _check_set(problems, f"eval.{name}", spec)
    if problems:
        raise ConfigError(
            f"{len(problems)} problem(s) in the config:\n" + "\n".join(f"- {p}" for p in problems)
        )


def _resolved_sets(problems: list[str], cfg: DictConfig) -> dict[str, Any]:
    """The eval sets with their interpolations resolved (``n: ${paper_solo.n}``, say)."""
    try:
        return OmegaConf.to_container(cfg.eval, resolve=True)
    except Exception as err:  # an interpolation naming no key: say which
        problems.append(
            f"eval: an eval set's interpolation cannot be resolved ({err}). Choose the group it "
            "reads, e.g. paper_solo=figure, or set the key to a value."
        )
        return {}


def handoff_sampler(c: dict[str, Any]) -> dict[str, Any]:
    """The handoff pass's sampler spec: ``handoff_rounds`` rounds of the authors (a senior turn
    then a junior turn) become the step sampler's ``max_rounds`` steps, twice as many."""
    spec = dict(c["sampler"])
    rounds = c.get("handoff_rounds")
    if rounds is not None:
        spec["max_rounds"] = 2 * int(rounds)
    return spec


def _check_rounds(problems: list[str], c: dict[str, Any]) -> None:
    rounds = c.get("handoff_rounds")
    if rounds is None:
        return
    sampler = c.get("sampler") if isinstance(c.get("sampler"), dict) else {}
    if not (_int(rounds) and rounds > 0):
        problems.append(
            f"handoff_rounds ({rounds!r}) must be a positive integer (the authors cap 150) or "
            "null for the sampler's own max_rounds."
        )
    elif sampler.get("name") != "step" or not sampler.get("alternate", True):
        problems.append(
            f"handoff_rounds ({rounds}) counts rounds of a senior turn then a junior turn, which "
            f"only the step sampler with alternate: true has (sampler.name is "
            f"{sampler.get('name')!r}). Set sampler=step, or handoff_rounds=null."
        )
    elif sampler.get("max_rounds") is not None:
        problems.append(
            f"handoff_rounds ({rounds}) and sampler.max_rounds ({sampler['max_rounds']}) both cap "
            f"the handoff pass: set one. sampler.max_rounds=null lets handoff_rounds set it to "
            f"{2 * rounds} steps."
        )


def _check_models(problems: list[str], c: dict[str, Any]) -> None:
    for key in ("senior", "junior"):
        value = c.get(key)
        if value is None and key == "junior":
            continue
        if not isinstance(value, str) or not value or value == "???":
            continue  # a missing value is reported above
        if is_checkpoint(value):
            if not Path(value).expanduser().exists():
                problems.append(f"{key} ({value!r}) is not a checkpoint that exists.")
        elif msg := check_model_path(value, key):
            problems.append(msg)


def _check_cross_pair(problems: list[str], c: dict[str, Any]) -> None:
    """A junior with a tokenizer of its own: both tokenizers must split before a space (any
    sampler then writes across them), and the metrics must be ones that read across them."""
    junior, senior = c.get("junior"), c.get("senior")
    if not isinstance(junior, str) or not isinstance(senior, str):
        return
    try:
        base = senior_base(senior) if is_checkpoint(senior) else senior
    except Exception as err:  # a checkpoint whose base cannot be read
        problems.append(f"senior ({senior!r}): the model it was trained from cannot be read: {err}")
        return
    if not cross_vocabulary_pair(problems, {"senior": (senior, base), "junior": (junior, junior)}):
        return
    for key, metric in (c.get("metrics") or {}).items():
        if msg := cross_vocabulary_problem(f"metrics.{key}", metric):
            problems.append(msg)


def _check_set(problems: list[str], key: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        problems.append(f"{key} must be a mapping (source, split, n, ks, sampling parameters).")
        return
    check_component(problems, f"{key}.source", spec.get("source"), DATASETS)
    ks = spec.get("ks", [1])
    _check_samples(problems, key, ("n", spec.get("n", 1)), ("ks", ks))
    if spec.get("handoff_n") is not None:
        handoff_ks = ("handoff_ks", spec.get("handoff_ks") or ks)
        _check_samples(problems, key, ("handoff_n", spec["handoff_n"]), handoff_ks)
    limit = spec.get("limit")
    if limit is not None and not (_int(limit) and limit > 0):
        problems.append(f"{key}.limit ({limit!r}) must be a positive integer or null (all).")
    for name, (ok, rule) in SAMPLING.items():
        if name in spec and not ok(spec[name]):
            problems.append(f"{key}.{name} ({spec[name]!r}) must be {rule}.")
    limit = spec.get("context_limit")
    if limit is not None and not (_int(limit) and limit > 8):
        problems.append(f"{key}.context_limit ({limit!r}) must be an integer > 8, or null.")
    known = {"source", "split", "limit", "n", "ks", "instruction", "separator", "context_limit"}
    unknown = set(spec) - {*known, "handoff_n", "handoff_ks", *SAMPLING}
    if unknown:
        problems.append(f"{key} has unknown keys {sorted(unknown)}.")


def _check_samples(problems: list[str], key: str, n: tuple[str, Any], ks: tuple[str, Any]) -> None:
    """``(name, value)`` of a pass's samples per problem and of its pass@k ``ks``."""
    (n_key, n_value), (ks_key, ks_value) = n, ks
    if not (_int(n_value) and n_value > 0):
        problems.append(
            f"{key}.{n_key} ({n_value!r}) must be a positive integer: samples per problem."
        )
    elif not (
        isinstance(ks_value, list)
        and ks_value
        and all(_int(k) and 1 <= k <= n_value for k in ks_value)
    ):
        problems.append(
            f"{key}.{ks_key} ({ks_value!r}) must be a non-empty list of integers in "
            f"[1, {n_key}={n_value}]: pass@k needs at least k samples per problem. Raise "
            f"{key}.{n_key} or drop the larger k."
        )


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
