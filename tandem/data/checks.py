"""Checking a data config's files before anything loads: each problem names the key and the line.

``datasets.load_dataset`` meets a missing file, an empty one or a byte that is not UTF-8 with a
traceback that names neither the config key nor the line. Here every file a data config names is
opened and read once, in binary: text files (JSON, JSONL, CSV, TSV, plain text) must decode as
UTF-8, and each non-blank line of a ``.jsonl`` file must be one JSON value. A hub name is checked
for reachability (``tandem.hub``).

What this file leaves out: what the rows hold (``tandem.data.sources`` reports unusable rows).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

from tandem.hub import hub_problem

TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".txt")
FIX_ENCODING = "Save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`)."


def check_hf_source(problems: list[str], key: str, spec: dict[str, Any]) -> None:
    """Append what is wrong with the files or the hub name of an ``hf`` source at ``key``."""
    path, files = spec.get("path"), spec.get("data_files")
    if not isinstance(path, str) or not path:
        problems.append(f"{key}.path ({path!r}) must name a dataset: a hub name or a builder.")
        return
    root = spec.get("root")
    if isinstance(root, str) and root and files is None:
        folder = Path(root).expanduser() / path
        if not folder.is_dir():
            problems.append(
                f"{key}.root ({root!r}) holds no copy of {path!r}: {folder} is not a folder. "
                f"Download it there (huggingface-cli download {path} --repo-type dataset "
                f"--local-dir {folder}) or set {key}.root (datasets_dir) to null for the hub."
            )
        return
    if files is not None:
        for where, pattern in _patterns(f"{key}.data_files", files):
            for file_key, file in _expand(problems, where, pattern):
                if msg := check_file(file_key, file):
                    problems.append(msg)
    elif path in _PACKAGED_DATASETS_MODULES:
        problems.append(
            f"{key}.data_files is missing: the {path!r} builder reads local files. "
            f"Set {key}.data_files=/path/to/file.jsonl (or a list, or split -> files)."
        )
    elif path.startswith(("/", ".", "~")) or Path(path).exists():
        folder = Path(path).expanduser()
        if not folder.exists():
            problems.append(f"{key}.path ({path!r}) does not exist: no such file or folder.")
        elif folder.is_file() and (msg := check_file(f"{key}.path", str(folder))):
            problems.append(msg)
    elif msg := hub_problem(path, f"{key}.path", repo_type="dataset"):
        problems.append(msg)


def training_rows(spec: dict[str, Any]) -> int | None:
    """The rows of an ``hf`` source's training files, where they are local ``.jsonl`` files
    (one row a non-blank line); None where only loading them could tell."""
    files = spec.get("data_files")
    if isinstance(files, dict):
        files = files.get((spec.get("splits") or {"train": "train"}).get("train", "train"))
    patterns = [files] if isinstance(files, str) else files
    if not isinstance(patterns, list | tuple) or not patterns:
        return None
    paths = []
    for pattern in patterns:
        if not isinstance(pattern, str) or "://" in pattern:
            return None
        found = glob.glob(str(Path(pattern).expanduser()), recursive=True)
        paths += [Path(f) for f in found] if glob.has_magic(pattern) else [Path(pattern)]
    if not paths or any(p.suffix.lower() != ".jsonl" or not p.is_file() for p in paths):
        return None
    rows = 0
    for path in paths:
        with path.open("rb") as f:
            rows += sum(1 for line in f if line.strip())
    return rows


def check_file(key: str, file: str) -> str | None:
    """Why the data file ``file`` (from ``key``) cannot be read as a data set, or None."""
    path = Path(file).expanduser()
    shown = f"{key} ({file!r})"
    if not path.exists():
        return f"{shown}: no such file ({path.absolute()}). Check the path."
    if not path.is_file():
        return f"{shown} is not a file. Give files (a path, a list, or a glob like data/*.jsonl)."
    try:
        with path.open("rb") as f:
            return _check_lines(shown, f, path.suffix.lower())
    except OSError as err:
        return f"{shown} cannot be read: {err.strerror or err}. Check its permissions."


def _check_lines(shown: str, f: Any, suffix: str) -> str | None:
    text, jsonl = suffix in TEXT_SUFFIXES, suffix == ".jsonl"
    blank = True
    # line by line keeps memory flat on big files; the line number is what the user needs
    for number, raw in enumerate(f, start=1):
        blank = blank and not raw.strip()
        if not text:
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            byte = raw[err.start]
            return (
                f"{shown}: line {number} is not UTF-8 (byte 0x{byte:02x} at column "
                f"{err.start + 1}). {FIX_ENCODING}"
            )
        if jsonl and line.strip():
            # without its line break: an error at the end of the line is then at its last
            # column, not at "line 2, column 1" of a one-line document
            content = line.rstrip("\r\n")
            try:
                json.loads(content)
            except json.JSONDecodeError as err:
                end = ", the end of the line" if err.pos >= len(content) else ""
                return (
                    f"{shown}: line {number} is not JSON ({err.msg} at column {err.pos + 1}{end}). "
                    "A .jsonl file holds one JSON object per line; fix or remove that line."
                )
    if blank:
        return f"{shown} is empty: it holds no rows. Give a file with data in it."
    return None


def _patterns(key: str, files: Any) -> list[tuple[str, str]]:
    """(key, path or glob) for a ``data_files`` value: a path, a list, or split -> either."""
    if isinstance(files, str):
        return [(key, files)]
    if isinstance(files, list | tuple):
        return [(f"{key}[{i}]", f) for i, f in enumerate(files)]
    if isinstance(files, dict):
        return [p for split, f in files.items() for p in _patterns(f"{key}.{split}", f)]
    return [(key, files)]


def _expand(problems: list[str], key: str, pattern: Any) -> list[tuple[str, str]]:
    if not isinstance(pattern, str) or not pattern:
        problems.append(f"{key} ({pattern!r}) must be a file path or a glob.")
        return []
    if "://" in pattern:
        return []  # a remote file (hf://, https://): datasets fetches it
    if not glob.has_magic(pattern):
        return [(key, pattern)]
    matches = sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True))
    if not matches:
        problems.append(f"{key} ({pattern!r}) matches no file. Check the path and the pattern.")
    return [(key, m) for m in matches]
