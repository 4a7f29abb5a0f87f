"""``python -m tandem.rewards FILE``: bad lines are named by their true line number, and cost the
other lines nothing; a file that cannot be read is one line and exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.rewards.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def good(answer: str, gold: str) -> bytes:
    return json.dumps({"response": f"so $\\boxed{{{answer}}}$", "gold": gold}).encode()


def test_every_kind_of_bad_line_is_named_and_the_rest_is_scored(tmp_path, capsys):
    lines = [
        good("1", "1"),  # 1
        b"",  # 2: blank lines count as lines, and are not bad
        b'{"response": "\\\\boxed{2}", "gold": ',  # 3: cut off
        good("3", "4"),  # 4: wrong, still scored
        b"[1, 2]",  # 5: not an object
        b'{"response": "\\\\boxed{5}"}',  # 6: no gold
        b'{"response": "\\\\boxed{6}", "gold": "6\xff"}',  # 7: not UTF-8
        # 8: a raw U+2028 inside a string; splitlines() would see two lines here
        json.dumps({"response": "a\u2028b \\boxed{8}", "gold": "8"}, ensure_ascii=False).encode(),
        b'{"response": null, "gold": "9"}',  # 9: response not a string
        b"not json at all",  # 10
        good(r"\frac12", "0.5"),  # 11
    ]
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert main([str(path), "--workers", "1", "--show", "wrong"]) == 1
    out, err = capsys.readouterr()
    bad = {int(line.split(":")[-2]) for line in err.splitlines() if line.startswith(str(path))}
    assert bad == {3, 5, 6, 7, 9, 10}, err
    assert f"{path}:7: byte 0xff" in err
    assert f"{path}:6: missing key(s) ['gold']" in err
    assert "items: 4" in out and "bad lines: 6" in out and "accuracy: 0.7500" in out
    assert "correct: 3" in out.splitlines() and "wrong: 1" in out.splitlines()
    assert "line 4: gold='4'" in out  # --show names the file's line, not the item's index


def test_a_clean_file_exits_zero_and_a_numeric_gold_is_fine(tmp_path, capsys):
    path = tmp_path / "items.jsonl"
    path.write_bytes(good("7", "7") + b"\n" + b'{"response": "\\\\boxed{2.5}", "gold": 2.5}')
    assert main([str(path), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "items: 2" in out and "bad lines: 0" in out and "accuracy: 1.0000" in out


@pytest.mark.parametrize("name", ["missing.jsonl", "."])
def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path, name):
    target = tmp_path / name if name != "." else tmp_path  # a missing file, then a directory
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.rewards", str(target)], capture_output=True, text=True,
        timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: cannot read {target}")


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_a_file_with_no_item_is_a_usage_error_not_an_accuracy(tmp_path, capsys, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    assert main([str(path), "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "accuracy" not in err
    assert err.strip() == f"error: {path} holds no items (no non-blank line)"
