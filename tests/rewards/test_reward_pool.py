"""The reward's worker pool: hard deadlines, recovery, input order, threads, and shutdown.

The stuck item is a 10x10 symbolic determinant: a legitimate-looking answer that the guards let
through and sympy takes minutes to expand, so only the deadline can stop it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tandem.rewards import BoxedMathReward
from tandem.rewards.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
N = 10
STUCK = (
    r"\begin{vmatrix}"
    + r" \\ ".join(" & ".join(f"x_{{{i}{j}}}" for j in range(N)) for i in range(N))
    + r"\end{vmatrix}"
)
TIMEOUT = 1.0


def boxed(answer: str) -> str:
    return f"Thus the answer is $\\boxed{{{answer}}}$."


@pytest.fixture(scope="module")
def reward():
    with BoxedMathReward(timeout=TIMEOUT, workers=2) as r:
        r.score([boxed("x+1")], ["1+x"])  # start the workers outside the timed tests
        yield r


def test_stuck_item_times_out_within_its_deadline_and_the_pool_recovers(reward):
    responses = [boxed(STUCK)] + [boxed(rf"\frac{{{k}}}{{4}}") for k in range(1, 9)]
    golds = ["0"] + [str(k / 4) for k in range(1, 9)]
    pids = set(reward._pool.pids())
    start = time.monotonic()
    verdicts = reward.verify(responses, golds)
    elapsed = time.monotonic() - start
    assert verdicts[0].reason == "timeout" and verdicts[0].score == 0.0
    assert [v.reason for v in verdicts[1:]] == ["correct"] * 8
    assert elapsed < TIMEOUT + 1.0, f"a {TIMEOUT} s deadline took {elapsed:.2f} s"
    # The stuck worker was replaced, the other kept; the next batch is scored normally.
    assert len(pids & set(reward._pool.pids())) == 1
    assert reward.score([boxed(r"\sqrt{8}"), boxed("(1, 2]")], [r"2\sqrt2", "(1,2]"]) == [1, 1]


def test_two_stuck_items_cost_one_deadline_not_two(reward):
    start = time.monotonic()
    verdicts = reward.verify([boxed(STUCK), boxed(STUCK), boxed("x^2")], ["0", "0", "x*x"])
    assert [v.reason for v in verdicts] == ["timeout", "timeout", "correct"]
    assert time.monotonic() - start < 2 * TIMEOUT + 1.0


def test_verdicts_come_back_in_input_order(reward):
    # Even items take the in-process integer path, odd ones the pool; every fifth is wrong.
    responses, golds, expected = [], [], []
    for k in range(40):
        answer = str(k) if k % 2 == 0 else rf"\frac{{{2 * k}}}{{2}}"
        responses.append(boxed(answer))
        golds.append(str(k + 1 if k % 5 == 0 else k))
        expected.append(0.0 if k % 5 == 0 else 1.0)
    assert reward.score(responses, golds) == expected


def test_a_killed_worker_is_replaced(reward):
    os.kill(reward._pool.pids()[0], signal.SIGKILL)
    time.sleep(0.1)
    assert reward.score([boxed(r"\frac{x}{2}"), boxed("0.5x")], ["x/2", "x/2"]) == [1.0, 1.0]


def test_called_from_other_threads_at_once(reward):
    results: dict[int, list[float]] = {}

    def work(k: int) -> None:
        results[k] = reward.score(
            [boxed(rf"{k}\sqrt{{2}}"), boxed("y")], [rf"\sqrt{{{2 * k * k}}}", "z"]
        )

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {k: [1.0, 0.0] for k in range(1, 4)}


def test_pool_starts_and_closes_from_a_non_main_thread():
    out: list[list[float]] = []

    def work() -> None:
        with BoxedMathReward(workers=1) as r:
            out.append(r.score([boxed(r"\frac{1}{3}")], [r"0.\overline{3}"]))

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert out == [[1.0]]


def test_close_stops_the_workers_and_a_later_call_restarts_them():
    r = BoxedMathReward(workers=1)
    assert r.score([boxed("x+x")], ["2x"]) == [1.0]
    pid = r._pool.pids()[0]
    r.close()
    assert not _alive(pid)
    assert r.score([boxed("x+x")], ["2x"]) == [1.0]
    r.close()
    r.close()  # twice is harmless


def test_workers_end_with_the_process_even_when_busy(tmp_path):
    # No ``if __name__ == "__main__"`` guard on purpose: workers must not re-import the script.
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import threading
            from tandem.rewards import BoxedMathReward
            reward = BoxedMathReward(timeout=60.0)
            reward.score([r"\\boxed{{x+1}}"], ["1+x"])
            print(*reward._pool.pids(), flush=True)
            stuck = threading.Thread(
                target=reward.score, args=([{boxed(STUCK)!r}], ["0"]), daemon=True
            )
            stuck.start()
            stuck.join(0.5)  # exit while a worker is busy, without calling close()
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_cli_prints_accuracy_and_reason_counts(tmp_path, capsys):
    rows = [
        {"response": boxed(r"\frac12"), "gold": "0.5"},
        {"response": boxed("3"), "gold": "4"},
        {"response": "no box here", "gold": "1"},
        {"response": boxed("1/"), "gold": "1"},
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main([str(path), "--workers", "1", "--show", "wrong"]) == 0
    out = capsys.readouterr().out
    assert "items: 4" in out and "accuracy: 0.2500" in out
    for line in ("correct: 1", "wrong: 1", "no_box: 1", "unparsable: 1", "timeout: 0"):
        assert line in out.splitlines()
    assert "gold='4'" in out


@pytest.mark.slow
def test_spawn_start_method_works():
    with BoxedMathReward(workers=1, start_method="spawn") as r:
        assert r.score([boxed(r"\sqrt{2}^2")], ["2"]) == [1.0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_killed_while_starting_is_replaced():
    from tandem.rewards.pool import VerifierPool

    pool = VerifierPool(workers=1)
    try:
        pool._workers.append(pool._start())  # a worker that is still importing sympy
        os.kill(pool.pids()[0], signal.SIGKILL)
        (verdict,) = pool.run([(r"\frac{x}{2}", "x/2")])
        assert verdict.score == 1.0
    finally:
        pool.close()


def test_a_worker_is_replaced_inside_a_joblib_worker() -> None:
    """A Hydra sweep's jobs run in joblib (loky) workers, whose default start method is
    ``loky``: a replaced worker must still start there (it died at birth, ending the job)."""
    script = "\n".join(
        [
            "import multiprocessing",
            "import joblib.externals.loky.backend.context",
            "multiprocessing.set_start_method('loky', force=True)",
            "from tandem.rewards import BoxedMathReward",
            "slow = r'\\boxed{\\sum_{k=1}^{100000} \\frac{1}{k^3+k+1}}'",
            "with BoxedMathReward(timeout=0.5, workers=1) as r:",
            "    print(r.score([slow, r'\\boxed{2}', r'\\boxed{3}'], ['1', '2', '3']))",
            "print(multiprocessing.get_start_method())",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # the slow item timed out, its worker was replaced, the others scored; the default stays
    assert done.stdout.split() == ["[0.0,", "1.0,", "1.0]", "loky"]
