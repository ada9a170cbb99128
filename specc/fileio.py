"""Safe writes shared by the artifact, the search memory and calibration records.

- ``file_lock(path)``: an exclusive ``fcntl`` lock on ``.NAME.lock`` beside ``path`` (blocks until
  another writer of the same path is done; released when the process dies, so never stale; the
  file is removed on release).
- ``atomic_write_text(path, text)``: a unique temporary file in the same directory, fsynced, then
  renamed over ``path`` (readers see the old or the new content, never a mix; concurrent writers
  never share a temporary file).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows): no advisory locks, writes stay atomic
    fcntl = None


def lock_path(path: Path) -> Path:
    path = Path(path)
    return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def file_lock(path: Path, on_wait=None) -> Iterator[Path]:
    """Hold an exclusive lock for writing ``path``. The lock file is removed on release (while
    still held; a waiter that then finds its file unlinked or replaced retries), so nothing is
    left behind. ``on_wait(message)`` is called once when another writer holds it."""
    lp = lock_path(path)
    lp.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:  # pragma: no cover
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None and not told:
                on_wait(f"waiting for another writer of {path}")
                told = True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lp))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed (or replaced) the file we waited on: lock the current one
    try:
        yield lp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lp)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path
