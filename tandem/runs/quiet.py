"""What the libraries say that a user need not read, silenced at the commands' start.

A run's console and ``train.log`` carry its own lines (the plan, each step, each validation,
the closing summary) and every warning a user may act on. Left alone, the libraries add: every
Lightning line twice (its own console handler beside the run's), Lightning's notes on what it
found (no GPU, no TPU, an advertisement for another logger, the validation share), Aim's
reporter's INFO lines, Aim's warning that it force-releases the lock of the run this very
process closed a moment before (one live process per run folder, ``tandem.runs.lock``, is what
makes that safe), and two deprecation warnings from inside Aim and Lightning that nobody running
this package can act on; and transformers' progress bars for reading and writing a model's
files, which take a moment here.

What this file leaves out: the run's own lines (``tandem.runs.report``).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# (message pattern, category) of warnings raised inside the libraries, not by a user's code
WARNINGS = (
    (r"pkg_resources is deprecated", UserWarning),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # a resume writes into the folder its earlier start filled, as it should
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
)
# logger -> the least level shown
LEVELS = {
    "lightning.pytorch": logging.WARNING,
    "lightning.fabric": logging.WARNING,
    "aim": logging.WARNING,
    "aim.sdk.lock_manager": logging.ERROR,
}


def quiet_libraries() -> None:
    """Silence the warnings and log lines above (before the libraries load, for warnings
    raised at import; again after, for their loggers' own handlers)."""
    # transformers' and the hub's bars for loading and saving a tiny model's few files
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for pattern, category in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, level in LEVELS.items():
        logging.getLogger(name).setLevel(level)
    # Lightning's package logger prints to the console itself and passes each line on to the
    # run's handlers too: one of the two is enough
    logging.getLogger("lightning").handlers.clear()
    if "transformers" in sys.modules:  # imported already: it read the variable above then
        sys.modules["transformers"].utils.logging.disable_progress_bar()
