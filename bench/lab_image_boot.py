"""Where a lab test image's boot time goes, and old vs new image side by side (real libvirtd, TCG).

Boots each given qcow2 on a host of a lab you keep, in alternating rounds (A B, then B A, ...; or with
`--together` both at once, so both see the same load from whatever else runs), with the provider's own
domain XML (`egress_kvm.providers.kvm.domain_xml`: q35, SATA seed cdrom, clean-traffic filter with DHCP
learning, virtio RNG) plus a serial `<log>` so the console lands in a file, and the
provider's own seed (the lab's sample user-data and vendor-data). Per boot it records, from `virsh start`
returning: the DHCP lease (dnsmasq's lease file), the guest agent's IP, the first proxied GET through
the guest's tinyproxy, and when given serial-console lines first appeared (host clock), and keeps the
serial log. With `--diag` the seed's user-data also runs a background job that waits for the boot to
finish and writes `systemd-analyze`, `blame`, `critical-chain` and `cloud-init analyze blame` to the
serial console (it starts from cloud-init's final stage, so it does not change the times above).

    egress-kvm lab up --index N --hosts 1
    EGRESS_LAB_INDEX=N .venv/bin/python bench/lab_image_boot.py --lab /var/tmp/egress-kvm-lab/labN \
        --rounds 2 [--diag] OLD.qcow2 NEW.qcow2

The machine is shared: say what else ran (load average is printed per boot) with the numbers.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from lxml import etree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from egress_kvm.config.models import CpuConfig  # noqa: E402
from egress_kvm.providers.kvm import domain_xml as dx  # noqa: E402
from egress_kvm.providers.kvm import metadata, seed  # noqa: E402
from testbed import lab as labmod  # noqa: E402
from testbed.lab.info import HostInfo  # noqa: E402

VMS = ("bench-boot-a", "bench-boot-b")  # one per image of a round
MACS = ("52:54:00:1a:b0:0a", "52:54:00:1a:b0:0b")
MARKS = {  # serial-console line fragment -> label (first appearance, host clock from start)
    "Linux version": "kernel",
    "Run /init": "initramfs",
    "systemd[1]: systemd": "systemd",
    "crng init done": "crng",
    "Cloud-init v. ": "cloud-init",
    "login:": "getty",
}
DIAG = """  - [sh, -c, "(while systemctl is-system-running | grep -q starting; do sleep 1; done; \
echo '=== diag'; systemd-analyze; systemd-analyze blame | head -40; systemd-analyze critical-chain; \
cloud-init analyze blame | head -40; lsmod; echo '=== end') > /dev/ttyS0 2>&1 &"]
"""


HOST = ["host0"]  # --host


def _host(info: labmod.LabInfo) -> HostInfo:
    return info.host(HOST[0])


def _virsh_try(info: labmod.LabInfo, *args: str) -> str | None:
    out = labmod.host_run(info, HOST[0], ["virsh", "-q", "-c", "qemu:///system", *args], check=False)
    return out.stdout if out.returncode == 0 else None


def _cleanup(info: labmod.LabInfo, vm: str) -> None:
    _virsh_try(info, "destroy", vm)
    _virsh_try(info, "undefine", vm)
    for vol in (f"{vm}.qcow2", f"{vm}-seed.iso", f"{vm}-base.qcow2"):
        _virsh_try(info, "vol-delete", "--pool", "default", vol)


def _agent_ip(info: labmod.LabInfo, lan: str, vm: str) -> str | None:
    out = _virsh_try(info, "qemu-agent-command", vm, json.dumps({"execute": "guest-network-get-interfaces"}))
    if out is None:
        return None
    for iface in json.loads(out)["return"]:
        for a in iface.get("ip-addresses", []):
            if a["ip-address-type"] == "ipv4" and ipaddress.IPv4Address(a["ip-address"]) in \
                    ipaddress.IPv4Network(lan):
                return str(a["ip-address"])
    return None


def _xml(info: labmod.LabInfo, serial_log: str, vm: str, mac: str) -> str:
    host = _host(info)
    spec = dx.DomainSpec(
        name=vm, domain_type=host.domain_type, vcpus=1, memory_mib=512,
        cpu=CpuConfig(mode="maximum" if host.domain_type == "qemu" else "host-passthrough"),
        pool="default", overlay_volume=f"{vm}.qcow2", seed_volume=f"{vm}-seed.iso", seed_bus="sata",
        bridge=host.bridge, mac=mac,
        meta=metadata.InstanceMetadata(cluster_id="bench", owner_uid="bench",
                                       created_at=datetime.now(UTC)))
    root = etree.fromstring(dx.domain_xml(spec).encode())
    serial = root.find("devices/serial")
    assert serial is not None
    etree.SubElement(serial, "log", file=serial_log, append="off")
    return str(etree.tostring(root, encoding="unicode"))


def boot_once(info: labmod.LabInfo, image: Path, diag: bool, keep: Path, slot: int = 0,
              limit: float = 900) -> dict[str, float]:
    vm, mac = VMS[slot], MACS[slot]
    host = _host(info)
    providers = yaml.safe_load(Path(info.providers_file).read_text())["providers"][0]["kvm"]
    user_data = Path(info.user_data_file).read_text()
    if diag:
        user_data += DIAG
    _cleanup(info, vm)
    serial_in_host = f"/var/log/libvirt/qemu/{vm}-serial.log"
    serial = Path(host.pool_dir).parent.parent / "var-log-libvirt" / "qemu" / f"{vm}-serial.log"
    virsh = lambda *a: labmod.virsh(info, HOST[0], *a)  # noqa: E731
    with tempfile.TemporaryDirectory(dir=info.state_dir) as tmp:
        iso = Path(tmp) / "seed.iso"
        boot_name = f"{vm}-{time.time_ns()}"  # instance-id and hostname: this boot's line in the leases
        iso.write_bytes(seed.build_seed_iso(name=boot_name, user_data=user_data.encode(),
                                            vendor_data=providers["vendorData"]))
        base = f"{vm}-base.qcow2"
        virsh("vol-create-as", "default", base, str(image.stat().st_size), "--format", "raw")
        virsh("vol-upload", "--pool", "default", base, str(image))
        virsh("pool-refresh", "default")
        virsh("vol-create-as", "default", f"{vm}-seed.iso", str(iso.stat().st_size), "--format", "raw")
        virsh("vol-upload", "--pool", "default", f"{vm}-seed.iso", str(iso))
        virsh("vol-create-as", "default", f"{vm}.qcow2", "4G", "--format", "qcow2",
              "--backing-vol", f"{host.pool_path}/{base}", "--backing-vol-format", "qcow2")
        xml = Path(tmp) / "domain.xml"
        xml.write_text(_xml(info, serial_in_host, vm, mac))
        virsh("define", str(xml))
    load = os.getloadavg()[0]
    virsh("start", vm)
    start = time.monotonic()
    times: dict[str, float] = {}
    ip = None
    try:
        while time.monotonic() < start + limit and "proxied_get" not in times:
            now = time.monotonic() - start
            if "lease" not in times and any(mac in ln and boot_name in ln
                                            for ln in Path(host.dnsmasq_leases).read_text().splitlines()):
                times["lease"] = now
            text = serial.read_text(errors="replace") if serial.exists() else ""
            for frag, label in MARKS.items():
                if label not in times and frag in text:
                    times[label] = now
            if ip is None and (ip := _agent_ip(info, host.lan_cidr, vm)) is not None:
                times["agent_ip"] = time.monotonic() - start
            if ip is not None:
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{ip}:3128"}))
                try:
                    with opener.open(host.http_target, timeout=5) as resp:
                        if resp.status == 200:
                            times["proxied_get"] = time.monotonic() - start
                except OSError:
                    pass
            time.sleep(0.5)
        if diag:
            end = time.monotonic() + 120
            while time.monotonic() < end and "=== end" not in serial.read_text(errors="replace"):
                time.sleep(2)
        times["load1"] = load
        keep.write_text(serial.read_text(errors="replace") if serial.exists() else "")
    finally:
        _cleanup(info, vm)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--host", default="host0", help="the lab host the VMs boot on")
    ap.add_argument("--diag", action="store_true")
    ap.add_argument("--together", action="store_true", help="boot the images of a round at the same time")
    ap.add_argument("--out", default="/tmp/lab_image_boot")
    ap.add_argument("images", nargs="+", type=Path)
    args = ap.parse_args()
    info = labmod.LabInfo.load(args.lab)
    HOST[0] = args.host
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, float]]] = {str(i): [] for i in args.images}
    for r in range(args.rounds):
        order = args.images if r % 2 == 0 else args.images[::-1]  # who goes first alternates too
        if args.together:  # both images boot at once: the same load for both, whatever else runs
            with ThreadPoolExecutor(len(order)) as pool:
                futs = {image: pool.submit(boot_once, info, image, args.diag,
                                           out / f"{image.stem}-round{r}.serial.log", slot)
                        for slot, image in enumerate(order)}
            got = {image: f.result() for image, f in futs.items()}
        else:
            got = {image: boot_once(info, image, args.diag, out / f"{image.stem}-round{r}.serial.log")
                   for image in order}
        for image, t in got.items():
            results[str(image)].append(t)
            print(f"round {r} {image.name}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()), flush=True)
    for image, runs in results.items():
        print(f"\n{Path(image).name}:")
        for key in ("lease", "agent_ip", "proxied_get"):
            vals = [t[key] for t in runs if key in t]
            if vals:
                print(f"  {key}: best {min(vals):.1f} s, spread {min(vals):.1f}-{max(vals):.1f} s, "
                      f"median {statistics.median(vals):.1f} s (n={len(vals)})")


if __name__ == "__main__":
    main()
