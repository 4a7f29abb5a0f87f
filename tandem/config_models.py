"""The models of a training config, checked before either loads: their folders and the pair.

A model folder must hold a ``config.json`` transformers can read and a tokenizer; a hub name must
be cached or the hub reachable (``tandem.modules.models.check_model_path``). A junior with a
tokenizer of its own is checked as a pair (``check_pair``) from the two tokenizers alone.

What this file leaves out: the rest of the config (``tandem.config``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.assets import resolve


def check_models(problems: list[str], model: dict) -> None:
    """``model.dtype`` and both models' folders or hub names."""
    from tandem.modules.models import DTYPES, check_model_path

    if model.get("dtype", "float32") not in DTYPES:
        problems.append(
            f"model.dtype ({model.get('dtype')!r}) must be one of {sorted(DTYPES)}: "
            "float32 on CPU, bfloat16 on recent GPUs."
        )
    for key in ("name_or_path", "junior_name_or_path"):
        value = model.get(key)
        required = key == "name_or_path"
        if (required or value is not None) and (msg := check_model_path(value, f"model.{key}")):
            problems.append(msg)
        elif required or value is not None:
            check_model_folder(problems, f"model.{key}", value)


# what a folder's tokenizer is read from (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_folder(problems: list[str], key: str, value: str, tokenizer: bool = True) -> None:
    """A local model folder's ``config.json`` must describe a model transformers can build, and
    the folder must hold a tokenizer (without one, ``AutoTokenizer`` builds a one-token
    tokenizer and the run fails far from the cause; ``tokenizer=False``: the memory plan, which
    reads the config alone). A hub name is left to the hub."""
    import json

    from tandem.modules.models import looks_local

    path = resolve(value)
    if not looks_local(path):
        return
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        problems.append(f"{key} ({value!r}) is not a model folder: {folder} has no config.json.")
        return
    try:
        spec = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as err:
        problems.append(f"{key} ({value!r}): {folder}/config.json is not JSON ({err}). {_FIX}")
        return
    if not isinstance(spec, dict) or not spec.get("model_type"):
        problems.append(f"{key} ({value!r}): {folder}/config.json names no model_type. {_FIX}")
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(folder))
    except Exception as err:  # transformers raises several kinds for a config it cannot read
        why = str(err).strip().splitlines()[-1].strip() if str(err).strip() else type(err).__name__
        problems.append(f"{key} ({value!r}): {folder}/config.json cannot be read: {why}. {_FIX}")
        return
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(
            f"{key} ({value!r}): {folder} holds no tokenizer (none of {list(TOKENIZER_FILES)}). "
            "Copy the tokenizer files of the model it was trained from into it (a checkpoint "
            "of the tiny world: those of tandem/assets/tiny), or save them with "
            "tokenizer.save_pretrained."
        )


_FIX = "Point it at a folder written by save_pretrained (config.json, weights, tokenizer)."


def cross_vocabulary_pair(problems: list[str], pair: dict[str, tuple[Any, str]]) -> bool:
    """Whether the two models of ``pair`` (key -> (its value, the folder or hub name of its
    tokenizer)) have vocabularies of their own; for such a pair, a problem for each tokenizer that
    cannot split before a space. Only the tokenizers load (small files), never the models.

    A tokenizer that does not load is a problem too, and the pair then counts as not crossed.
    """
    from tandem.engine.cross import same_vocabulary, split_problem
    from tandem.modules.models import load_tokenizer

    try:
        tokenizers = {key: load_tokenizer(path) for key, (_, path) in pair.items()}
    except Exception as err:  # a folder or hub name whose tokenizer does not load
        names = " and ".join(repr(value) for value, _ in pair.values())
        problems.append(f"{' and '.join(pair)}: the tokenizers of {names} do not load: {err}")
        return False
    if same_vocabulary(*tokenizers.values()):
        return False
    for key, tok in tokenizers.items():
        if why := split_problem(tok):
            problems.append(
                f"{key} ({pair[key][0]!r}): its tokenizer cannot share words with a partner of "
                f"another vocabulary: {why}. Handing words over as text needs both "
                "pre-tokenizers to split before a space (byte-level BPE with a Qwen, GPT-2 or "
                "Llama 3 pattern does). Pair it with a junior of its own tokenizer instead."
            )
    return True


def check_pair(problems: list[str], c: dict) -> None:
    """A junior with a tokenizer of its own (``tandem.engine.cross``): both tokenizers must
    split before a space, and what needs one shared vocabulary is refused, each naming its key.

    Only the tokenizers load here (small files), never the models.
    """
    from tandem.metrics.per_byte import cross_vocabulary_problem

    model = c.get("model") or {}
    senior, junior = model.get("name_or_path"), model.get("junior_name_or_path")
    if junior is None or resolve(junior) == resolve(senior):
        return
    pair = {"model.name_or_path": (senior, senior), "model.junior_name_or_path": (junior, junior)}
    if not cross_vocabulary_pair(problems, pair):
        return
    cross = "model.junior_name_or_path has a tokenizer of its own (a cross-vocabulary pair)"
    # every sampler writes across vocabularies (the junior steps it over its own tables)
    m = c.get("module") or {}
    kl = (m.get("loss") or {}).get("kl_beta", 0.0)
    if isinstance(kl, int | float) and kl > 0:
        problems.append(
            f"module.loss.kl_beta ({kl}): {cross}, so there is no junior log-prob of the "
            "senior's tokens to take a per-token KL toward. Set module.loss.kl_beta=0."
        )
    backend = (m.get("backend") or {}).get("name", "torch")
    if backend != "torch":
        problems.append(
            f"module.backend.name ({backend!r}): {cross}, which only the torch engine serves. "
            "Set module.backend.name=torch."
        )
    for name, metric in (c.get("metrics") or {}).items():
        if msg := cross_vocabulary_problem(f"metrics.{name}", metric):
            problems.append(msg)
    strategy = (c.get("trainer") or {}).get("strategy")
    if isinstance(strategy, dict) and strategy.get("rollout_gather") == "per_layer":
        problems.append(
            f"trainer.strategy.rollout_gather ('per_layer'): {cross}, whose engine does not step "
            "the processes in lockstep as a senior gathered layer by layer needs. Set "
            "trainer.strategy.rollout_gather=whole."
        )
