"""Test-wide settings.

Tests share 2 CPU cores with the subprocesses some of them start (reward workers, DDP ranks).
OpenMP threads that spin while waiting turn such sharing into many-fold slowdowns, so threads
wait passively here; this must be set before torch is first imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
