"""Test-wide settings.

Tests share 2 CPU cores with the subprocesses some of them start (reward workers, DDP ranks).
OpenMP threads that spin while waiting turn such sharing into many-fold slowdowns, so threads
wait passively here; this must be set before torch is first imported.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the Hugging Face hub answers, so that paper-scale configs (hub names) validate
    on an offline machine; nothing is downloaded, since validation only asks whether it could."""
    import tandem.hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(tandem.hub, "hub_reachable", lambda: True)
