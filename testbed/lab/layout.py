"""Where a lab's pieces live: names, addresses and paths, derived from the lab index alone.

Several labs run on one machine at once (each developer, each test session picks an index), so every
name that is global to the machine (network namespace, root-side veth, subnets, the per-lab
authorized_keys file) derives from the index, and everything else lives under the lab's state dir.
Pure data: nothing here touches the system, so the arithmetic is unit-tested on its own.

Addresses, all inside 10.231.0.0/16 (the only ranges the lab ever creates or contacts):
lab N, host i -> link net 10.231.{N*16+i*2}.0/24 (root side .1, host side .2), VM LAN
10.231.{N*16+i*2+1}.0/24 (bridge br0 at .1, DHCP .100-.199; with `lab up --no-dhcp` no DHCP runs and
the providers file gives each host that range as `staticAddresses`, for the operator to allocate).

A simulated lab (`lab up --simulated`, docs/lab.md) is a separate lab beside the real one of the same
index: namespaces ekvm{N}s{i}, state dir lab{N}-sim, addresses in 10.232.0.0/16 (lab N, host i -> link
net 10.232.{N*32+i*2}.0/24, guest LAN 10.232.{N*32+i*2+1}.0/24), up to 16 hosts (a fleet benchmark's 10).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

MAX_INDEX = 7
MAX_HOSTS = 8  # 8 hosts x 2 subnets = the lab's /20
MAX_SIM_HOSTS = 16  # 16 hosts x 2 subnets = a simulated lab's /19
STATE_ROOT = Path("/var/tmp/egress-kvm-lab")
LAB_SUPERNET = ipaddress.IPv4Network("10.231.0.0/16")
SIM_SUPERNET = ipaddress.IPv4Network("10.232.0.0/16")
BRIDGE = "br0"
POOL = "default"
POOL_PATH = "/var/lib/libvirt/images"  # as the host (and libvirt) sees it, inside its mount namespace
SOCKET = "/var/run/libvirt/libvirt-sock"
SSH_USER = "virt"
SSH_PORT = 22
TARGET_PORT = 8080
IMAGE_PORT = 8081
PROXY_PORT = 3128


def cache_root() -> Path:
    """~/.cache/egress-kvm: survives `lab down` (the test image, libvirt's QEMU capabilities cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "egress-kvm"


def default_state_dir(index: int, *, simulated: bool = False) -> Path:
    return STATE_ROOT / (f"lab{index}-sim" if simulated else f"lab{index}")


def check_index(index: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= MAX_INDEX:
        raise ValueError(f"lab index: {index!r} is not an integer in 0..{MAX_INDEX}")
    return index


SELFTEST_OFFSET = (MAX_INDEX + 1) // 2


def selftest_index(main: int) -> int:
    """The index of the lab `tests/integration/test_lab_host.py` brings up, crashes and removes beside a
    session whose own lab is `main`: half the range away (0<->4, 1<->5, 2<->6, 3<->7), so sessions that
    take their main labs from 0-3 get self-test labs 4-7 that are neither their own nor another's."""
    return (check_index(main) + SELFTEST_OFFSET) % (MAX_INDEX + 1)


def check_hosts(hosts: int, *, simulated: bool = False) -> int:
    most = MAX_SIM_HOSTS if simulated else MAX_HOSTS
    if not isinstance(hosts, int) or isinstance(hosts, bool) or not 1 <= hosts <= most:
        raise ValueError(f"lab hosts: {hosts!r} is not an integer in 1..{most}")
    return hosts


@dataclass(frozen=True)
class HostLayout:
    """One hypervisor host: a network namespace with its own bridge, dnsmasq, sshd and libvirtd."""

    index: int  # the lab's index
    number: int  # 0-based host number within the lab
    dir: Path  # <state>/host<i>: pid files, logs, libvirt's private dirs
    simulated: bool = False  # testbed/sim's daemon on the libvirt socket instead of libvirtd
    dhcp: bool = True  # dnsmasq hands out dhcp_range; without it the operator allocates that range itself

    @property
    def name(self) -> str:
        return f"host{self.number}"

    @property
    def _tag(self) -> str:
        return f"ekvm{self.index}{'s' if self.simulated else 'h'}{self.number}"

    @property
    def netns(self) -> str:
        return self._tag

    @property
    def veth_root(self) -> str:
        return f"{self._tag}c"  # <= 15 chars (IFNAMSIZ)

    @property
    def veth_host(self) -> str:
        return f"{self._tag}h"

    @property
    def _net(self) -> str:
        return "10.232" if self.simulated else "10.231"

    @property
    def _link_octet(self) -> int:
        return (self.index * 32 if self.simulated else self.index * 16) + self.number * 2

    @property
    def link_cidr(self) -> str:
        return f"{self._net}.{self._link_octet}.0/24"

    @property
    def root_ip(self) -> str:
        return f"{self._net}.{self._link_octet}.1"

    @property
    def ip(self) -> str:
        """The host's SSH address: the host side of the veth."""
        return f"{self._net}.{self._link_octet}.2"

    @property
    def lan_cidr(self) -> str:
        return f"{self._net}.{self._link_octet + 1}.0/24"

    @property
    def gateway(self) -> str:
        """The bridge's address: the VMs' gateway, and where the host's HTTP servers listen."""
        return f"{self._net}.{self._link_octet + 1}.1"

    @property
    def dhcp_range(self) -> tuple[str, str]:
        return f"{self._net}.{self._link_octet + 1}.100", f"{self._net}.{self._link_octet + 1}.199"

    @property
    def static_addresses(self) -> dict[str, str]:
        """The providers file's `staticAddresses` for this host's bridge: the DHCP range, which no DHCP
        server hands out when the lab runs without one (`lab up --no-dhcp`)."""
        lo, hi = self.dhcp_range
        return {"cidr": self.lan_cidr, "gateway": self.gateway, "range": f"{lo}-{hi}"}

    @property
    def hypervisor(self) -> str:
        """The daemon on the libvirt socket (its pid file's name): libvirtd, or the simulator."""
        return "libvirt-sim" if self.simulated else "libvirtd"

    @property
    def sim_control(self) -> Path:
        """The simulator's control socket (testbed/sim/control.py)."""
        return self.dir / "sim.sock"

    @property
    def sim_knobs(self) -> Path:
        """The simulator's knobs at start (JSON, testbed/sim/knobs.py)."""
        return self.dir / "sim-knobs.json"

    # files under the host dir
    def pidfile(self, daemon: str) -> Path:
        return self.dir / f"{daemon}.pid"

    @property
    def leases(self) -> Path:
        return self.dir / "dnsmasq.leases"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def etc_libvirt(self) -> Path:
        return self.dir / "etc-libvirt"

    @property
    def var_lib_libvirt(self) -> Path:
        return self.dir / "var-lib-libvirt"

    @property
    def var_log_libvirt(self) -> Path:
        return self.dir / "var-log-libvirt"

    @property
    def pool_dir(self) -> Path:
        """The pool's directory as the root namespace sees it (bind-mounted at POOL_PATH on the host)."""
        return self.var_lib_libvirt / "images"

    @property
    def www(self) -> Path:
        return self.dir / "www"


@dataclass(frozen=True)
class LabLayout:
    index: int
    hosts: int
    state_dir: Path
    simulated: bool = False
    dhcp: bool = True  # False: no DHCP on any host's bridge; the providers file declares staticAddresses

    @classmethod
    def make(cls, *, index: int, hosts: int, state_dir: Path | str | None = None,
             simulated: bool = False, dhcp: bool = True) -> LabLayout:
        check_index(index)
        check_hosts(hosts, simulated=simulated)
        state = Path(state_dir) if state_dir is not None else default_state_dir(index, simulated=simulated)
        return cls(index=index, hosts=hosts, state_dir=state.absolute(), simulated=simulated, dhcp=dhcp)

    def host(self, number: int) -> HostLayout:
        return HostLayout(index=self.index, number=number, dir=self.state_dir / f"host{number}",
                          simulated=self.simulated, dhcp=self.dhcp)

    @property
    def all_hosts(self) -> list[HostLayout]:
        return [self.host(i) for i in range(self.hosts)]

    @property
    def every_possible_host(self) -> list[HostLayout]:
        """All host slots of this index: a crashed lab may have had more hosts than the next one asks for."""
        return [self.host(i) for i in range(MAX_SIM_HOSTS if self.simulated else MAX_HOSTS)]

    @property
    def ssh_key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def providers_file(self) -> Path:
        return self.state_dir / "providers.yaml"

    @property
    def user_data_file(self) -> Path:
        return self.state_dir / "user-data.yaml"

    @property
    def manifests_dir(self) -> Path:
        return self.state_dir / "manifests"

    @property
    def lab_json(self) -> Path:
        return self.state_dir / "lab.json"

    @property
    def layout_json(self) -> Path:
        """Written before anything is created, so `down` after a crash knows what to look for."""
        return self.state_dir / "layout.json"

    @property
    def authorized_keys_name(self) -> str:
        """Per-lab file under the virt user's ~/.ssh: sshd's StrictModes rejects a key file below
        /var/tmp (world-writable), and several labs share the one `virt` account."""
        return f"authorized_keys.egress-kvm-lab{self.index}{'-sim' if self.simulated else ''}"
