"""A test-only hook that kills a training run at a named point, to prove a kill there is safe.

``TANDEM_FAULT=<point>@<step>`` makes the process SIGKILL itself when it reaches ``<point>`` with
the optimizer step counter at ``<step>``. The points:

- ``update``: inside a training step, after an optimizer step and before the step's checkpoint;
- ``checkpoint``: a checkpoint written to its temporary file, not yet renamed into place;
- ``export``: the senior's weights written to the temporary export folder, not yet renamed.

Unset (always, outside tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import os
import signal


def fault_point(point: str, step: int) -> None:
    """SIGKILL this process if ``TANDEM_FAULT`` names this point and step."""
    if os.environ.get("TANDEM_FAULT") == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
