"""The files a lab writes for the operator: its providers file, the sample user-data, Proxy manifests.

The VMs have no internet, so the vendor-data installs nothing (the image carries qemu-guest-agent) and
only starts the agent; it uses `bootcmd` because user-data's `runcmd` replaces vendor-data's. The
user-data is the user's part: it configures tinyproxy on the Proxy's `spec.port` and restarts it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from testbed.lab.layout import (
    BRIDGE,
    LAB_SUPERNET,
    POOL,
    PROXY_PORT,
    SOCKET,
    SSH_PORT,
    SSH_USER,
    LabLayout,
)

PROVIDER = "lab"
IMAGE_KEY = "debian-12"
MACHINE_TYPE = "small"

VENDOR_DATA = """#cloud-config
# egress-kvm lab: offline VMs; the image already has qemu-guest-agent, so just make sure it runs
bootcmd:
  - [systemctl, start, --no-block, qemu-guest-agent]
"""


def user_data(*, port: int = PROXY_PORT) -> str:
    return f"""#cloud-config
# egress-kvm lab sample: tinyproxy on the Proxy's spec.port, open to the lab's addresses only
write_files:
  - path: /etc/tinyproxy/tinyproxy.conf
    content: |
      User tinyproxy
      Group tinyproxy
      Port {port}
      Listen 0.0.0.0
      Timeout 600
      DefaultErrorFile "/usr/share/tinyproxy/default.html"
      LogFile "/var/log/tinyproxy/tinyproxy.log"
      LogLevel Info
      PidFile "/run/tinyproxy/tinyproxy.pid"
      MaxClients 100
      Allow 127.0.0.1
      Allow {LAB_SUPERNET}
      ViaProxyName "egress-kvm-lab"
runcmd:
  - [systemctl, restart, tinyproxy]
"""


def domain_type() -> str:
    """qemu (software emulation) unless the machine has real KVM; docs/lab.md quirk 1 (kvm_pvm crawls)."""
    real_kvm = Path("/sys/module/kvm_intel").exists() or Path("/sys/module/kvm_amd").exists()
    return "kvm" if real_kvm else "qemu"


class _Literal(str):
    """A string YAML writes as a `|` block, so user-data stays readable in the files."""


def _literal_representer(dumper: yaml.SafeDumper, data: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal_representer)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def providers_doc(lab: LabLayout, *, image: dict[str, Any] | None) -> dict[str, Any]:
    dtype = domain_type()
    hosts = []
    for h in lab.all_hosts:
        entry: dict[str, Any] = {
            "name": h.name, "address": f"{h.ip}:{SSH_PORT}", "user": SSH_USER, "bridge": BRIDGE,
            "pool": POOL, "socket": SOCKET, "domainType": dtype, "seedBus": "sata",
        }
        if dtype == "qemu":
            entry["cpu"] = {"mode": "maximum"}
        if not h.dhcp:
            entry["staticAddresses"] = h.static_addresses
        hosts.append(entry)
    images = {}
    egress: dict[str, Any] = {}
    if image is not None:
        images[IMAGE_KEY] = {"url": image["url"], "sha256": image["sha256"], "format": image["format"]}
        # The image server listens on the lab's gateway, a private address the egress policy denies by
        # default: allowed explicitly, that address and port only (docs/security.md).
        served = urlsplit(image["url"])
        egress["allowedCIDRs"] = [f"{served.hostname}/32:{served.port}"]
    return {**({"egress": egress} if egress else {}), "providers": [{
        "name": PROVIDER,
        "type": "kvm",
        "kvm": {
            "sshKeyFile": str(lab.ssh_key),
            "knownHostsFile": str(lab.known_hosts),
            "vendorData": _Literal(VENDOR_DATA),
            "images": images,
            "machineTypes": {MACHINE_TYPE: {"vcpus": 1, "memoryMiB": 512}},
            "hosts": hosts,
        },
    }]}


def proxy_doc(*, name: str, zone: str, target: str, port: int = PROXY_PORT) -> dict[str, Any]:
    return {
        "apiVersion": "egressproxies.io/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name},
        "spec": {
            "mode": "Managed",
            "provider": PROVIDER,
            "placement": {"zone": zone, "machineType": MACHINE_TYPE, "image": IMAGE_KEY},
            "port": port,
            "cloudInit": {"userData": _Literal(user_data(port=port))},
            "healthCheck": {"url": target, "intervalSeconds": 5, "timeoutSeconds": 5},
        },
    }


def write_all(lab: LabLayout, *, image: dict[str, Any] | None, targets: dict[str, str]) -> list[str]:
    """Write providers file, user-data and one Proxy manifest per host; return the manifest paths.

    Each host's Proxy probes that host's own target: VMs reach their own bridge, not other hosts'."""
    lab.providers_file.write_text(dump(providers_doc(lab, image=image)))
    lab.user_data_file.write_text(user_data())
    lab.manifests_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for h in lab.all_hosts:
        path = lab.manifests_dir / f"proxy-{h.name}.yaml"
        path.write_text(dump(proxy_doc(name=f"lab-proxy-{h.name}", zone=h.name, target=targets[h.name])))
        paths.append(str(path))
    return paths
