"""Runs one ``pip install`` for ``service.catalog.packages.layers`` with no privilege and nothing of the service.

Started by the service as ``python -I service/catalog/packages/pipbox.py <spec>`` (a JSON object: ``uid``, ``gid``,
``work``, ``python``, ``readable``, ``args``), with the environment pip is to get and nothing else.
When started as root it first enters a mount and a PID namespace of its own (where the kernel allows
them): closed folders on the way to what pip must read (``readable``: the interpreter, the
wheelhouse) or write (``work``) are covered with an empty tmpfs and those folders alone put back
(the same way sandbox workers reach Python under ``/root``), ``/proc`` shows only this namespace's
processes, and every process pip leaves behind dies with it. Then it drops to ``uid``/``gid`` (no
supplementary groups, no new privileges) and runs ``<python> -m pip <args>`` in ``work/home``.

pip writes only under ``work`` (``site/``, ``report.json``, its temporary files). This process then
writes ``site/`` and ``report.json`` as an uncompressed tar stream to stdout and empties ``work``
itself: the service unpacks the stream into files of its own (no ownership change is needed, which
a container without CAP_CHOWN could not make, and nothing pip's uid can still change is trusted).
pip's stderr passes through; the exit status is pip's (2 when this process fails before it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from typing import Any

if __name__ == "__main__":
    # Run as a script (``-I``: no script folder on sys.path): import ``sandbox`` from the project folder.
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from sandbox.worker.confine import contain  # noqa: E402


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[1])
    work = spec["work"]
    os.umask(0o022)
    if os.geteuid() == 0:
        try:
            _enter_namespaces(spec)
        except OSError as exc:
            # (a container without CAP_SYS_ADMIN: pip still runs unprivileged, and the kernel denies
            # its uid other users' /proc/<pid>/root; closed folders on its way stay closed)
            print(f"pipbox: no private namespaces ({exc})", file=sys.stderr)
        try:
            os.setgroups([])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        except OSError as exc:
            print(f"ERROR: cannot switch to uid {spec['uid']} ({exc})", file=sys.stderr)
            return 2
    try:
        contain._prctl(contain.PR_SET_NO_NEW_PRIVS, 1)
    except OSError:
        pass
    home = os.path.join(work, "home")
    try:
        for folder in (home, os.path.join(work, "tmp")):
            os.makedirs(folder, mode=0o700, exist_ok=True)
        # (pip dies with this process: the service kills it on a timeout, namespaces or not)
        done = subprocess.run([spec["python"], "-m", "pip", *spec["args"]], cwd=home, env=dict(os.environ),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              preexec_fn=contain.die_with_parent)
        if done.returncode == 0:
            _stream(work, sys.stdout.buffer)
        return done.returncode
    finally:
        _empty(work)


def _enter_namespaces(spec: dict[str, Any]) -> None:
    """Continue as PID 1 of new mount and PID namespaces whose filesystem lets an unprivileged uid
    reach ``readable`` (read-only) and ``work`` (writable); this process stays outside as a waiter.

    Raises:
        OSError: the kernel refused the namespaces (nothing changed then).
    """
    contain._check(contain._libc.unshare(contain.CLONE_NEWNS | contain.CLONE_NEWPID), "unshare")
    child = os.fork()
    if child > 0:
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    contain.die_with_parent()  # (a build the service times out and kills ends whole)
    contain._mount(None, "/", None, contain.MS_REC | contain.MS_PRIVATE)
    contain._mount("proc", "/proc", "proc", contain.MS_NOSUID | contain.MS_NODEV | contain.MS_NOEXEC)
    wanted = {os.path.dirname(os.__file__), os.path.realpath(sys.base_prefix), *spec["readable"]}
    readable = contain._outermost(sorted(os.path.realpath(r) for r in wanted if os.path.isdir(r)))
    work = os.path.realpath(spec["work"])
    closed = contain._outermost(sorted({a for a in (contain._closed_ancestor(r) for r in [*readable, work]) if a}))
    kept = [(root, contain._detach_copy(root), root != work) for root in [*readable, work]
            if any(contain._under(root, c) for c in closed)]
    for folder in sorted(closed):
        contain._mount("tmpfs", folder, "tmpfs", contain.MS_NOSUID | contain.MS_NODEV, "size=64k,mode=0755")
    # Readable folders first, read-only; then the work folder, which may lie inside one of them.
    for root, tree, read_only in sorted(kept, key=lambda k: not k[2]):
        os.makedirs(root, exist_ok=True)
        contain._move_mount(tree, root)
        os.close(tree)
        if read_only:
            contain._mount(None, root, None, contain.MS_REMOUNT | contain.MS_BIND | contain.MS_RDONLY
                           | contain.MS_NOSUID | contain.MS_NODEV)
    for folder in sorted(closed):
        contain._mount(None, folder, None, contain.MS_REMOUNT | contain.MS_RDONLY | contain.MS_NOSUID
                       | contain.MS_NODEV | contain.MS_NOEXEC)


def _stream(work: str, out: Any) -> None:
    """``site/`` (folders and regular files only) and ``report.json`` as a tar stream."""
    def plain(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (member.isdir() or member.isreg()):
            return None
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        archive.add(os.path.join(work, "report.json"), arcname="report.json", filter=plain)
        archive.add(os.path.join(work, "site"), arcname="site", filter=plain)
    out.flush()


def _empty(work: str) -> None:
    """Remove what pip wrote (as its uid: the service, without CAP_DAC_OVERRIDE, could not)."""
    try:
        entries = os.listdir(work)
    except OSError:
        return
    for name in entries:
        path = os.path.join(work, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
