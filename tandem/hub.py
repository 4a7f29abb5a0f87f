"""Whether a Hugging Face hub name can be loaded on this machine, answered in seconds.

A hub name that is neither in the local cache nor reachable makes ``from_pretrained`` and
``load_dataset`` retry for about a minute and then raise a traceback. The config check asks here
first: a name in the cache is fine; otherwise the hub must answer a quick probe (skipped when
``HF_HUB_OFFLINE`` is set, which means "never ask the network").

What this file leaves out: downloading anything, and local folders (``tandem.modules.models``).
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.utils import get_session

# seconds the probe may take, DNS included (the thread below bounds what socket timeouts do not)
PROBE_TIMEOUT_S = 3.0


def offline_by_choice() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks never to use the network."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return constants.HF_HUB_OFFLINE or value.upper() in ("1", "ON", "YES", "TRUE")


@functools.cache
def hub_reachable() -> bool:
    """True if the hub endpoint answers an HTTP request within ``PROBE_TIMEOUT_S`` seconds."""
    done, answered = threading.Event(), []

    def probe() -> None:
        try:
            # the hub's front page answers 200; a proxy or firewall that intercepts answers 4xx
            response = get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
            answered.append(response.status_code < 400)
        except Exception:  # any failure to get an answer means "not reachable"
            pass
        done.set()

    # a daemon thread: a stuck DNS lookup cannot hold the run, nor its exit
    threading.Thread(target=probe, daemon=True).start()
    done.wait(PROBE_TIMEOUT_S + 0.5)
    return any(answered)


def in_cache(name: str, repo_type: str = "model") -> bool:
    """True if the hub repository ``name`` has been downloaded into the local cache."""
    if repo_type == "model":
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    # what `datasets` keeps of a set it has already prepared
    from datasets import config as datasets_config

    return (Path(datasets_config.HF_DATASETS_CACHE) / name.replace("/", "___")).is_dir()


def hub_problem(name: str, key: str, repo_type: str = "model") -> str | None:
    """Why the hub name ``name`` (the value of ``key``) cannot be loaded here, or None."""
    if in_cache(name, repo_type):
        return None
    if offline_by_choice():
        why = "HF_HUB_OFFLINE is set"
    elif hub_reachable():
        return None
    else:
        why = f"the hub ({constants.ENDPOINT}) cannot be reached from this machine"
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return (
        f"{key} ({name!r}) is not a local folder nor in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and {why}. Point {key} at a local copy, or download it "
        f"first (`hf download {name}{kind}` where there is network, then copy the cache here "
        "and set HF_HUB_OFFLINE=1 so that loading never waits on the network)."
    )
