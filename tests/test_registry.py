"""The registry: decorator registration, duplicates refused, unknown names listed."""

from __future__ import annotations

import pytest

from tandem.registry import Registry, RegistryError


@pytest.fixture
def animals() -> Registry:
    reg: Registry = Registry("animal")

    @reg.register("cat")
    class Cat:
        def __init__(self, lives: int, name: str = "tom") -> None:
            self.lives, self.name = lives, name

    @reg.register("dog")
    class Dog:
        pass

    return reg


def test_register_and_get(animals: Registry) -> None:
    cat = animals.get("cat")
    assert cat.__name__ == "Cat"
    assert cat.registry_name == "cat"
    assert animals.names() == ["cat", "dog"]
    assert "dog" in animals and "cow" not in animals
    assert len(animals) == 2
    assert list(animals) == ["cat", "dog"]


def test_duplicate_name_is_refused(animals: Registry) -> None:
    with pytest.raises(RegistryError, match=r"animal 'cat' is already registered to .*Cat"):

        @animals.register("cat")
        class OtherCat:
            pass

    # the original entry survives the refused registration
    assert animals.get("cat").__name__ == "Cat"


def test_unknown_name_lists_known_ones(animals: Registry) -> None:
    with pytest.raises(RegistryError) as err:
        animals.get("cta")
    message = str(err.value)
    assert "unknown animal 'cta'" in message
    assert "['cat', 'dog']" in message
    assert "Did you mean 'cat'?" in message


def test_empty_name_is_refused(animals: Registry) -> None:
    with pytest.raises(RegistryError, match="non-empty"):
        animals.register("")


def test_build_checks_every_argument_at_once(animals: Registry) -> None:
    cat = animals.build("cat", lives=9, name="felix")
    assert (cat.lives, cat.name) == (9, "felix")
    with pytest.raises(RegistryError) as err:
        animals.build("cat", live=9, colour="black")
    message = str(err.value)
    assert "animal 'cat'" in message
    assert "unknown argument 'live' (did you mean 'lives'?)" in message
    assert "unknown argument 'colour'" in message
    assert "missing required argument 'lives'" in message


def test_registries_are_separate() -> None:
    from tandem.registry import REWARDS, SAMPLERS

    assert SAMPLERS is not REWARDS
    assert SAMPLERS.family == "sampler"


def test_families_load_their_members_on_first_lookup() -> None:
    from tandem.registry import DATASETS, REWARDS

    assert "boxed_math" in REWARDS.names()
    assert DATASETS.get("arithmetic").__name__ == "ArithmeticSource"
