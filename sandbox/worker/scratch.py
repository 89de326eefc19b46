"""Emptying a worker's /tmp, whatever environment code left in it.

Environment code owns what it writes to /tmp: it may nest folders thousands deep, take every
permission off them, or fill the folder with hard links. Emptying it must still finish, in time
and descriptors that do not grow with the depth, and must never raise: a clean-up that fails is a
worker to replace, not an error for whichever request comes next.

So nothing here recurses. A folder is emptied one level at a time: its files are unlinked and its
subfolders are moved up to the top, to be emptied in turn, so at most three descriptors are open
and no path is longer than one name. A folder whose permissions were taken off is given them back
first (its owner, the worker's uid, may; root need not). The number of entries is bounded by the
tmpfs's ``nr_inodes``, which counts hard links too.

Standard library only: the worker imports this module.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

# Opening a folder by name from its parent's descriptor, never through a link.
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
HOISTED = ".emptied-"  # names of subfolders moved up to the top while they are emptied


def empty(top: int, *, keep: Callable[[str], bool] = lambda name: False, owner: int | None = None) -> bool:
    """Remove everything in the folder open as ``top`` except the top-level names ``keep`` says
    to leave (and, with ``owner``, top-level entries another uid owns: mount points and folders the
    service made there). Returns whether nothing else is left. Never raises."""
    try:
        queue = [name for name in os.listdir(top) if not keep(name) and (owner is None or _owner(top, name) == owner)]
    except OSError:
        return False
    complete = True
    hoisted = 0
    while queue:
        name = queue.pop()
        try:
            moved = _remove(top, name, hoisted)
        except OSError:
            complete = False
            continue
        hoisted += len(moved)
        queue.extend(moved)
    return complete


def empty_tmp(mode: int, preserve: list[str]) -> bool:
    """Empty the worker's /tmp but the folders confinement put back inside it (``preserve``, e.g. a
    checkout there), giving it back ``mode`` if it is the worker's own. Returns whether it could
    be emptied. Never raises."""
    try:
        tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(tmp).st_uid == os.geteuid():  # (a /tmp of its own uid only where confinement is partial)
            os.fchmod(tmp, mode)
        return empty(tmp, keep=lambda name: _preserved(f"/tmp/{name}", preserve))
    except OSError:
        return False
    finally:
        os.close(tmp)


def _preserved(path: str, preserve: list[str]) -> bool:
    """Whether ``path`` holds a folder confinement put back inside /tmp (never emptied)."""
    return any(p == path or p.startswith(path + "/") for p in preserve)


def _remove(top: int, name: str, hoisted: int) -> list[str]:
    """Remove the top-level entry ``name``: a file at once, a folder once its files are gone.
    Returns the names its subfolders were moved up to (to be removed in turn)."""
    try:
        os.unlink(name, dir_fd=top)
        return []
    except IsADirectoryError:
        pass
    except PermissionError:  # Linux answers EISDIR for a folder, but a forged mode may say EPERM
        if not _is_folder(top, name):
            raise
    _writable(top, name)
    moved: list[str] = []
    folder = os.open(name, _FOLDER, dir_fd=top)
    try:
        for entry in os.listdir(folder):
            if _is_folder(folder, entry):
                _writable(folder, entry)  # (moving a folder rewrites its "..")
                target = _free_name(top, hoisted + len(moved))
                os.rename(entry, target, src_dir_fd=folder, dst_dir_fd=top)
                moved.append(target)
            else:
                os.unlink(entry, dir_fd=folder)
    finally:
        os.close(folder)
    os.rmdir(name, dir_fd=top)
    return moved


def _free_name(top: int, start: int) -> str:
    n = start
    while True:
        name = f"{HOISTED}{n}"
        try:
            os.stat(name, dir_fd=top, follow_symlinks=False)
        except FileNotFoundError:
            return name
        n += 1


def _is_folder(parent: int, name: str) -> bool:
    return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)


def _writable(parent: int, name: str) -> None:
    """Give the folder ``name`` back its owner's permissions if they were taken off (through a
    descriptor of the folder itself: a link put in its place is never followed)."""
    handle = os.open(name, _PATH | os.O_DIRECTORY, dir_fd=parent)
    try:
        mode = os.fstat(handle).st_mode
        if mode & 0o700 != 0o700 and os.geteuid() != 0:
            os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(mode) | 0o700)
    finally:
        os.close(handle)


def _owner(parent: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_uid
    except OSError:
        return -1
