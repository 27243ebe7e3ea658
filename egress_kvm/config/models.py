"""The providers file as pydantic models: every field, default and rule of the KVM config reference.

Field names are the file's camelCase keys (aliases) so that pydantic's error locations are the paths a
user sees in their YAML; `errors.format_validation_error` turns them into `providers[0].kvm.hosts[1].address`.
Unknown keys are refused everywhere (`extra="forbid"`): a typo such as `diskSizeGB` must not silently
fall back to a default.

Names that end up in libvirt object names or in a shell command (image keys -> `base-<key>-<digest>.qcow2`,
bridge -> `ip -j neigh show dev <bridge>`) are restricted to safe characters here, once, so no later
layer has to wonder whether they could escape.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_SOCKET = "/var/run/libvirt/libvirt-sock"
DEFAULT_POOL = "default"
DEFAULT_DISK_SIZE_GB = 10

# user-data overrides vendor-data keys of the same name, so the default uses keys users rarely set:
# `packages` installs the agent (from the distro mirrors, in cloud-init's final stage) and `bootcmd`
# (which runs early on every boot, before the install on the first one) leaves a short retry loop behind
# that starts the agent as soon as it is installed. `runcmd` is avoided: users set it all the time.
_START_AGENT_LOOP = ("nohup sh -c 'for i in $(seq 600); do systemctl start qemu-guest-agent && exit 0; "
                     "sleep 2; done' >/dev/null 2>&1 &")
DEFAULT_VENDOR_DATA = (
    "#cloud-config\n"
    "packages:\n"
    "  - qemu-guest-agent\n"
    "bootcmd:\n"
    f'  - [sh, -c, "{_START_AGENT_LOOP}"]\n'
)

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_NAME_RULE = "must be 1-63 letters, digits, '.', '_' or '-', starting and ending alphanumeric"
_IMAGE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$")  # Linux IFNAMSIZ - 1 = 15
_POOL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_CPU_FEATURE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def parse_host_port(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); ValueError explaining what is wrong otherwise."""
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            raise ValueError("is not host:port (an IPv6 address needs [addr]:port)")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port = value.rpartition(":")
        if not sep or not host:
            raise ValueError("is not host:port")
        if ":" in host:
            raise ValueError("is not host:port (write an IPv6 address as [addr]:port)")
        if not re.fullmatch(r"[A-Za-z0-9.-]+", host):
            raise ValueError(f"host {host!r} is not a DNS name or IPv4 address")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} is not a number in 1..65535")
    return host, int(port)


def check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError("is not an http(s) URL")
    if not parts.hostname:
        raise ValueError("has no host")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("contains whitespace or control characters")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    return value


class ImageConfig(_Strict):
    url: str
    sha256: str | None = None
    format: Literal["qcow2", "raw"] = "qcow2"
    # Overrides imageImport.maxSizeGb for this image: a download longer than this is stopped.
    max_size_gb: Annotated[int, Field(ge=1, le=65536)] | None = Field(None, alias="maxSizeGb")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_http_url(v)

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not _SHA256.fullmatch(v):
            raise ValueError("is not 64 hex characters")
        return v.lower()


class ImageImportConfig(_Strict):
    """Bounds on every base-image download, so no URL can hold the operator or fill a pool."""

    timeout_seconds: Annotated[int, Field(alias="timeoutSeconds", ge=10, le=7 * 86400)] = 3600
    min_bytes_per_second: Annotated[int, Field(alias="minBytesPerSecond", ge=0)] = 64 * 1024
    rate_window_seconds: Annotated[int, Field(alias="rateWindowSeconds", ge=1, le=3600)] = 60
    max_size_gb: Annotated[int, Field(alias="maxSizeGb", ge=1, le=65536)] = 20


class MachineType(_Strict):
    vcpus: Annotated[int, Field(ge=1, le=1024)]
    memory_mib: Annotated[int, Field(alias="memoryMiB", ge=64, le=16 * 1024 * 1024)]


CpuMode = Literal["host-passthrough", "host-model", "maximum"]


class CpuConfig(_Strict):
    """The guest CPU. Needed because host-passthrough is refused under software emulation
    (docs/lab.md, quirk 1)."""

    mode: CpuMode
    disabled_features: list[str] = Field(default_factory=list, alias="disabledFeatures")

    @field_validator("disabled_features")
    @classmethod
    def _features(cls, v: list[str]) -> list[str]:
        for f in v:
            if not _CPU_FEATURE.fullmatch(f):
                raise ValueError(f"{f!r} is not a CPU feature name")
        return v


def default_cpu(domain_type: str) -> CpuConfig:
    return CpuConfig(mode="host-passthrough" if domain_type == "kvm" else "maximum")


def _ipv4(value: str, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not an IPv4 address") from None


class StaticAddresses(_Strict):
    """Addresses the operator hands out itself on a bridge with no DHCP (docs/kvm-provider.md).

    Each VM gets one address of `range` (`first-last`, inclusive), written into its seed's cloud-init
    network-config with `gateway` and `dns`. Checked here, once: the range lies inside `cidr` and holds
    neither its network nor its broadcast address; the gateway is inside the CIDR and outside the range
    (a VM must never be given the gateway's address)."""

    cidr: str
    gateway: str
    dns: list[str] = Field(default_factory=list)
    range: str

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 CIDR (e.g. 192.168.10.0/24)") from None
        if str(net) != v.strip():
            raise ValueError(f"{v!r} has host bits set: the network is {net}")
        if net.prefixlen > 30:
            raise ValueError(f"{v!r} is smaller than a /30: no room for a gateway and a VM")
        return str(net)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v: str) -> str:
        return str(_ipv4(v, "gateway"))

    @field_validator("dns")
    @classmethod
    def _dns(cls, v: list[str]) -> list[str]:
        return [str(_ipv4(a, f"entry [{i}]")) for i, a in enumerate(v)]

    @field_validator("range")
    @classmethod
    def _range(cls, v: str) -> str:
        first, sep, last = v.partition("-")
        if not sep:
            raise ValueError(f"{v!r} is not first-last (e.g. 192.168.10.100-192.168.10.199)")
        a, b = _ipv4(first.strip(), "first address"), _ipv4(last.strip(), "last address")
        if a > b:
            raise ValueError(f"{v!r}: the first address is after the last")
        return f"{a}-{b}"

    @model_validator(mode="after")
    def _inside(self) -> StaticAddresses:
        net = self.network
        first, last = self.first, self.last
        for what, ip in (("first", first), ("last", last)):
            if ip not in net:
                raise ValueError(f"range {self.range}: its {what} address {ip} is outside cidr {net}")
        if first == net.network_address or last == net.broadcast_address:
            raise ValueError(f"range {self.range} must not hold cidr {net}'s network or broadcast address")
        gw = ipaddress.IPv4Address(self.gateway)
        if gw not in net or gw in (net.network_address, net.broadcast_address):
            raise ValueError(f"gateway {gw} is not a host address of cidr {net}")
        if first <= gw <= last:
            raise ValueError(f"gateway {gw} is inside range {self.range}: a VM could be given it")
        return self

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)

    @property
    def first(self) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Address(self.range.partition("-")[0])

    @property
    def last(self) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Address(self.range.partition("-")[2])


class HostConfig(_Strict):
    name: str
    address: str
    user: str
    socket: str = DEFAULT_SOCKET
    pool: str = DEFAULT_POOL
    bridge: str
    domain_type: Literal["kvm", "qemu"] = Field("kvm", alias="domainType")
    cpu: CpuConfig | None = None
    seed_bus: Literal["sata", "scsi"] = Field("sata", alias="seedBus")
    # The bridge has no DHCP: the operator allocates each VM's address from this range.
    static_addresses: StaticAddresses | None = Field(None, alias="staticAddresses")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(_NAME_RULE)
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        parse_host_port(v)
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not _USER.fullmatch(v):
            raise ValueError("is not a valid user name")
        return v

    @field_validator("socket")
    @classmethod
    def _socket(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() or c == "\0" for c in v):
            raise ValueError("must be an absolute path without whitespace")
        return v

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str) -> str:
        if not _POOL.fullmatch(v):
            raise ValueError("is not a valid pool name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("bridge")
    @classmethod
    def _bridge(cls, v: str) -> str:
        if not _IFNAME.fullmatch(v):
            raise ValueError("is not a Linux interface name (1-15 letters, digits, '.', '_', '-')")
        return v

    @model_validator(mode="after")
    def _cpu_default(self) -> HostConfig:
        if self.cpu is None:
            object.__setattr__(self, "cpu", default_cpu(self.domain_type))
        elif self.domain_type == "qemu" and self.cpu.mode == "host-passthrough":
            raise ValueError(
                "cpu.mode 'host-passthrough' is rejected by libvirt under domainType 'qemu'; use 'maximum'")
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_host_port(self.address)

    @property
    def cpu_config(self) -> CpuConfig:
        assert self.cpu is not None  # filled by the validator
        return self.cpu


def _rules(v: list[str], *, cidr_only: bool = False) -> list[str]:
    from egress_kvm.policy.egress import parse_rule  # pure, no I/O: the policy owns the entry syntax

    for i, entry in enumerate(v):
        try:
            rule = parse_rule(entry)
        except ValueError as exc:
            raise ValueError(f"entry [{i}] {exc}") from None
        if cidr_only and rule.network is None:
            raise ValueError(f"entry [{i}] is not a CIDR (optionally with :port)")
    return v


def _cidrs(v: list[str]) -> list[str]:
    for i, entry in enumerate(v):
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"entry [{i}] is not a CIDR") from None
    return v


class EgressConfig(_Strict):
    """The egress policy for operator-side requests a tenant can aim (docs/security.md)."""

    cluster_cidrs: list[str] | None = Field(None, alias="clusterCIDRs")  # None: the private ranges
    allowed_cidrs: list[str] = Field(default_factory=list, alias="allowedCIDRs")
    external_endpoints: list[str] | None = Field(None, alias="externalEndpoints")
    auth_endpoints: list[str] = Field(default_factory=list, alias="authEndpoints")

    @field_validator("cluster_cidrs")
    @classmethod
    def _cluster(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _cidrs(v)

    @field_validator("allowed_cidrs")
    @classmethod
    def _allowed(cls, v: list[str]) -> list[str]:
        return _rules(v, cidr_only=True)

    @field_validator("auth_endpoints")
    @classmethod
    def _auth(cls, v: list[str]) -> list[str]:
        return _rules(v)

    @field_validator("external_endpoints")
    @classmethod
    def _external(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _rules(v)


class TrafficFilter(enum.Enum):
    """The libvirt nwfilter put on every VM NIC (docs/security.md, "Tenant isolation on the bridge")."""

    CLEAN_TRAFFIC = "clean-traffic"
    NONE = "none"


class KvmConfig(_Strict):
    ssh_key_file: str = Field(alias="sshKeyFile", min_length=1)
    known_hosts_file: str | None = Field(None, alias="knownHostsFile")
    insecure_ignore_host_key: bool = Field(False, alias="insecureIgnoreHostKey")
    disk_size_gb: Annotated[int, Field(alias="diskSizeGb", ge=1, le=65536)] = DEFAULT_DISK_SIZE_GB
    vendor_data: str = Field(DEFAULT_VENDOR_DATA, alias="vendorData")
    images: dict[str, ImageConfig] = Field(default_factory=dict)
    image_import: ImageImportConfig = Field(default_factory=ImageImportConfig, alias="imageImport")
    # Space every capacity decision leaves free in each pool (GiB): the host keeps room to work.
    pool_reserve_gb: Annotated[float, Field(alias="poolReserveGb", ge=0, le=65536)] = 1.0
    # Where placement.image may point as a URL (host/CIDR[:port] entries); empty: URL images are off.
    url_images: list[str] = Field(default_factory=list, alias="urlImages")
    machine_types: dict[str, MachineType] = Field(alias="machineTypes")
    hosts: list[HostConfig]
    traffic_filter: TrafficFilter = Field(
        TrafficFilter.CLEAN_TRAFFIC, alias="trafficFilter",
        description="libvirt nwfilter on every VM NIC: 'clean-traffic' (default) drops MAC, IP and ARP "
                    "spoofing and pins the NIC to the IPv4 its DHCP server hands out (the guest must use "
                    "DHCP on the bridge, or, on a host with staticAddresses, pins it to the allocated "
                    "address); 'none' puts no filter on (for hosts without the nwfilter driver or a "
                    "static-IP guest image; tenants on one bridge can then spoof each other).")

    @field_validator("images")
    @classmethod
    def _image_keys(cls, v: dict[str, ImageConfig]) -> dict[str, ImageConfig]:
        for key in v:
            if not _IMAGE_KEY.fullmatch(key):
                raise ValueError(f"image key {key!r} must be letters, digits, '.', '_' or '-' (it names "
                                 f"the volume base-<key>-<digest>.qcow2)")
        return v

    @field_validator("url_images")
    @classmethod
    def _url_images(cls, v: list[str]) -> list[str]:
        return _rules(v)

    @field_validator("machine_types")
    @classmethod
    def _machine_types(cls, v: dict[str, MachineType]) -> dict[str, MachineType]:
        if not v:
            raise ValueError("must name at least one machine type")
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[HostConfig]) -> list[HostConfig]:
        if not v:
            raise ValueError("must list at least one host")
        seen: dict[str, int] = {}
        for i, h in enumerate(v):
            if h.name in seen:
                raise ValueError(f"hosts[{i}].name {h.name!r} duplicates hosts[{seen[h.name]}].name")
            seen[h.name] = i
        _disjoint_ranges(v)
        return v

    @model_validator(mode="after")
    def _known_hosts(self) -> KvmConfig:
        if not self.insecure_ignore_host_key and not self.known_hosts_file:
            raise ValueError("knownHostsFile is required unless insecureIgnoreHostKey is true")
        return self

    def host(self, name: str) -> HostConfig | None:
        return next((h for h in self.hosts if h.name == name), None)


def _disjoint_ranges(hosts: list[HostConfig]) -> None:
    """Two hosts' static ranges must not overlap: the cluster reaches every VM by its address alone, so
    one address on two hosts' LANs would be two VMs it cannot tell apart (and, on one LAN, a clash)."""
    ranges = [(h.static_addresses.first, h.static_addresses.last, i)
              for i, h in enumerate(hosts) if h.static_addresses is not None]
    for a_first, a_last, i in ranges:
        for b_first, b_last, j in ranges:
            if i < j and a_first <= b_last and b_first <= a_last:
                raise ValueError(f"hosts[{j}].staticAddresses.range overlaps "
                                 f"hosts[{i}].staticAddresses.range")


class ProviderConfig(_Strict):
    """One entry of the file. `type` selects the block; other types get their own block beside `kvm`."""

    name: str
    type: Literal["kvm"]
    kvm: KvmConfig | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(_NAME_RULE)
        return v

    @model_validator(mode="after")
    def _block(self) -> ProviderConfig:
        if self.type == "kvm" and self.kvm is None:
            raise ValueError("type 'kvm' needs a 'kvm' block")
        return self


class ProvidersConfig(_Strict):
    providers: list[ProviderConfig] = Field(default_factory=list)
    egress: EgressConfig = Field(default_factory=lambda: EgressConfig.model_validate({}))

    @field_validator("providers")
    @classmethod
    def _unique(cls, v: list[ProviderConfig]) -> list[ProviderConfig]:
        seen: dict[str, int] = {}
        for i, p in enumerate(v):
            if p.name in seen:
                raise ValueError(f"providers[{i}].name {p.name!r} duplicates providers[{seen[p.name]}].name")
            seen[p.name] = i
        return v

    def get(self, name: str) -> ProviderConfig | None:
        return next((p for p in self.providers if p.name == name), None)
