"""The results folder's lock: one ``run`` writes a sweep's folder at a time (:class:`SweepLock`)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["Locked", "SweepLock"]


class Locked(Exception):
    """Another live process holds the results folder's lock."""


class SweepLock:
    """Exclusive lock on a results folder for one ``run``: ``<root>/.lock``.

    Taken with ``fcntl.flock`` (non-blocking), which the kernel releases when the
    holder exits in any way (``kill -9`` included), so a lock left by a dead
    process is simply taken over; the file's content (host, pid, start time,
    command) is only there to name the holder. On a file system where
    ``flock`` is not supported (``ENOLCK``/``EOPNOTSUPP``; some network file
    systems) the lock falls back to the content: a holder on this host that is
    no longer running is taken over, a live one or one on another host is
    refused (delete the file once you are sure that run is gone). On NFS,
    Linux maps ``flock`` to NFS byte-range locks, which hold across hosts.

    Args:
        root: ``results/<sweep>`` (created if missing).
        command: How to name the holder's command in the lock file (default ``sys.argv``).
    """

    def __init__(self, root: Path, command: str | None = None) -> None:
        self.path = Path(root) / ".lock"
        self.command = command if command is not None else " ".join(sys.argv)
        self._fd: int | None = None
        self.took_over: str | None = None

    @staticmethod
    def _holder(text: str) -> dict[str, Any]:
        try:
            info = json.loads(text)
            return info if isinstance(info, dict) else {}
        except ValueError:
            return {}

    @staticmethod
    def describe(info: dict[str, Any]) -> str:
        """``pid N on host H since T (command)`` for a lock file's content."""
        if not info:
            return "an unknown process (the lock file is empty)"
        return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('started_at')} ({info.get('command', '')})"

    @classmethod
    def _read_holder(cls, fd: int) -> dict[str, Any]:
        """The content of a lock file another process holds, waiting up to 2 s for it to be written.

        The holder writes its description right after taking the lock, so a reader that finds the lock held may
        come between the two; it reads again until the description parses rather than report it as unknown
        (seen in ``make test``: two runs started together, the loser named "an unknown process").
        """
        deadline = time.monotonic() + 2.0
        while True:
            info = cls._holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            if info or time.monotonic() > deadline:
                return info
            time.sleep(0.01)

    def holder(self) -> dict[str, Any] | None:
        """The live holder's description, or ``None`` if the folder is free (read-only check, for ``status``)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._read_holder(fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        return None

    def acquire(self) -> None:
        """Take the lock or raise :class:`Locked` naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = self._read_holder(fd)
                raise Locked(f"results folder {str(self.path.parent)!r} is in use by {self.describe(info)}") from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                self._check_content(fd)
            previous = self._holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            if previous:
                self.took_over = self.describe(previous)
            me = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": self.command[:300],
            }
            data = (json.dumps(me) + "\n").encode()
            os.pwrite(fd, data, 0)  # then cut what is left of the previous holder's: the file is never empty while held
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _check_content(self, fd: int) -> None:
        info = self._holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        if not info:
            return
        if info.get("host") != socket.gethostname():
            raise Locked(
                f"results folder {str(self.path.parent)!r} is in use by {self.describe(info)} "
                f"(this file system has no flock; if that run is gone, delete {str(self.path)!r})"
            )
        try:
            os.kill(int(info.get("pid", -1)), 0)
        except ProcessLookupError:
            return  # dead on this host: take over
        except (PermissionError, ValueError, TypeError):
            pass
        raise Locked(f"results folder {str(self.path.parent)!r} is in use by {self.describe(info)}")

    def release(self) -> None:
        """Clear the holder's name and release the lock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    def __enter__(self) -> "SweepLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
