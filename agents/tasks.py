"""HumanEvalFix tasks: from the Hugging Face hub (online, the normal case) or a local jsonl/parquet file.

Rows are validated against the hub schema; a bad file is one clear error naming the row and field.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .types import TASK_FIELDS, Task

REPO_ROOT = Path(__file__).resolve().parent.parent


def project_root() -> Path:
    """Where relative paths (dataset files, mlruns/) start: this checkout, or the working directory when fixlab
    runs from an installed package (no checkout around it)."""
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd()


@dataclass
class DatasetConf:
    """Which tasks a job runs (the schema of conf/dataset/*.yaml): HumanEvalFix, bigcode/humanevalpack, in one of
    its six languages (the hub's config names: python, js, java, go, cpp, rust), split test, from the hub or a
    local copy."""

    hub_id: str = "bigcode/humanevalpack"
    language: str = "python"  # the hub config read, and the language every program is built and run in
    split: str = "test"
    revision: str | None = None
    path: str | None = None  # a local jsonl or parquet file with the hub schema; wins over the hub
    # Used when `path` is null and this file exists (the offline copy on fixlab's own machines); relative to the
    # checkout (or, installed, the working directory). {language} is the language's hub config name.
    local_fallback: str | None = "../shared/data/humanevalfix_{language}.jsonl"
    limit: int | None = None  # first N tasks
    task_ids: list[str] | None = None  # e.g. [Python/0, Python/38]


class DatasetError(ValueError):
    """Bad dataset source or row. The message is one line that names the problem and the fix."""


def dataset_language(cfg: DatasetConf):
    """The record's language (sandboxes/languages); an unknown name is one line naming the six."""
    from sandboxes.languages import NAMES, language

    if cfg.language not in NAMES:
        raise DatasetError(f"dataset.language={cfg.language!r} is not a HumanEvalPack language: use one of "
                           f"{', '.join(NAMES)} (dataset.language=js)")
    return language(cfg.language)


def load_tasks(cfg: DatasetConf) -> list[Task]:
    """Tasks selected by a dataset record (language, path / hub id, limit, task_ids)."""
    lang = dataset_language(cfg)
    rows, source = _load_rows(cfg)
    tasks = [_validate(row, i, source, lang) for i, row in enumerate(rows, start=1)]
    seen = set()
    for t in tasks:
        if t.task_id in seen:
            raise DatasetError(f"{source}: task_id {t.task_id!r} appears twice; each task must be unique")
        seen.add(t.task_id)
    wanted = cfg.task_ids
    if wanted is not None and not wanted:  # [] selects nothing: not "every task"
        raise DatasetError("dataset.task_ids=[] selects no task; fix: name some (dataset.task_ids=[Python/0]) or "
                           "drop it (null runs every task)")
    if wanted:
        wanted = [str(w) for w in wanted]
        by_id = {t.task_id: t for t in tasks}
        # Accept "Python/3" or just "3".
        norm = [w if w in by_id else f"{lang.task_prefix}/{w}" for w in wanted]
        missing = [w for w, n in zip(wanted, norm) if n not in by_id]
        if missing:
            raise DatasetError(f"dataset.task_ids: no task {missing[0]!r} in {source} "
                               f"(ids look like '{lang.task_prefix}/0')")
        tasks = [by_id[n] for n in norm]
    limit = cfg.limit
    if limit is not None:
        if not isinstance(limit, int) or limit < 1:
            raise DatasetError(f"dataset.limit must be a positive integer, got {limit!r}")
        tasks = tasks[:limit]
    return tasks


def resolve_path(cfg: DatasetConf) -> Path | None:
    """The local file to read, or None to use the hub."""
    path = cfg.path
    if path:
        p = Path(os.path.expanduser(str(path)))
        if not p.is_absolute():
            p = project_root() / p if not p.exists() else p.resolve()
        if not p.exists():
            raise DatasetError(f"dataset file not found: {p} (set dataset.path=FILE to a jsonl or parquet file)")
        return p
    fallback = cfg.local_fallback
    if fallback:
        p = (project_root() / fallback.format(language=cfg.language)).resolve()
        if p.exists():
            return p
    return None


def _load_rows(cfg: DatasetConf) -> tuple[list[dict], str]:
    path = resolve_path(cfg)
    if path is not None:
        return _read_file(path), str(path)
    return _read_hub(cfg), f"hub:{cfg.hub_id}"


def _read_file(path: Path) -> list[dict]:
    if path.is_dir():
        raise DatasetError(f"dataset.path={str(path)!r} is a directory: give a .jsonl or .parquet file with the hub's "
                           "schema (e.g. ../shared/data/humanevalfix_python.jsonl)")
    if path.suffix == ".parquet":
        try:
            import pandas as pd

            return pd.read_parquet(path).to_dict(orient="records")
        except Exception as e:  # pyarrow raises many types for a bad file
            raise DatasetError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {n} is not valid JSON ({e.msg}); expected one task object per line") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {n} is a JSON {type(row).__name__}, expected an object")
            rows.append(row)
    if not rows:
        raise DatasetError(f"{path}: no tasks in file")
    return rows


def _read_hub(cfg: DatasetConf) -> list[dict]:
    hub_id, config, split = cfg.hub_id, cfg.language, cfg.split
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise DatasetError(
            f"offline and no local dataset: set dataset.path=FILE (jsonl/parquet with the hub schema of {hub_id})"
        )
    try:
        import datasets
    except ImportError:
        raise DatasetError("the `datasets` package is missing: run `make setup`") from None
    revision = cfg.revision or None
    try:
        ds = datasets.load_dataset(hub_id, config, split=split, revision=revision)
    except Exception as e:
        # humanevalpack ships a loading script, which datasets>=4 no longer runs; the hub keeps a parquet
        # conversion of every script dataset under refs/convert/parquet.
        if "script" not in str(e).lower():
            raise DatasetError(f"could not load {hub_id} ({config}/{split}) from the hub: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; set dataset.path=FILE to use a local copy") from None
        try:
            ds = datasets.load_dataset(hub_id, config, split=split, revision="refs/convert/parquet")
        except Exception as e2:
            raise DatasetError(f"could not load {hub_id} ({config}/{split}) from the hub: {type(e2).__name__}; set dataset.path=FILE to use a local copy") from None
    return [dict(r) for r in ds]


def _validate(row: dict, n: int, source: str, lang) -> Task:
    for field in TASK_FIELDS:
        if field not in row:
            rid = row.get("task_id", f"row {n}")
            raise DatasetError(f"{source}: {rid} (row {n}) has no field {field!r}; rows need the hub schema's 15 fields")
        value = row[field]
        if not isinstance(value, str):
            raise DatasetError(f"{source}: row {n} field {field!r} must be a string, got {type(value).__name__}")
    for field in ("task_id", "declaration", "buggy_solution", "entry_point", "test"):
        if not row[field].strip():
            raise DatasetError(f"{source}: {row.get('task_id') or f'row {n}'} (row {n}) has an empty {field!r}")
    prefix = row["task_id"].split("/", 1)[0]
    if prefix != lang.task_prefix:
        raise DatasetError(f"{source}: {row['task_id']} (row {n}) is a {prefix} task, not {lang.title}: set "
                           f"dataset.language to the file's language (or dataset.path to a {lang.title} file)")
    # HumanEvalPack's other languages name a few entry points unlike their declarations (CPP/121 declares
    # `solutions`, entry_point `solution`; JavaScript/114, Java/99, /101, /114): their tests call the declared name
    if lang.name == "python" and not lang.defines_entry_point(row["declaration"], row["entry_point"]):
        raise DatasetError(f"{source}: {row['task_id']} (row {n}): declaration does not define entry_point {row['entry_point']!r}")
    return Task.from_row(row)
