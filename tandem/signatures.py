"""Constructor signatures known without importing the code: a config's keys checked in a second.

Reading a class's signature with ``inspect`` imports its module, and with it torch, transformers
or Lightning: seconds, many more on a busy machine, before a typo can be named. Here:

- a class of this package is read from its source file with ``ast`` (the file is the code, so
  what is read cannot drift from it): its ``__init__``'s parameters, or, without an ``__init__``
  of its own, its dataclass fields, or its base's (followed through the module's imports within
  the package);
- a registry's members are found by their ``@<REGISTRY>.register("name")`` decorators in the
  family's files, as ``Registry`` finds them by importing those files;
- a class of another package (the optimizer, the scheduler, the trainer, the loggers) is looked
  up in ``THIRD_PARTY``, a table that ``tests/test_signatures.py`` compares with the real
  signatures, so that a release that changes one fails there, not here.

Anything neither reads (a class outside the table, a member registered from outside the family's
files, a base class of another package) is ``None``: the caller checks it once the imports are
made, as before. This file imports only the standard library.

What this file leaves out: what a config's keys must be (``tandem.config``).
"""

from __future__ import annotations

import ast
import difflib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent  # the tandem package


@dataclass(frozen=True)
class Signature:
    """What a constructor takes by keyword.

    Attributes:
        name: the class, dotted.
        arguments: every argument it takes by keyword.
        required: those without a default.
        any_keyword: it takes ``**kwargs`` (any key is accepted).
    """

    name: str
    arguments: tuple[str, ...]
    required: tuple[str, ...] = ()
    any_keyword: bool = False

    def problems(self, given: Any, where: str, skip: tuple[str, ...] = ()) -> list[str]:
        """What is wrong with the keyword arguments ``given`` (unknown ones, missing required
        ones), worded as ``tandem.registry.check_arguments`` words it; ``skip``: arguments the
        code passes itself."""
        found = []
        keys = [str(k) for k in given] if isinstance(given, dict) else []
        if not self.any_keyword:
            accepted = sorted(self.arguments)
            for key in sorted(set(keys) - set(accepted)):
                close = difflib.get_close_matches(key, accepted, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                found.append(f"unknown argument {key!r}{hint}")
        found += [
            f"missing required argument {n!r}" for n in self.required if n not in [*keys, *skip]
        ]
        if not found:
            return []
        listed = sorted(self.arguments) if not self.any_keyword else "any"
        return [f"{where}: " + "; ".join(found) + f". Accepted arguments: {listed}."]


def _table(name: str, arguments: str, required: str = "") -> Signature:
    return Signature(name, tuple(arguments.split()), tuple(required.split()))


# Third-party classes a config builds, as their installed releases define them (checked by
# tests/test_signatures.py): positional-or-keyword and keyword-only arguments.
THIRD_PARTY = {
    s.name: s
    for s in (
        _table(
            "torch.optim.AdamW",
            "params lr betas eps weight_decay amsgrad maximize foreach capturable "
            "differentiable fused",
            "params",
        ),
        _table(
            "torch.optim.Adam",
            "params lr betas eps weight_decay amsgrad foreach maximize capturable "
            "differentiable fused decoupled_weight_decay",
            "params",
        ),
        _table(
            "torch.optim.SGD",
            "params lr momentum dampening weight_decay nesterov maximize foreach "
            "differentiable fused",
            "params",
        ),
        _table(
            "torch.optim.lr_scheduler.LinearLR",
            "optimizer start_factor end_factor total_iters last_epoch",
            "optimizer",
        ),
        _table(
            "torch.optim.lr_scheduler.ConstantLR",
            "optimizer factor total_iters last_epoch",
            "optimizer",
        ),
        _table(
            "torch.optim.lr_scheduler.CosineAnnealingLR",
            "optimizer T_max eta_min last_epoch",
            "optimizer T_max",
        ),
        _table(
            "lightning.Trainer",
            "accelerator strategy devices num_nodes precision logger callbacks "
            "fast_dev_run max_epochs min_epochs max_steps min_steps max_time "
            "limit_train_batches limit_val_batches limit_test_batches limit_predict_batches "
            "overfit_batches val_check_interval check_val_every_n_epoch num_sanity_val_steps "
            "log_every_n_steps enable_checkpointing enable_progress_bar enable_model_summary "
            "accumulate_grad_batches gradient_clip_val gradient_clip_algorithm deterministic "
            "benchmark inference_mode use_distributed_sampler profiler detect_anomaly "
            "barebones plugins sync_batchnorm reload_dataloaders_every_n_epochs "
            "default_root_dir enable_autolog_hparams model_registry",
        ),
        _table(
            "lightning.pytorch.loggers.CSVLogger",
            "save_dir name version prefix flush_logs_every_n_steps",
            "save_dir",
        ),
        _table(
            "aim.pytorch_lightning.AimLogger",
            "repo experiment train_metric_prefix val_metric_prefix test_metric_prefix "
            "system_tracking_interval log_system_params capture_terminal_logs run_name "
            "run_hash context_prefixes context_postfixes",
        ),
    )
}


def signature(name: str) -> Signature | None:
    """The constructor of the class ``name`` (dotted), or None when it cannot be known without
    importing it."""
    if name in THIRD_PARTY:
        return THIRD_PARTY[name]
    if name.startswith("tandem."):
        module, _, cls = name.rpartition(".")
        return _read_class(module, cls, depth=0)
    return None


def constant(module: str, name: str) -> Any:
    """The value of ``name = <literal>`` at the top of a module of this package (None if it
    has none)."""
    tree = _parse(module)
    for node in tree.body if tree is not None else ():
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def method_arguments(name: str, method: str) -> tuple[str, ...] | None:
    """The required arguments (no default, not ``self``) of ``method`` of the class ``name`` of
    this package, found in it or the bases it inherits from within the package; None when an
    import is needed to know."""
    module, _, cls = name.rpartition(".")
    for _ in range(8):
        tree = _parse(module)
        node = next(
            (
                n
                for n in (tree.body if tree else ())
                if isinstance(n, ast.ClassDef) and n.name == cls
            ),
            None,
        )
        if node is None:
            origin = _imported(tree, module, cls) if tree else None
            if origin is None:
                return None
            module, cls = origin
            continue
        fn = next(
            (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == method), None
        )
        if fn is not None:
            return _from_arguments(name, fn.args).required
        if not node.bases or not isinstance(node.bases[0], ast.Name):
            return None
        module, cls = _imported(tree, module, node.bases[0].id) or (module, node.bases[0].id)
    return None


def registered(package: str, variable: str) -> dict[str, str]:
    """``{registry name: class, dotted}`` of the members that the files of ``package`` (a
    package or a module of this one) register with ``@<variable>.register("name")``."""
    found: dict[str, str] = {}
    for module in _modules(package):
        tree = _parse(module)
        for node in tree.body if tree is not None else ():
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr == "register"
                    and isinstance(deco.func.value, ast.Name)
                    and deco.func.value.id == variable
                    and deco.args
                    and isinstance(deco.args[0], ast.Constant)
                ):
                    found[str(deco.args[0].value)] = f"{module}.{node.name}"
    return found


def _modules(package: str) -> list[str]:
    """The modules a registry imports at its first lookup: the package and every module in its
    folders whose name does not start with ``_`` (or the module itself)."""
    path = _file(package)
    if path is None:
        return []
    if path.name != "__init__.py":
        return [package]
    names = {p.stem for d in _folders(package) for p in d.glob("*.py")}
    return [package, *(f"{package}.{n}" for n in sorted(names) if not n.startswith("_"))]


def _folders(package: str) -> list[Path]:
    """Where a package's modules are: its folder, or, once it is imported, its ``__path__``
    (which a plugin may extend)."""
    loaded = sys.modules.get(package)
    if loaded is not None and hasattr(loaded, "__path__"):
        return [Path(p) for p in loaded.__path__]
    parts = package.split(".")
    return [ROOT.joinpath(*parts[1:])] if parts[0] == "tandem" else []


def _file(module: str) -> Path | None:
    """The source file of a module of this package, found without importing it."""
    parts = module.split(".")
    if parts[0] != "tandem":
        return None
    if len(parts) == 1:
        return ROOT / "__init__.py"
    for folder in _folders(".".join(parts[:-1])):
        for candidate in (folder / f"{parts[-1]}.py", folder / parts[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _parse(module: str) -> ast.Module | None:
    path = _file(module)
    return _parse_file(path, path.stat().st_mtime_ns) if path is not None else None


@functools.cache
def _parse_file(path: Path, mtime: int) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _read_class(module: str, name: str, depth: int) -> Signature | None:
    tree = _parse(module)
    if tree is None or depth > 8:
        return None
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:  # imported into this module from another: follow the import
        origin = _imported(tree, module, name)
        return _read_class(*origin, depth + 1) if origin else None
    dotted = f"{module}.{name}"
    init = next(
        (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is not None:
        return _from_arguments(dotted, init.args)
    if any(_is_dataclass(d) for d in node.decorator_list):
        return _from_fields(dotted, node)
    if not node.bases:
        return Signature(dotted, ())
    base = node.bases[0]
    if isinstance(base, ast.Name):
        origin = _imported(tree, module, base.id) or (module, base.id)
        found = _read_class(*origin, depth + 1)
        return None if found is None else Signature(dotted, *_rest(found))
    return None  # a base of another package (``L.Callback``): only an import knows it


def _rest(sig: Signature) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    return sig.arguments, sig.required, sig.any_keyword


def _imported(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    """``(module, name)`` that ``from X import name`` in ``tree`` brings in, within tandem."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name and node.module.startswith("tandem"):
                    return node.module, alias.name
    return None


def _from_arguments(dotted: str, args: ast.arguments) -> Signature:
    positional = [a.arg for a in args.args]
    names = [n for n in positional if n != "self"] + [a.arg for a in args.kwonlyargs]
    # defaults belong to the last positional arguments
    no_default = positional[: len(positional) - len(args.defaults)]
    required = [n for n in no_default if n != "self"]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return Signature(dotted, tuple(names), tuple(required), args.kwarg is not None)


def _is_dataclass(deco: ast.expr) -> bool:
    target = deco.func if isinstance(deco, ast.Call) else deco
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "dataclass"


def _from_fields(dotted: str, node: ast.ClassDef) -> Signature:
    names, required = [], []
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(item.annotation):
            continue
        names.append(item.target.id)
        if item.value is None:
            required.append(item.target.id)
    return Signature(dotted, tuple(names), tuple(required))
