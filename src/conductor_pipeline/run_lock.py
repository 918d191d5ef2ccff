"""A lock for a run whose steps may be separate processes: the retraining pipeline is one
``kedro run``, or one process per node under Airflow (airflow/dags/).

The claim is a small JSON file (token, pid, host, start time) that outlives the process
that wrote it; the run's last step removes it while the token is still its own. An OS file
lock cannot be that claim, since it ends with the process holding it (under Airflow, the
first task). ``filelock`` guards the moment a claim is read, judged and written instead, so
two runs that start together cannot both take a free or abandoned claim.

A claim left by a run that died is taken over when its process is gone (same host) or when
it is older than ``stale_after_s`` (another host, or a run that hangs).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

# the guarded section is a read and a write of a few hundred bytes: waiting longer than
# this means the guard's holder is stuck, not busy
_GUARD_TIMEOUT_S = 30.0


class LockHeld(RuntimeError):
    """Another live run holds the claim."""


def _guard(path: Path) -> FileLock:
    return FileLock(path.with_name(f"{path.name}.guard"), timeout=_GUARD_TIMEOUT_S)


def read_claim(path: Path) -> dict[str, Any] | None:
    """The claim at ``path``, or ``None`` when there is none or it cannot be read."""
    try:
        claim = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return claim if isinstance(claim, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def stale_reason(claim: dict[str, Any] | None, stale_after_s: float) -> str | None:
    """Why an existing claim may be taken over, or ``None`` while it is live."""
    if not claim:
        return "the lock file is unreadable"
    age = time.time() - float(claim.get("started_at") or 0)
    if age > stale_after_s:
        return f"it is {age / 3600:.1f} h old (limit {stale_after_s / 3600:.1f} h)"
    if claim.get("host") == socket.gethostname() and not _alive(int(claim.get("pid") or 0)):
        return f"its process {claim.get('pid')} is gone"
    return None


def _write(path: Path, claim: dict[str, Any]) -> None:
    # a reader never sees half a claim: write beside it, then rename over it
    temporary = path.with_name(f"{path.name}.{claim['token']}")
    temporary.write_text(json.dumps(claim), encoding="utf-8")
    os.replace(temporary, path)


def claim_lock(path: Path, *, stale_after_s: float, holder: str = "run") -> dict[str, Any]:
    """Write a new claim at ``path`` and return it; raise :class:`LockHeld` (naming the
    holder's pid, host and start) while a live claim is there. ``holder`` names the kind of
    run in that message."""
    if stale_after_s <= 0:
        raise ValueError(f"stale_after_s: must be positive, got {stale_after_s!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = {
        "token": uuid.uuid4().hex,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": time.time(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "path": str(path),
    }
    try:
        with _guard(path):
            if path.exists():
                held = read_claim(path)
                why = stale_reason(held, stale_after_s)
                if why is None:
                    raise LockHeld(
                        f"another {holder} holds {path} (pid {held.get('pid')} on "
                        f"{held.get('host')}, since {held.get('started')})"
                    )
                logger.warning("taking over the lock %s: %s", path, why)
            _write(path, claim)
    except Timeout as err:
        raise LockHeld(f"{err.lock_file} stayed locked for {_GUARD_TIMEOUT_S:.0f} s") from err
    logger.info("lock %s claimed", path)
    return claim


def release_claim(path: Path, token: str | None) -> bool:
    """Remove the claim at ``path`` if it is still the one with ``token``; ``False`` (file
    left as it is) when another run has taken it over since."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _guard(path):
        held = read_claim(path)
        if held and token and held.get("token") == token:
            path.unlink(missing_ok=True)
            return True
    logger.warning("lock %s is no longer ours; left as it is", path)
    return False
