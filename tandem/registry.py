"""Registries: one per swappable family, mapping a config name to a class.

A class joins its family with a decorator::

    @SAMPLERS.register("word")
    class WordSampler(Sampler): ...

and a Hydra group names it (``conf/sampler/word.yaml`` holds ``name: word`` plus the
constructor arguments). Duplicate names are refused at import time and an unknown name is
answered with the list of known ones, so a typo in a config fails before any model loads.

Discovery is explicit: each registry names the package of its family; the first lookup imports
that package and every module in it (no ``__subclasses__`` scans, no entry points), so a new
member is one new file in the family's folder, with no edit to its ``__init__``. Third-party
members join by importing their module before the lookup.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate name, or arguments that do not fit a constructor."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name -> class for one family of components.

    Args:
        family: the family's name, used in error messages (e.g. ``"sampler"``).
        package: the package whose import registers the family's members; imported at the
            first lookup.
    """

    def __init__(self, family: str, package: str | None = None) -> None:
        self.family = family
        self.package = package
        self._entries: dict[str, type[T]] = {}
        self._loaded = package is None

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            package = importlib.import_module(self.package)
            # every module of a family's folder: a new member needs no import added anywhere
            for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{module.name}")

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator that adds the class under ``name``.

        Raises:
            RegistryError: if ``name`` is already taken by another class.
        """
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.family} names must be non-empty strings, got {name!r}")

        def add(cls: type[T]) -> type[T]:
            if name in self._entries:
                raise RegistryError(
                    f"{self.family} {name!r} is already registered to "
                    f"{_qualname(self._entries[name])}; cannot register {_qualname(cls)} "
                    f"under the same name. Pick another name."
                )
            self._entries[name] = cls
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return add

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``.

        Raises:
            RegistryError: naming the known entries (and the closest one) if ``name`` is unknown.
        """
        self._load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            pass
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RegistryError(
            f"unknown {self.family} {name!r}. Known {self.family}s: {self.names()}.{hint}"
        ) from None

    def build(self, name: str, /, **kwargs: Any) -> T:
        """Instantiate entry ``name`` with ``kwargs``, checked against its signature first.

        All unknown and all missing arguments are reported at once, naming the entry.
        """
        cls = self.get(name)
        check_arguments(cls, kwargs, where=f"{self.family} {name!r}")
        return cls(**kwargs)

    def names(self) -> list[str]:
        """Known names, sorted."""
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()})"


def check_arguments(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str) -> None:
    """Raise one error listing every unknown and every missing keyword argument of ``fn``."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = None
    else:
        accepted = {n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    problems = []
    if accepted is not None:
        for key in sorted(set(kwargs) - accepted):
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown argument {key!r}{hint}")
    for n, p in params.items():
        required = p.default is inspect.Parameter.empty and p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        if required and n not in kwargs and n != "self":
            problems.append(f"missing required argument {n!r}")
    if problems:
        accepted_list = sorted(accepted) if accepted is not None else "any"
        raise RegistryError(
            f"{where}: " + "; ".join(problems) + f". Accepted arguments: {accepted_list}."
        )


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# One registry per family. Members register themselves in their own modules.
SAMPLERS: Registry[Any] = Registry("sampler", "tandem.samplers")
REWARDS: Registry[Any] = Registry("reward", "tandem.rewards")
METRICS: Registry[Any] = Registry("metric", "tandem.metrics")
DATASETS: Registry[Any] = Registry("dataset", "tandem.data.sources")
BACKENDS: Registry[Any] = Registry("backend", "tandem.engine")
