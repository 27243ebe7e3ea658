"""The lab's proof for its test image: served over HTTP from inside the lab, it boots under libvirt with
the spec's SATA seed cdrom, takes a DHCP lease, its guest agent reports the IP, and the sample user-data's
tinyproxy on 3128 fetches the lab's HTTP target. Driven with virsh on the host, independently of the
provider (which proves its own path)."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import time
import urllib.request
from pathlib import Path

import pycdlib
import pytest
import yaml

from testbed import lab as labmod
from tests.envknobs import boot_timeout

BOOT_TIMEOUT = boot_timeout(600)  # KVM_TEST_BOOT_TIMEOUT: more on a loaded machine
# the boot plus the image's upload and the volumes' set-up before it (300 s, as with the fixed 600 s)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(BOOT_TIMEOUT + 300)]

VM = "labtest-boot"
BASE = "labtest-base.qcow2"
DISK = f"{VM}.qcow2"
SEED = f"{VM}-seed.iso"
MAC = "52:54:00:1a:b0:01"


def seed_iso(files: dict[str, bytes]) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, data in files.items():
        iso_name = "/" + name.upper().replace("-", "")[:8] + ".;1"
        iso.add_fp(io.BytesIO(data), len(data), iso_name, rr_name=name, joliet_path="/" + name)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def domain_xml(domain_type: str) -> str:
    cpu = "<cpu mode='maximum' check='none'/>" if domain_type == "qemu" else "<cpu mode='host-passthrough'/>"
    return f"""<domain type='{domain_type}'>
  <name>{VM}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  {cpu}
  <devices>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/><source pool='default' volume='{DISK}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='volume' device='cdrom'>
      <driver name='qemu' type='raw'/><source pool='default' volume='{SEED}'/>
      <target dev='sda' bus='sata'/><readonly/>
    </disk>
    <interface type='bridge'><mac address='{MAC}'/><source bridge='br0'/><model type='virtio'/></interface>
    <serial type='pty'><log file='/var/log/libvirt/qemu/{VM}-serial.log' append='off'/></serial>
    <console type='pty'/>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>"""


def _virsh_try(lab, host: str, *args: str):  # type: ignore[no-untyped-def]
    return labmod.host_run(lab, host, ["virsh", "-q", "-c", "qemu:///system", *args], check=False)


def _cleanup(lab, host: str) -> None:
    _virsh_try(lab, host, "destroy", VM)
    _virsh_try(lab, host, "undefine", VM)
    for vol in (DISK, SEED, BASE):
        _virsh_try(lab, host, "vol-delete", "--pool", "default", vol)


def _agent_ipv4(lab, host) -> str | None:  # type: ignore[no-untyped-def]
    """The VM's LAN address as its guest agent reports it (None until the agent answers)."""
    out = _virsh_try(lab, host.name, "qemu-agent-command", VM,
                     json.dumps({"execute": "guest-network-get-interfaces"}))
    if out.returncode != 0:
        return None
    lan = ipaddress.IPv4Network(host.lan_cidr)
    for iface in json.loads(out.stdout)["return"]:
        for a in iface.get("ip-addresses", []):
            if a["ip-address-type"] == "ipv4" and ipaddress.IPv4Address(a["ip-address"]) in lan:
                return a["ip-address"]
    return None


def test_image_is_served_with_the_advertised_digest(lab):
    assert lab.image is not None and lab.image.format == "qcow2"
    h = hashlib.sha256()
    size = 0
    with urllib.request.urlopen(lab.image.url, timeout=60) as resp:
        while chunk := resp.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    assert (size, h.hexdigest()) == (lab.image.size, lab.image.sha256)
    cfg = yaml.safe_load(Path(lab.providers_file).read_text())["providers"][0]["kvm"]
    assert cfg["images"]["debian-12"] == {"url": lab.image.url, "sha256": lab.image.sha256, "format": "qcow2"}


def test_image_boots_with_a_sata_seed_and_proxies(lab, tmp_path):
    host = lab.hosts[0]
    t0 = time.monotonic()
    times: dict[str, float] = {}
    _cleanup(lab, host.name)
    try:
        served = Path(lab.state_dir) / "image" / Path(lab.image.url).name  # visible inside the host's mounts
        virsh = lambda *a: labmod.virsh(lab, host.name, *a)  # noqa: E731
        virsh("vol-create-as", "default", BASE, str(lab.image.size), "--format", "raw")
        virsh("vol-upload", "--pool", "default", BASE, str(served))
        virsh("pool-refresh", "default")
        assert "file format: qcow2" in labmod.host_run(
            lab, host.name, ["qemu-img", "info", f"{host.pool_path}/{BASE}"]).stdout
        vendor = yaml.safe_load(Path(lab.providers_file).read_text())["providers"][0]["kvm"]["vendorData"]
        iso = tmp_path / SEED
        iso.write_bytes(seed_iso({
            "user-data": Path(lab.user_data_file).read_bytes(),
            "meta-data": f"instance-id: {VM}-{time.time_ns()}\nlocal-hostname: {VM}\n".encode(),
            "vendor-data": vendor.encode(),
        }))
        virsh("vol-create-as", "default", SEED, str(iso.stat().st_size), "--format", "raw")
        virsh("vol-upload", "--pool", "default", SEED, str(iso))
        virsh("vol-create-as", "default", DISK, "4G", "--format", "qcow2",
              "--backing-vol", f"{host.pool_path}/{BASE}", "--backing-vol-format", "qcow2")
        xml = tmp_path / "domain.xml"
        xml.write_text(domain_xml(host.domain_type))
        virsh("define", str(xml))
        virsh("start", VM)
        start = time.monotonic()
        times["prepare"] = start - t0

        ip = None
        deadline = start + BOOT_TIMEOUT
        body = None
        while time.monotonic() < deadline and body is None:
            leases = Path(host.dnsmasq_leases).read_text()
            if "lease" not in times and MAC in leases:
                times["lease"] = time.monotonic() - start
            if ip is None:
                ip = _agent_ipv4(lab, host)
                if ip is not None:
                    times["agent_ip"] = time.monotonic() - start
            if ip is not None:
                proxy = urllib.request.ProxyHandler({"http": f"http://{ip}:3128"})
                try:
                    with urllib.request.build_opener(proxy).open(host.http_target, timeout=5) as resp:
                        body = resp.read().decode()
                        times["proxied_get"] = time.monotonic() - start
                except OSError:
                    pass
            if body is None:
                time.sleep(2)
        serial = Path(host.pool_dir).parent.parent / "var-log-libvirt" / "qemu" / f"{VM}-serial.log"
        assert body is not None, (
            f"no proxied GET within {BOOT_TIMEOUT:.0f} s (KVM_TEST_BOOT_TIMEOUT); {times=}; serial tail:\n"
            + (serial.read_text(errors="replace")[-3000:] if serial.exists() else "(no serial log)"))
        assert body == f"hello-through-proxy from egress-kvm lab{lab.index} {host.name}\n"
        assert ip in Path(host.dnsmasq_leases).read_text()
        print(f"\nlab image boot (SATA seed, domain type {host.domain_type}): "
              + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()))
    finally:
        _cleanup(lab, host.name)
    assert VM not in labmod.virsh(lab, host.name, "list", "--all", "--name")
