"""Where a project folder still names another folder by absolute path: the files under its
``data/`` and ``mlruns/`` (any file, bytes compared) and every text value of its SQLite
stores (tags, params, artifact locations)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def _database_mentions(database: Path, needle: str) -> list[str]:
    found = []
    with sqlite3.connect(database) as conn:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info('{table}')")]
            for column in columns:
                rows = conn.execute(
                    f'SELECT "{column}" FROM "{table}" WHERE instr(CAST("{column}" AS TEXT), ?) > 0',
                    (needle,),
                ).fetchall()
                found += [f"{database.name}: {table}.{column} = {value!r}" for (value,) in rows]
    return found


def old_path_mentions(root: Path, old: Path) -> list[str]:
    """Each place under ``root``'s ``data/`` and ``mlruns/`` that contains ``old``."""
    needle = str(old)
    found = []
    for folder in ("data", "mlruns"):
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file():
                continue
            if path.suffix == ".db":
                found += _database_mentions(path, needle)
            elif needle.encode() in path.read_bytes():
                found.append(str(path.relative_to(root)))
    return found
