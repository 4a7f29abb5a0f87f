"""Side-by-side sweep jobs share an Aim repository that exists before they start."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from tandem.sweeps import InitAimRepo, aim_repos

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_the_study_creates_its_aim_repository_before_its_jobs(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("reproduce", overrides=[f"logger.0.repo={tmp_path / 'aim'}"])
    assert [Path(r) for r in aim_repos(cfg)] == [tmp_path / "aim"]
    InitAimRepo().on_multirun_start(cfg)
    assert (tmp_path / "aim" / ".aim").is_dir()
    InitAimRepo().on_multirun_start(cfg)  # a resumed sweep: the repository is kept


def test_csv_only_sweeps_need_no_repository() -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        assert aim_repos(compose("reproduce", overrides=["logger=csv"])) == []


JOB = """
import signal, sys, time
import signal
import subprocess
import sys
import time
from pathlib import Path
from filelock import FileLock
run = Path(sys.argv[1])
run.mkdir()
lock = FileLock(str(run / "run.lock"))
lock.acquire()
def stop(signum, frame):
    time.sleep(1.0)  # the step, then the checkpoint
    (run / "stopped").write_text("after its checkpoint")
    lock.release()
    time.sleep(60)  # an idle worker, waiting for its next job
signal.signal(signal.SIGTERM, stop)
(run / "ready").write_text("")
time.sleep(60)
"""

SWEEP = """
import subprocess, sys, time
from omegaconf import OmegaConf
from tandem.sweeps import ForwardStop
config = OmegaConf.create({"hydra": {"sweep": {"dir": sys.argv[1]}}})
ForwardStop(wait_s=30).on_multirun_start(config)
jobs = [
    subprocess.Popen([sys.executable, "-c", sys.argv[2], f"{sys.argv[1]}/job{i}"])
    for i in range(2)
]
time.sleep(60)
"""


def test_a_stopped_sweep_stops_its_jobs_after_their_checkpoint(tmp_path: Path) -> None:
    sweep = subprocess.Popen(
        [sys.executable, "-c", SWEEP, str(tmp_path), JOB], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"job{i}" / "ready").exists() for i in range(2)):
        assert time.monotonic() < deadline, "the jobs did not start"
        time.sleep(0.1)
    start = time.monotonic()
    sweep.send_signal(signal.SIGTERM)  # as `kill <pid>` does: the parent alone
    _, err = sweep.communicate(timeout=30)
    assert sweep.returncode == 143
    assert "stops after its next checkpoint" in err and "Traceback" not in err
    # both runs finished their step and let go of their folders before the sweep exited, and
    # their idle workers did not keep it waiting
    assert all((tmp_path / f"job{i}" / "stopped").exists() for i in range(2))
    assert 1.0 <= time.monotonic() - start < 20
