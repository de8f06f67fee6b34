"""Two hosts on this one machine for multi-node tests: network namespaces joined by a veth pair, each with
an address of its own and, on request, an SSH server. Nothing else is routed from them, so their traffic
stays on their own two addresses."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil

ADDRESSES = ("198.18.0.1", "198.18.0.2")
"""From 198.18.0.0/15, the range set aside for network tests (RFC 2544)."""
PREFIX = 24
IFNAME = "coati0"
SSHD = "/usr/sbin/sshd"


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here (not root, no iproute2, a sandbox that forbids them), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if not shutil.which("ip"):
        return "iproute2's `ip` is not installed"
    probe = f"coatiprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as error:
        return f"`ip netns add` failed: {error.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


class TwoHosts:
    """Namespaces `<prefix>0` and `<prefix>1` with ADDRESSES on interface IFNAME, linked by a veth pair."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.names = [f"coati{os.getpid()}h{i}" for i in range(2)]
        self.addresses = list(ADDRESSES)
        self._sshd: List[subprocess.Popen] = []

    def up(self) -> "TwoHosts":
        for name in self.names:
            _ip("netns", "add", name)
        _ip("link", "add", IFNAME, "netns", self.names[0], "type", "veth", "peer", "name", IFNAME, "netns", self.names[1])
        for name, address in zip(self.names, self.addresses):
            _ip("-n", name, "addr", "add", f"{address}/{PREFIX}", "dev", IFNAME)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "set", IFNAME, "up")
        return self

    def down(self) -> None:
        """Stop every process left in the namespaces, then delete them (which deletes the veth pair)."""
        for name in self.names:
            for pid in self.pids(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def pids(self, name: str) -> List[int]:
        found = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        return [int(pid) for pid in found.split()]

    def command(self, host: int, argv: Sequence[str]) -> List[str]:
        """`argv` run inside host `host`'s namespace."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def popen(self, host: int, argv: Sequence[str], env: Dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
        with open(log, "w") as out:
            return subprocess.Popen(self.command(host, argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    def link_stats(self, host: int) -> Dict[str, int]:
        """Bytes sent and received on the host's veth end."""
        info = json.loads(_ip("-n", self.names[host], "-s", "-j", "link", "show", IFNAME))[0]["stats64"]
        return {"tx_bytes": info["tx"]["bytes"], "rx_bytes": info["rx"]["bytes"]}

    def routes(self, host: int) -> List[str]:
        return [line.split()[0] for line in _ip("-n", self.names[host], "route", "show").splitlines()]

    def set_link(self, host: int, up: bool) -> None:
        _ip("-n", self.names[host], "link", "set", IFNAME, "up" if up else "down")

    def start_ssh(self) -> Path:
        """An sshd on each host's address that lets root in with a throwaway key; returns a HOME whose
        ~/.ssh holds that key and a config for the two addresses (what `colossalai run` connects with)."""
        ssh = self.workdir / "ssh"
        home = self.workdir / "home"
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        ssh.mkdir(exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                       check=True)
        shutil.copy(home / ".ssh" / "id_ed25519.pub", ssh / "authorized_keys")
        (home / ".ssh" / "config").write_text(
            f"Host {' '.join(self.addresses)}\n  IdentityFile {home / '.ssh' / 'id_ed25519'}\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
        Path("/run/sshd").mkdir(exist_ok=True)   # sshd's privilege-separation directory
        for host, address in enumerate(self.addresses):
            config = ssh / f"sshd_{host}.conf"
            config.write_text(
                f"ListenAddress {address}\nPort 22\nHostKey {ssh / 'host_key'}\nPidFile {ssh / f'sshd_{host}.pid'}\n"
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n")
            self._sshd.append(self.popen(host, [SSHD, "-D", "-e", "-f", str(config)], dict(os.environ),
                                         ssh / f"sshd_{host}.log", self.workdir))
        for host, address in enumerate(self.addresses):
            self._wait_for_port(host, address, 22)
        return home

    def _wait_for_port(self, host: int, address: str, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = subprocess.run(self.command(host, ["bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]),
                                   capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"nothing listens on {address}:{port} after {timeout}s")


def workers_of(proc: subprocess.Popen, script: str) -> List[psutil.Process]:
    """The training processes (not the launcher) that `proc` started for `script`."""
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if script in cmdline and "torchrun" not in cmdline and "distributed.run" not in cmdline:
            found.append(child)
    return found
