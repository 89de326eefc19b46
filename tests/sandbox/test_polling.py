"""A worker waits on descriptors numbered past 1,024: it holds three per live session.

With ``select`` a wait on such a descriptor failed ("filedescriptor out of range in select()"),
and the worker answered every request with a sandbox error once a batch's sessions outnumbered
a few hundred.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from sandbox.worker import polling

HIGH = 4000  # past FD_SETSIZE (1,024), as a worker's descriptors are with thousands of live sessions


@pytest.fixture
def high_pipe() -> Iterator[tuple[int, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH + 2:
        pytest.fail(f"this machine allows {hard} descriptors per process; a worker needs more")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 2), hard))
    read_fd, write_fd = os.pipe()
    os.dup2(read_fd, HIGH)
    os.dup2(write_fd, HIGH + 1)
    os.close(read_fd)
    os.close(write_fd)
    try:
        yield HIGH, HIGH + 1
    finally:
        for fd in (HIGH, HIGH + 1):
            try:
                os.close(fd)
            except OSError:
                pass
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_wait_on_a_descriptor_numbered_past_1024_works(high_pipe: tuple[int, int]) -> None:
    read_fd, write_fd = high_pipe
    assert not polling.ready(read_fd, 0.05)  # nothing to read yet
    assert polling.ready(write_fd, 0.05, write=True)
    os.write(write_fd, b"x")
    assert polling.ready(read_fd, 0.05)
    assert os.read(read_fd, 1) == b"x"
    os.close(write_fd)
    assert polling.ready(read_fd, 0.05)  # the other end closed: ready, and the read says so
    assert os.read(read_fd, 1) == b""


def test_a_wait_longer_than_poll_takes_is_cut_to_it() -> None:
    """(The zygote and hosts wait for their next message up to ten years.)"""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"x")
        assert polling.ready(read_fd, 10 * 365 * 86400)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_no_wait_in_the_worker_uses_select() -> None:
    """(``select`` would come back with the first worker to hold a few hundred live sessions.)"""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "sandbox")
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as source:
                    if "select.select(" in source.read():
                        found.append(name)
    assert found == []
