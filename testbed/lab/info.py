"""lab.json: what a running lab offers, as the CLI, the fixtures and other tests read it.

The field names are a contract other code is written against; `LabInfo.load(state_dir)` gives
attribute access (`info.hosts[0].ip`) and, for code that treats it as the JSON it came from,
item access too (`info["hosts"][0]["ip"]`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class _Items:
    def __getitem__(self, key: str) -> Any:
        if key not in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


@dataclass
class ImageInfo(_Items):
    url: str
    sha256: str
    size: int
    format: str = "qcow2"


@dataclass
class HostInfo(_Items):
    name: str
    ip: str
    port: int
    address: str
    user: str
    netns: str
    bridge: str
    pool: str
    pool_path: str
    lan_cidr: str
    gateway: str
    socket: str
    domain_type: str
    libvirtd_pid: int
    sshd_pid: int
    dnsmasq_leases: str
    pool_dir: str  # pool_path as the root namespace sees it (extra)
    http_target: str  # this host's own target, reachable from its VMs (extra)
    sim_control: str = ""  # a simulated host's control socket (testbed/sim/control.py); "" for a real one
    pool_mib: int = 0  # the pool's tmpfs size (`lab up --small-pool`, testbed/lab/pool.py); 0: no tmpfs


@dataclass
class LabInfo(_Items):
    index: int
    state_dir: str
    ssh_key: str
    known_hosts: str
    providers_file: str
    image: ImageInfo | None
    http_target: str
    http_target_body: str
    hosts: list[HostInfo]
    proxy_manifests: list[str] = field(default_factory=list)
    user_data_file: str = ""
    simulated: bool = False  # testbed/sim's daemons instead of libvirtd (docs/lab.md, "Simulated hosts")
    dhcp: bool = True  # False: `lab up --no-dhcp`, the hosts' bridges have no DHCP (staticAddresses)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabInfo:
        data = dict(data)
        data["image"] = ImageInfo(**data["image"]) if data.get("image") else None
        data["hosts"] = [HostInfo(**h) for h in data["hosts"]]
        return cls(**data)

    @classmethod
    def load(cls, state_dir: Path | str) -> LabInfo:
        """From a state dir (or the lab.json path itself); FileNotFoundError when no lab was written."""
        path = Path(state_dir)
        if path.is_dir():
            path = path / "lab.json"
        return cls.from_dict(json.loads(path.read_text()))

    def to_dict(self) -> dict[str, Any]:
        """A real lab's lab.json stays as it was before simulated labs and small pools: their fields only
        when set."""
        data = dataclasses.asdict(self)
        if self.dhcp:
            del data["dhcp"]
        if not self.simulated:
            del data["simulated"]
            for h in data["hosts"]:
                del h["sim_control"]
        for h in data["hosts"]:
            if not h["pool_mib"]:
                del h["pool_mib"]
        return data

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    def host(self, name: str) -> HostInfo:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"lab {self.index} has no host {name!r} (hosts: {[h.name for h in self.hosts]})")
