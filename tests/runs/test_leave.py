"""``tandem.runs.leave`` ends a command as the interpreter would, less the teardown: it waits for
what the interpreter waits for and no more, so that a sweep's command ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def finish(script: str) -> subprocess.CompletedProcess:
    code = "from tandem.runs.leave import leave\n" + textwrap.dedent(script)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_a_command_ends_after_a_joblib_sweep_whose_workers_are_idle() -> None:
    # Hydra's joblib launcher leaves loky's reusable workers and their manager thread behind;
    # joining the threads alone waited on them for ever (a multirun with n_jobs > 1 never ended)
    done = finish(
        """
        from joblib import Parallel, delayed
        print(Parallel(n_jobs=2, backend="loky")(delayed(abs)(-i) for i in range(3)))
        leave(0)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[0, 1, 2]"


def test_it_waits_for_threads_and_atexit_and_keeps_the_code(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    done = finish(
        f"""
        import atexit, threading, time
        from pathlib import Path
        mark = Path({str(mark)!r})
        atexit.register(lambda: print("atexit", mark.read_text()))
        threading.Thread(target=lambda: (time.sleep(0.5), mark.write_text("thread"))).start()
        leave(3)
        """
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.strip() == "atexit thread"
