"""The signatures ``tandem.signatures`` knows without imports are the ones the code has: the
third-party table against the installed releases, the source reading against ``inspect`` for
every registry member and every class of this package a shipped config builds."""

from __future__ import annotations

import importlib
import inspect

import pytest

from tandem import registry
from tandem.signatures import THIRD_PARTY, Signature, registered, signature

FAMILIES = ("SAMPLERS", "REWARDS", "METRICS", "DATASETS", "BACKENDS")
OWN_TARGETS = (
    "tandem.modules.grpo.TandemGRPO",
    "tandem.modules.sharding.FSDP2Strategy",
    "tandem.sweeps.ForwardStop",
    "tandem.modules.loss.LossConfig",
    "tandem.engine.params.SamplingParams",
)


def load(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def inspected(cls: type) -> tuple[set[str], set[str], bool]:
    params = [p for p in inspect.signature(cls).parameters.values() if p.name != "self"]
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = {p.name for p in named if p.default is p.empty}
    return {p.name for p in named}, required, any(p.kind is p.VAR_KEYWORD for p in params)


def read(sig: Signature | None) -> tuple[set[str], set[str], bool] | None:
    return None if sig is None else (set(sig.arguments), set(sig.required), sig.any_keyword)


@pytest.mark.parametrize("name", sorted(THIRD_PARTY))
def test_the_third_party_table_matches_the_installed_releases(name: str) -> None:
    assert read(THIRD_PARTY[name]) == inspected(load(name))


@pytest.mark.parametrize("family", FAMILIES)
def test_registry_members_and_their_signatures_are_read_from_the_source(family: str) -> None:
    reg = getattr(registry, family)
    found = registered(reg.package, family)
    assert found == {n: f"{reg.get(n).__module__}.{reg.get(n).__qualname__}" for n in reg.names()}
    for name, dotted in found.items():
        assert read(signature(dotted)) == inspected(reg.get(name)), name


@pytest.mark.parametrize("dotted", OWN_TARGETS)
def test_own_classes_are_read_from_the_source(dotted: str) -> None:
    assert read(signature(dotted)) == inspected(load(dotted))


def test_what_cannot_be_read_is_none_not_a_guess() -> None:
    # a base of another package without an __init__ of its own: only an import knows it
    assert signature("tandem.sweeps.InitAimRepo") is None
    assert signature("torch.optim.RAdam") is None
    assert signature("tandem.nowhere.Nothing") is None


def test_problems_are_worded_as_the_registry_words_them() -> None:
    from tandem.registry import RegistryError, check_arguments

    sig = signature("tandem.samplers.word.WordSampler")
    cls = load("tandem.samplers.word.WordSampler")
    given = {"pp": 0.3}
    with pytest.raises(RegistryError) as err:
        check_arguments(cls, {**given, "tokenizer": None}, where="sampler")
    assert sig.problems(given, "sampler", skip=("tokenizer",)) == [str(err.value)]
