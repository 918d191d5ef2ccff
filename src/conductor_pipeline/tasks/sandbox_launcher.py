"""The sandbox launcher: privileged set-up of one run, in a fresh process.

``sandbox_process`` starts this file as a script (``python -I -S sandbox_launcher.py
--launch CONFIG``) rather than doing the work in ``preexec_fn``: ``preexec_fn`` is unsafe when
the parent has threads (the verifiers run in thread pools and under asyncio), while the
launcher is a fresh single-threaded process. It uses the standard library only, because
``-S`` leaves the project's dependencies out.

The launcher unshares the namespaces it may, builds the private file system, forks the
namespace's init, and init forks the candidate's interpreter after setting its rlimits and
uid. Launcher and init report over a status pipe (JSON lines); neither keeps the verdict
channel or the run's key open once the candidate exists, and both are non-dumpable, so a
candidate running under the same uid cannot reach their descriptors through ``/proc``.

Nothing the candidate starts may outlive the run. In a PID namespace the kernel sees to it
(init is PID 1). Without one (no root, or a kernel that refuses it), launcher and init are
*child subreapers* (``PR_SET_CHILD_SUBREAPER``, the ``reaper`` layer): a process the
candidate detached (``setsid`` and a double fork, which leaves the process group that the
parent kills) is re-parented to init, not to the host's init, when its parent ends; init
kills every such descendant before it exits, and the launcher does the same with anything
left under it.
When the run is cut short (wall clock, output cap), the parent stops and then kills the
launcher's whole tree (:func:`end_descendants`) before it kills the process group. The limit:
a candidate under the same uid as launcher and init (no fresh uid) may SIGKILL both, and
whatever it detached before then is re-parented outside the tree and survives; a fresh uid
(its processes are swept by uid) or a PID namespace closes that gap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

# Workdir inside the private mount namespace; a fixed path keeps tracebacks reproducible.
NS_WORKDIR = "/tmp/sandbox"
# World-writable places where a child could leave files behind; each gets a private tmpfs.
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Where the harness finds its verdict channel and the run's key (see sandbox_harness).
# Fixed numbers instead of argv entries; the harness closes both before candidate code runs.
REPORT_FD = 3
KEY_FD = 4
# Launcher-side copies of the pipes live at or above this number, clear of 3 and 4.
_HIGH_FD = 10

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


class _Libc:
    """The few libc calls Python 3.11's os module lacks (unshare arrived in 3.12)."""

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self._lib = ctypes.CDLL(None, use_errno=True)
        self._lib.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        self._lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self._lib.unshare.argtypes = [ctypes.c_int]
        self._lib.prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            errno = self._ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def unshare(self, flags: int) -> bool:
        return self._lib.unshare(flags) == 0

    def mount(
        self,
        source: str | None,
        target: str,
        fstype: str | None,
        flags: int,
        data: str | None = None,
    ) -> None:
        enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
        self._check(self._lib.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self._lib.umount2(target.encode(), _MNT_DETACH), f"umount {target}")

    def die_with_parent(self) -> None:
        self._lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def not_dumpable(self) -> None:
        self._check(self._lib.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")

    def subreaper(self) -> bool:
        """Adopt this process's orphaned descendants (Linux >= 3.4); not inherited by fork."""
        return self._lib.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _move_channels(config: dict[str, Any]) -> None:
    """Move the inherited pipes above ``_HIGH_FD``, close-on-exec, so 3 and 4 are free.

    Nothing the launcher holds is inherited by the candidate except what
    ``_exec_candidate`` places at REPORT_FD and KEY_FD itself.
    """
    for key in ("status_fd", "report_fd", "key_fd"):
        fd = int(config[key])
        if fd >= 0:
            config[key] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
            os.close(fd)


def _close_channels(config: dict[str, Any]) -> None:
    # Once the next process down holds its own copy, ours is only an opening for a
    # same-uid candidate (through /proc/<pid>/fd) to write a report or read the key.
    for key in ("report_fd", "key_fd"):
        if int(config[key]) >= 0:
            with contextlib.suppress(OSError):
                os.close(int(config[key]))
            config[key] = -1


def _launcher_main(config: dict[str, Any]) -> None:
    _move_channels(config)
    status_fd = int(config["status_fd"])

    def emit(**event: Any) -> None:
        os.write(status_fd, (json.dumps(event) + "\n").encode())

    try:
        libc = _Libc()
        libc.die_with_parent()
        # Non-dumpable: a candidate under the same uid (no fresh uid available) can neither
        # ptrace us nor open our /proc/<pid>/fd entries (the status pipe); init inherits it.
        libc.not_dumpable()
        if os.getppid() != config["parent_pid"]:
            os._exit(1)  # the parent died before prctl took effect
        os.umask(0o022)
        layers = ["session", "rlimits", "cleanenv"]
        layers += [] if config["allow_subprocesses"] else ["preamble"]
        root = os.geteuid() == 0 and config.get("kernel_layers", True)
        if root:
            for flag, name in (
                (_CLONE_NEWNET, "netns"),
                (_CLONE_NEWNS, "mountns"),
                (_CLONE_NEWPID, "pidns"),
            ):
                if libc.unshare(flag):
                    layers.append(name)
        workdir = config["workdir"]
        if "mountns" in layers:
            workdir = _build_filesystem(libc, config)
        uid = config["uid"]
        if (
            uid is not None
            and "mountns" not in layers
            and not _reachable_by_others(config["keep"] + [config["python"]])
        ):
            uid = None  # the interpreter sits in a private directory we cannot expose
        if uid is not None:
            if "mountns" not in layers:
                os.chmod(os.path.dirname(workdir), 0o711)  # let the uid reach its workdir
            for dirpath, _, filenames in os.walk(workdir):
                os.chown(dirpath, uid, uid)
                for name in filenames:
                    os.chown(os.path.join(dirpath, name), uid, uid)
            layers.append("uid")
        if "pidns" not in layers and libc.subreaper():
            layers.append("reaper")
        emit(event="isolation", layers=layers, uid=uid)
    except BaseException as exc:
        emit(event="setup_error", message=f"{type(exc).__name__}: {exc}")
        os._exit(1)

    init = os.fork()
    if init == 0:
        _init_main(libc, config, workdir, uid, layers, emit)
    _close_channels(config)
    _, status = os.waitpid(init, 0)
    if "reaper" in layers:
        # only if init was killed: then what it had adopted was re-parented here
        end_children()
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _build_filesystem(libc: _Libc, config: dict[str, Any]) -> str:
    """Private /tmp & co, hidden home/project dirs, and a workdir on the private tmpfs."""
    sources = {}
    for name in config["files"]:
        with open(os.path.join(config["workdir"], name), encoding="utf-8") as fh:
            sources[name] = fh.read()
    # Without this, mounts below could propagate back to the host's namespace.
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    size = f"size={int(config['limits']['disk_mb'])}m"
    _private_tmpfs(libc, "/tmp", size, config["keep"])
    _mask_directories(libc, config["hide"], config["keep"])
    for path in WRITABLE_DIRS[1:]:
        if os.path.isdir(path) and not os.path.islink(path):
            _private_tmpfs(libc, path, size, config["keep"])
    os.makedirs(NS_WORKDIR, mode=0o755)
    for name, text in sources.items():
        with open(os.path.join(NS_WORKDIR, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return NS_WORKDIR


def _private_tmpfs(libc: _Libc, target: str, size: str, keep: list[str]) -> None:
    """Cover ``target`` with a fresh tmpfs, re-exposing (read-only) any ``keep`` dir inside it.

    A virtual environment can live under /tmp (a clean clone in CI does); covering /tmp
    without re-exposing it would hide the interpreter that site-packages runs need
    (FileNotFoundError at exec). Each such dir is opened before the tmpfs goes on and
    bind-mounted back through its /proc/self/fd link, which still names the covered dir.
    """
    inner = [k for k in keep if k != target and within(k, target)]
    handles = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in inner]
    try:
        libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},mode=1777")
        for path, fd in handles:
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
            libc.mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    finally:
        for _, fd in handles:
            os.close(fd)


def _mask_directories(libc: _Libc, hide: list[str], keep: list[str]) -> None:
    """Cover each ``hide`` dir with an empty read-only tmpfs, re-exposing ``keep`` dirs inside."""
    stash_root = "/tmp/.sandbox-stash"
    os.mkdir(stash_root, 0o700)
    masked: list[str] = []
    for target in sorted(hide, key=len):
        if any(within(target, m) for m in masked):
            continue  # already hidden by an enclosing mask
        if any(within(target, k) for k in keep):
            continue  # hiding it would hide the interpreter itself
        inner = [k for k in keep if within(k, target)]
        stashed = []
        for i, path in enumerate(inner):
            stash = os.path.join(stash_root, f"{len(masked)}-{i}")
            os.mkdir(stash)
            libc.mount(path, stash, None, _MS_BIND | _MS_REC)
            stashed.append((path, stash))
        libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
        for path, stash in stashed:
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount(stash, path, None, _MS_BIND | _MS_REC)
            libc.mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
            libc.umount(stash)
            os.rmdir(stash)
        libc.mount(
            None,
            target,
            None,
            _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
            "size=1m,mode=755",
        )
        masked.append(target)
    os.rmdir(stash_root)


def within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _reachable_by_others(paths: list[str]) -> bool:
    """Whether an unrelated uid could traverse to every path (e.g. not under a 0700 /root)."""
    for path in paths:
        current = os.path.realpath(path)
        while True:
            try:
                mode = os.stat(current).st_mode
            except OSError:
                return False
            if os.path.isdir(current) and not mode & 0o001:
                return False
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    return True


def _init_main(
    libc: _Libc, config: dict[str, Any], workdir: str, uid: int | None, layers: list[str], emit: Any
) -> None:
    """PID 1 of the namespace (or a subreaper): run the candidate, report its end, and end
    whatever it left behind."""
    reaper = "reaper" in layers and libc.subreaper()
    try:
        libc.die_with_parent()
        if "pidns" in layers and "mountns" in layers:
            # Hide the host's process list (command lines of other processes).
            with contextlib.suppress(OSError):
                libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        child = os.fork()
        if child == 0:
            _exec_candidate(config, workdir, uid, emit)
        _close_channels(config)
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        if os.WIFSIGNALED(status):
            emit(event="exit", signal=os.WTERMSIG(status))
        else:
            emit(event="exit", returncode=os.WEXITSTATUS(status))
    except BaseException as exc:
        emit(event="setup_error", message=f"{type(exc).__name__}: {exc}")
    if reaper:
        end_children()
    os._exit(0)  # as PID 1, exiting makes the kernel kill everything the candidate left


def end_children() -> None:
    """Kill this process's children until it has none left. Run by a child subreaper, which
    adopts the children of every descendant that ends, so the loop reaches the whole tree
    (a child forked meanwhile is adopted when its parent is killed, and found next round)."""
    me = os.getpid()
    while True:
        for pid in _children(me):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def end_descendants(root: int) -> None:
    """Stop every descendant of ``root`` (not ``root`` itself), until no new one appears,
    then kill them all. Stopped processes can neither fork nor detach, so a tree that keeps
    forking is caught whole; killing first would re-parent grandchildren out of reach."""
    stopped: set[int] = set()
    for _ in range(100):
        children: dict[int, list[int]] = {}
        for pid, parent in _parents().items():
            children.setdefault(parent, []).append(pid)
        found: set[int] = set()
        frontier = [root]
        while frontier:
            for pid in children.get(frontier.pop(), []):
                if pid not in found:
                    found.add(pid)
                    frontier.append(pid)
        fresh = found - stopped
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    # /proc/<pid>/task/<pid>/children lists a thread's children (launcher and init run one
    # thread); kernels built without it fall back to a scan of every process's parent.
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return [child for child, parent in _parents().items() if parent == pid]


def proc_files(name: str) -> Iterator[tuple[int, str]]:
    """(pid, text of ``/proc/<pid>/<name>``) for every process ``/proc`` shows and lets us
    read; a process that ends while we look is skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}", encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        yield int(entry), text


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process ``/proc`` shows."""
    parents = {}
    for pid, stat in proc_files("stat"):
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[pid] = int(fields[1])
    return parents


def _exec_candidate(config: dict[str, Any], workdir: str, uid: int | None, emit: Any) -> None:
    import resource

    try:
        limits = config["limits"]
        mb = 1024 * 1024
        nproc = int(limits["nproc"])
        if uid is None and os.geteuid() != 0:
            # Without a fresh uid the limit counts every process the user already has
            # (this one included, which is already part of the budget).
            nproc += _count_processes(os.getuid()) - 1
        for res, value in (
            (resource.RLIMIT_CPU, int(limits["cpu"])),
            (resource.RLIMIT_AS, int(limits["memory_mb"]) * mb),
            (resource.RLIMIT_FSIZE, int(limits["disk_mb"]) * mb),
            (resource.RLIMIT_NOFILE, int(limits["nofile"])),
            (resource.RLIMIT_NPROC, nproc),
            (resource.RLIMIT_CORE, 0),
        ):
            soft, hard = resource.getrlimit(res)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            # CPU gets one second of grace between SIGXCPU (reportable) and SIGKILL.
            resource.setrlimit(
                res,
                (
                    value,
                    value + 1
                    if res == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY
                    else value,
                ),
            )
        os.chdir(workdir)
        env = dict(config["env"], HOME=workdir, TMPDIR=workdir)
        if config["allow_subprocesses"]:
            env["SANDBOX_ALLOW_SUBPROCESSES"] = "1"
        # The only descriptors the interpreter inherits besides 0-2; dup2 makes them
        # inheritable, every other one is close-on-exec.
        for source, target in ((config["report_fd"], REPORT_FD), (config["key_fd"], KEY_FD)):
            if int(source) >= 0:
                os.dup2(int(source), target)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.execve(config["python"], config["argv"], env)
    except BaseException as exc:
        emit(
            event="setup_error",
            message=f"starting the interpreter failed: {type(exc).__name__}: {exc}",
        )
    os._exit(127)


def _count_processes(uid: int) -> int:
    # The real uid from status, not the owner of /proc/<pid>: a non-dumpable process (our
    # own launcher and init) shows as owned by root there, yet counts against RLIMIT_NPROC.
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as fh:
                    line = next((x for x in fh if x.startswith("Uid:")), "")
            except OSError:
                continue
            fields = line.split()
            if len(fields) > 1 and fields[1] == str(uid):
                count += 1
    return count


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--launch":
    _launcher_main(json.loads(sys.argv[2]))
