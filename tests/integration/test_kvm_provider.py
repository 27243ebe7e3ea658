"""The KVM provider against the real lab host, through real SSH and the real rpc client.

One VM boots with the spec's SATA seed and is checked row by row against "What lands on the host" with
virsh (its NIC under the default `clean-traffic` nwfilter, which drops a connect from a spoofed source
address); its IP comes from `get`, first through the guest agent and then, with the agent stopped, through
the host's neighbour table (libvirt's ARP source fails on this kernel, docs/lab.md quirk 2). The provider's
event watch follows that VM's guest agent meanwhile: what libvirtd reports at the start, when the agent
comes up, when it stops and at the delete (the same sequence from the simulator: its fidelity). A second
VM boots on the bridge with the host's DHCP server stopped, at the static address the provider wrote into
its seed, which it can only read from its virtio-scsi cdrom (`seedBus: scsi`): that one boot proves both.
Boots are sequential and few: each takes about a minute under software emulation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lxml import etree

from egress_kvm import log
from egress_kvm.config import parse_providers
from egress_kvm.providers.base import (
    AgentEvent,
    AgentState,
    CreateRequest,
    InProgress,
    InstanceChange,
    InstanceEvent,
    Placement,
    PowerState,
    ResolvedPlacement,
)
from egress_kvm.providers.kvm import KvmProvider, metadata, naming, seed
from egress_kvm.providers.registry import build_providers
from testbed import lab as labmod
from testbed.lab import faults
from testbed.lab.manifests import IMAGE_KEY
from tests.envknobs import boot_timeout

BOOT_TIMEOUT = boot_timeout(420)  # KVM_TEST_BOOT_TIMEOUT: more on a loaded machine
# A test waits for one VM's boot at most, plus up to 780 s for the rest (a base image's download through
# libvirt, the agent and proxy waits): 1200 s by default, more when the boot wait is raised.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(BOOT_TIMEOUT + 780)]
# Image keys made per run (a copy of the lab image's entry), so the download path runs every time.
RUN_IMAGE_KEY = "debian-12-it"
RUN_IMAGE_PREFIX = naming.legacy_base_volume(RUN_IMAGE_KEY).removesuffix(".qcow2")  # any base of such a key


class Logs:
    def __init__(self) -> None:
        self.stream = io.StringIO()

    def mark(self) -> int:
        return len(self.stream.getvalue().splitlines())

    def lines(self, msg: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        out = [json.loads(x) for x in self.stream.getvalue().splitlines()[since:] if x.strip()]
        return [r for r in out if msg is None or r["msg"] == msg]

    def rpcs(self, since: int) -> list[str]:
        # The first call on a new connection is preceded by the handshake (auth_list, ...): not counted.
        handshake = {"auth_list", "auth_polkit", "connect_supports_feature", "connect_open"}
        return [r["method"] for r in self.lines("libvirt call", since) if r["method"] not in handshake]


@pytest.fixture
def logs(libvirt_trace: Callable[[str], None]) -> Iterator[Logs]:
    """The provider's JSON log lines. KVM_TEST_LOG_LEVEL (default 1; 2 adds XML, metadata, addresses)
    sets the verbosity; the trace is shown after each test's result line under -v (and on failure,
    or with -rP), through tests/conftest.py's libvirt_trace."""
    cap = Logs()
    level = max(1, int(os.environ.get("KVM_TEST_LOG_LEVEL", "1")))  # the tests read V(1) lines
    log.configure(str(level), stream=cap.stream)
    yield cap
    log.configure("info")
    libvirt_trace(cap.stream.getvalue())


def provider_for(info: Any, *, cluster_id: str, images: dict[str, Any] | None = None,
                 url_images: list[str] | None = None, allow: list[str] | None = None,
                 host0: dict[str, Any] | None = None, **host_overrides: Any) -> KvmProvider:
    """The lab's provider with `host_overrides` on every host and `host0` on host0 only."""
    doc = yaml.safe_load(Path(info.providers_file).read_text())
    if allow:  # more egress.allowedCIDRs (a test's own HTTP server)
        egress = doc.setdefault("egress", {})
        egress["allowedCIDRs"] = [*egress.get("allowedCIDRs", []), *allow]
    entry = doc["providers"][0]
    entry["kvm"]["images"].update(images or {})
    if url_images is not None:
        entry["kvm"]["urlImages"] = url_images
    for h in entry["kvm"]["hosts"]:
        h.update(host_overrides)
        if h["name"] == "host0":
            h.update(host0 or {})
    config = parse_providers(doc, source=info.providers_file)
    provider = build_providers(config, cluster_id=cluster_id)[entry["name"]]
    assert isinstance(provider, KvmProvider)
    return provider


def virsh(info: Any, *args: str) -> str:
    return labmod.virsh(info, "host0", *args)


def virsh_ok(info: Any, *args: str) -> bool:
    argv = ["virsh", "-q", "-c", "qemu:///system", *args]
    return labmod.host_run(info, "host0", argv, check=False).returncode == 0


def volumes(info: Any) -> set[str]:
    return {line.split()[0] for line in virsh(info, "vol-list", "default").splitlines() if line.strip()}


def vol_download(info: Any, vol: str, *, through: str = "base64 -w0") -> str:
    """A volume's bytes as libvirt serves them (`virsh vol-download`), piped through `through` on the
    host (base64 by default; `sha256sum` for a big one), so what is checked is libvirt's view of the
    pool, not the files behind it."""
    script = f"virsh -q -c qemu:///system vol-download --pool default {vol} /dev/stdout | {through}"
    return labmod.host_run(info, "host0", ["sh", "-c", script]).stdout


def vol_bytes(info: Any, vol: str) -> bytes:
    return base64.b64decode(vol_download(info, vol))


def vol_sha256(info: Any, vol: str) -> str:
    return vol_download(info, vol, through="sha256sum").split()[0]


def lease_ip(info: Any, mac: str) -> str | None:
    leases = Path(info.hosts[0].dnsmasq_leases)
    for line in (leases.read_text() if leases.exists() else "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].lower() == mac.lower():
            return parts[2]
    return None


def user_data(info: Any) -> bytes:
    return Path(info.user_data_file).read_bytes()


async def create_waiting(provider: Any, req: CreateRequest) -> Any:
    """`provider.create` as the controller drives it: a missing base image is imported in the background
    (create answers InProgress at once); wait for the import's `wake` and ask again."""
    while True:
        try:
            return await provider.create(req)
        except InProgress as e:
            assert e.wake is not None
            await e.wake


def request(provider: KvmProvider, name: str, info: Any, *, image: str | None = None,
            zone: str = "host0") -> CreateRequest:
    """A create as the controller sends it: the placement resolved by the provider first."""
    return CreateRequest(name=name, owner_uid=f"uid-{name}",
                         placement=provider.resolve(Placement(zone=zone, image=image)),
                         user_data=user_data(info), owner_namespace="it", owner_name=name)


async def wait_for_ip(provider: KvmProvider, name: str) -> str:
    deadline = time.monotonic() + BOOT_TIMEOUT
    while time.monotonic() < deadline:
        inst = await provider.get(name, "host0")
        assert inst is not None and inst.power_state == PowerState.RUNNING
        if inst.ip:
            return inst.ip
        await asyncio.sleep(3)
    raise AssertionError(f"{name} got no IP within {BOOT_TIMEOUT:.0f}s")


async def guest_run(info: Any, name: str, script: str, *, limit: float = 60.0) -> tuple[int, str]:
    """Run a bash script in the guest through its agent (guest-exec): exit code and stdout."""
    start = json.dumps({"execute": "guest-exec", "arguments": {
        "path": "/bin/bash", "arg": ["-c", script], "capture-output": True}})
    pid = json.loads(virsh(info, "qemu-agent-command", name, start))["return"]["pid"]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = json.loads(virsh(info, "qemu-agent-command", name, json.dumps(
            {"execute": "guest-exec-status", "arguments": {"pid": pid}})))["return"]
        if status.get("exited"):
            return int(status.get("exitcode", -1)), base64.b64decode(status.get("out-data", "")).decode()
        await asyncio.sleep(1)
    raise AssertionError(f"guest script did not finish within {limit}s: {script}")


async def wait_until(check: Callable[[], bool], limit: float, what: str) -> None:
    """Poll `check` in a thread: the checks run virsh, and `domifaddr --source agent` can block for
    seconds on a stopped agent; on the loop that starves the libvirt client, whose server then drops it
    on keepalive (what proxied_get below already avoids)."""
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(1)


def proxied_get(ip: str, url: str, *, timeout: float = 180.0) -> str:
    """GET `url` through tinyproxy on the VM (configured by the user-data: proves the seed was read).
    Blocking: call it in a thread, since blocking the loop while tinyproxy comes up (tens of seconds on
    a loaded machine) starves the libvirt client, whose server then drops it on keepalive."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{ip}:3128"}))
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with opener.open(url, timeout=5) as resp:
                return resp.read().decode()
        except OSError as exc:
            last = exc
            time.sleep(2)
    raise AssertionError(f"no proxied GET through {ip}:3128 within {timeout:.0f}s: {last}")


def clean_leftovers(info: Any) -> None:
    """Remove what an earlier, interrupted run of these tests left on the lab host."""
    for name in virsh(info, "list", "--all", "--name").split():
        if name.startswith("proxy-it"):
            virsh_ok(info, "destroy", name)
            virsh_ok(info, "undefine", name, "--nvram")
    for vol in volumes(info):
        if vol.startswith(("proxy-it", RUN_IMAGE_PREFIX)):
            virsh_ok(info, "vol-delete", "--pool", "default", vol)


async def test_create_boot_ip_fallback_and_delete_on_sata(lab: Any, logs: Logs) -> None:
    info = lab
    clean_leftovers(info)
    # A key of this run only: its base is not in the pool, whatever earlier runs or other tests left, so
    # the download through libvirt happens (and is checked) every time.
    key = f"{RUN_IMAGE_KEY}-{uuid.uuid4().hex[:8]}"
    image = {"url": info.image.url, "sha256": info.image.sha256, "format": info.image.format}
    base = naming.base_volume(key=key, url=image["url"], sha256=image["sha256"])
    assert base == f"base-{key}-{info.image.sha256[:16]}.qcow2"  # content-addressed
    marker = naming.marker_volume(base)
    assert base not in volumes(info)
    cluster = f"it-{uuid.uuid4().hex[:8]}"
    provider = provider_for(info, cluster_id=cluster, images={key: image})
    name = "proxy-it-sata"
    overlay_vol = naming.overlay_volume(name, cluster_id=cluster, namespace="it")
    seed_vol = naming.seed_volume(name, cluster_id=cluster, namespace="it")
    heard: list[Any] = []  # what the provider's event watch delivers

    def agent_log() -> list[tuple[str, str]]:
        """The guest agent events of this VM as the watch logged them: (state, libvirt's reason)."""
        return [(r["state"], r["reason"]) for r in logs.lines("guest agent event") if r["name"] == name]

    def agent_states() -> list[AgentState]:
        return [e.state for e in heard if isinstance(e, AgentEvent) and e.name == name]
    try:
        watch = provider.watch_instances(heard.append)
        await wait_until(lambda: [r for r in logs.lines("lifecycle events subscribed")
                                  if r["host"] == "host0" and r["agentEvents"]], 60, "the event watch")
        # -- create: the image is fetched through libvirt into the pool, then overlay, seed, domain.
        mark = logs.mark()
        t0 = time.monotonic()
        inst = await create_waiting(provider, request(provider, name, info, image=key))
        create_s = time.monotonic() - t0
        create_rpcs = logs.rpcs(mark)
        assert inst.power_state == PowerState.RUNNING and inst.owner_uid == f"uid-{name}"
        cached = logs.lines("base image cached", mark)
        assert len(cached) == 1 and cached[0]["size"] == info.image.size
        assert cached[0]["sha256"] == info.image.sha256
        assert logs.lines("fetching base image into host pool", mark)[0]["reason"] == "not cached"
        rate = cached[0]["size"] / 1e6 / cached[0]["duration"]
        print(f"\nimage import: {cached[0]['size'] / 1e6:.0f} MB in {cached[0]['duration']:.2f}s "
              f"= {rate:.0f} MB/s; create with download: {len(create_rpcs)} RPCs in {create_s:.1f}s")

        # -- what lands on the host, row by row, as libvirt serves it (virsh vol-download).
        assert {base, marker, overlay_vol, seed_vol} <= volumes(info)
        assert vol_bytes(info, marker).decode() == info.image.sha256
        assert vol_sha256(info, base) == info.image.sha256
        overlay = etree.fromstring(virsh(info, "vol-dumpxml", "--pool", "default", overlay_vol).encode())
        assert overlay.find("target/format").get("type") == "qcow2"
        assert overlay.findtext("backingStore/path") == f"{info.hosts[0].pool_path}/{base}"
        assert overlay.find("backingStore/format").get("type") == "qcow2"
        assert int(overlay.findtext("capacity")) == 10 * 1024**3
        assert int(overlay.findtext("allocation")) < 100 * 1024**2  # thin
        iso = seed.read_seed_iso(vol_bytes(info, seed_vol))
        assert iso.label == "cidata"
        assert iso.files["user-data"] == user_data(info)
        assert iso.files["meta-data"] == f"instance-id: {name}\nlocal-hostname: {name}\n".encode()
        assert "vendor-data" in iso.files

        dom = etree.fromstring(virsh(info, "dumpxml", name).encode())
        assert dom.get("type") == "qemu"
        assert "q35" in dom.find("os/type").get("machine")
        assert dom.find("cpu").get("mode") == "maximum"
        disk = dom.find("devices/disk[@device='disk']")
        assert disk.find("target").get("bus") == "virtio"
        assert disk.find("source").get("volume") == overlay_vol
        cdrom = dom.find("devices/disk[@device='cdrom']")
        assert cdrom.find("target").get("bus") == "sata"
        assert cdrom.find("source").get("volume") == seed_vol
        nics = dom.findall("devices/interface")
        assert len(nics) == 1 and nics[0].find("source").get("bridge") == info.hosts[0].bridge
        assert nics[0].find("model").get("type") == "virtio"
        assert nics[0].find("mac").get("address") == naming.mac_address(name)
        ref = nics[0].find("filterref")  # the default trafficFilter, applied by this libvirtd
        assert ref is not None and ref.get("filter") == "clean-traffic"
        params = {p.get("name"): p.get("value") for p in ref.findall("parameter")}
        assert params == {"CTRL_IP_LEARNING": "dhcp"}
        assert dom.find("devices/serial") is not None and dom.find("devices/console") is not None
        assert dom.find("devices/channel/target").get("name") == "org.qemu.guest_agent.0"
        assert dom.find("devices/rng").get("model") == "virtio"
        assert dom.find("devices/graphics") is None
        meta = metadata.parse(virsh(info, "metadata", name, metadata.NAMESPACE))
        assert (meta.managed, meta.cluster_id, meta.owner_uid, meta.owner_namespace, meta.owner_name) == (
            True, cluster, f"uid-{name}", "it", name)
        assert [i.name for i in await provider.list_managed()] == [name]

        # -- it boots; get reports the IPv4 DHCP handed to its MAC; user-data ran (tinyproxy on 3128).
        ip = await wait_for_ip(provider, name)
        assert ip == lease_ip(info, naming.mac_address(name))
        assert await asyncio.to_thread(proxied_get, ip, info.hosts[0].http_target) == info.http_target_body

        # -- a Get is four RPCs once the agent answers (lookup, metadata, state, agent addresses).
        await wait_until(lambda: virsh_ok(info, "domifaddr", name, "--source", "agent"), 180, "agent up")

        # -- the watch heard the agent come up: libvirtd read the channel closed as the domain started,
        # then the guest's agent opened it (what the controller wakes the look for an address on).
        await wait_until(lambda: AgentState.CONNECTED in agent_states(), 60, "the agent-connected event")
        first = agent_log()
        print(f"\nguest agent events until it answered: {first}")
        assert first[0] == ("Disconnected", "domain_started")
        assert ("Connected", "channel") in first

        # -- clean-traffic holds: a TCP connect to the host from a spoofed source address (routed with
        # `src`) is dropped at the bridge, while the same connect from the leased address goes through.
        # The simulated host's guests are processes, not NICs on a bridge: it lists the stock nwfilters but
        # applies none and runs no guest commands, so this check is the real host's alone (said here, as
        # tests/integration/conftest.py's SIMULATOR_CANNOT says for whole tests).
        if not info.simulated:
            gw, port = info.hosts[0].gateway, urllib.parse.urlsplit(info.hosts[0].http_target).port
            spoof = ip.rsplit(".", 1)[0] + ".250"  # on the LAN, outside dnsmasq's range: nobody's
            dev = "$(ip -o -4 addr show | awk '$2 != \"lo\" {print $2; exit}')"
            connect = f"timeout 8 bash -c 'exec 3<>/dev/tcp/{gw}/{port}'"
            code, out = await guest_run(info, name, (
                f"dev={dev}; ip addr add {spoof}/32 dev $dev && ip route add {gw}/32 dev $dev src {spoof} && "
                f"{{ {connect}; echo spoofed=$?; ip route del {gw}/32; {connect}; echo leased=$?; "
                f"ip addr del {spoof}/32 dev $dev; }}"))
            print(f"\nspoof check from the guest ({spoof} instead of {ip}): {out.split()}")
            assert code == 0 and "leased=0" in out.split() and "spoofed=0" not in out.split(), out
        mark = logs.mark()
        assert (await provider.get(name, "host0")).ip == ip  # type: ignore[union-attr]
        get_rpcs = logs.rpcs(mark)
        # The metadata and the state go out together (together.py): their replies may come in either order.
        assert get_rpcs[0] == "domain_lookup_by_name" and get_rpcs[3:] == ["domain_interface_addresses"]
        assert sorted(get_rpcs[1:3]) == ["domain_get_metadata", "domain_get_state"]

        # -- the guest agent stopped: the IP still comes, from the host's neighbour table over SSH.
        stop = json.dumps({"execute": "guest-exec", "arguments": {
            "path": "/bin/systemctl", "arg": ["stop", "--no-block", "qemu-guest-agent"]}})
        virsh(info, "qemu-agent-command", name, stop)
        await wait_until(lambda: not virsh_ok(info, "domifaddr", name, "--source", "agent"), 60,
                         "the guest agent stopped")
        await wait_until(lambda: agent_states()[-1] is AgentState.DISCONNECTED, 60, "the agent-gone event")
        assert agent_log()[-1] == ("Disconnected", "channel")
        mark = logs.mark()
        assert (await provider.get(name, "host0")).ip == ip  # type: ignore[union-attr]
        sources = {r["source"]: r for r in logs.lines("address source gave nothing", mark)}
        assert sources["agent"]["libvirtCodeName"] == "AGENT_UNRESPONSIVE"
        if "arp" in sources:  # libvirt's ARP source fails on this kernel; the neighbour table answered
            assert logs.lines("address from the host's neighbour table", mark)

        # -- a second create on the host reuses the cached base: no download.
        mark = logs.mark()
        second = "proxy-it-second"
        await create_waiting(provider, request(provider, second, info, image=key))
        cached_rpcs = logs.rpcs(mark)
        assert not logs.lines("fetching base image into host pool", mark)
        await provider.delete(second, "host0")
        print(f"RPCs: create (base cached) {len(cached_rpcs)}: {cached_rpcs}; get {len(get_rpcs)}")
        assert len(cached_rpcs) <= 14  # 13, plus the pool refresh before its space counts
        assert cached_rpcs.index("storage_pool_refresh") < cached_rpcs.index("storage_pool_get_info")

        # -- delete: domain, overlay and seed gone; base and marker stay; deleting again succeeds. The
        # destroy of a guest whose agent is gone sends no agent event before its STOPPED (one connection:
        # libvirtd's events reach the watch in order).
        agent_before = len(agent_states())
        await provider.delete(name, "host0")
        await wait_until(lambda: any(isinstance(e, InstanceEvent) and e.name == name
                                     and e.change is InstanceChange.STOPPED for e in heard), 30, "STOPPED")
        assert len(agent_states()) == agent_before
        print(f"guest agent events of {name}, all: {agent_log()}")
        await watch.close()
        assert name not in virsh(info, "list", "--all", "--name").split()
        assert {v for v in volumes(info) if v.startswith("proxy-it")} == set()
        assert {base, marker} <= volumes(info)
        await provider.delete(name, "host0")
        assert await provider.get(name, "host0") is None
        assert await provider.list_managed() == []
    finally:
        await provider.close()
        clean_leftovers(info)  # this run's base and marker too
        clean_leftovers(info)


async def test_static_address_on_a_bridge_without_dhcp_seed_on_virtio_scsi(lab: Any, logs: Logs) -> None:
    """The host's dnsmasq stopped and `staticAddresses` declared: the create answers with the address
    before the VM has booted, the seed's network-config gives the guest that address (the proxy answers
    on it, which is what the health probes need for Ready), no DHCP lease exists for its MAC, and the
    NIC's nwfilter is pinned to it.

    The seed is on a virtio-scsi cdrom (`seedBus: scsi`): the guest can only know the address and run
    the proxy if it read the seed, so the same boot proves that bus (SATA, the default, is
    test_create_boot_ip_fallback_and_delete_on_sata's). One VM where two would boot the same image:
    each boot is minutes of CI under software emulation."""
    info = lab
    clean_leftovers(info)
    name = "proxy-it-static"
    mac = naming.mac_address(name)
    t0 = time.monotonic()
    with faults.without_dhcp(info, "host0") as static:
        provider = provider_for(info, cluster_id=f"it-{uuid.uuid4().hex[:8]}", seedBus="scsi",
                                host0={"staticAddresses": static})  # one host's range (they may not overlap)
        first = static["range"].split("-")[0]
        try:
            inst = await create_waiting(provider, request(provider, name, info))
            assert inst.ip == first  # the lowest of the range: no VM of ours holds one on this host
            got = await provider.get(name, "host0")  # still booting: no agent, no neighbour entry yet
            assert got is not None and got.power_state == PowerState.RUNNING and got.ip == first
            assert metadata.parse(virsh(info, "metadata", name, metadata.NAMESPACE)).address == first
            seed_name = naming.seed_volume(name, cluster_id=provider.cluster_id, namespace="it")
            files = seed.read_seed_iso(vol_bytes(info, seed_name)).files
            net = yaml.safe_load(files["network-config"])
            assert net["ethernets"]["eth0"]["match"] == {"macaddress": mac}
            dom = etree.fromstring(virsh(info, "dumpxml", name).encode())
            params = {p.get("name"): p.get("value")
                      for p in dom.iterfind("devices/interface/filterref/parameter")}
            assert params == {"IP": first}
            assert dom.find("devices/disk[@device='cdrom']/target").get("bus") == "scsi"
            assert dom.find("devices/controller[@type='scsi']").get("model") == "virtio-scsi"

            body = await asyncio.to_thread(proxied_get, first, info.hosts[0].http_target,
                                           timeout=BOOT_TIMEOUT)
            assert body == info.http_target_body
            ready_s = time.monotonic() - t0

            def agent_reports_it() -> bool:
                argv = ["virsh", "-q", "-c", "qemu:///system", "domifaddr", name, "--source", "agent"]
                return first in labmod.host_run(info, "host0", argv, check=False).stdout

            await wait_until(agent_reports_it, 120, f"the guest agent to report {first}")
            assert lease_ip(info, mac) is None  # the address came from the seed, not from DHCP
            await provider.delete(name, "host0")
            assert name not in virsh(info, "list", "--all", "--name").split()
            assert {v for v in volumes(info) if v.startswith("proxy-it")} == set()
            print(f"\nstatic address {first}: proxied GET through it {ready_s:.0f}s after the create")
        finally:
            await provider.close()
            clean_leftovers(info)


async def test_unreachable_host_is_transient_and_recovers(lab: Any, logs: Logs) -> None:
    """A host whose SSH port refuses: get raises TransientError (never None), and a good host still works."""
    from egress_kvm.providers.base import TransientError

    info = lab
    bad = provider_for(info, cluster_id="it-unreach", address=f"{info.hosts[0].ip}:1")
    good = provider_for(info, cluster_id="it-unreach")
    try:
        with pytest.raises(TransientError, match="unreachable"):
            await bad.get("proxy-it-none", "host0")
        assert logs.lines("libvirt host dial failed")
        assert await good.get("proxy-it-none", "host0") is None
        assert logs.lines("libvirt host connected")
    finally:
        await bad.close()
        await good.close()


def session_sshd_pids(info: Any) -> set[int]:
    """PIDs of sshd processes serving `virt` sessions in this lab's host0 namespace (ours to kill)."""
    pids = set()
    out = subprocess.run(["ip", "netns", "pids", info.hosts[0].netns], capture_output=True, text=True,
                         check=True).stdout
    for pid in out.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("sshd: virt"):
            pids.add(int(pid))
    return pids


async def test_ssh_drop_is_logged_and_the_next_call_redials(lab: Any, logs: Logs) -> None:
    info = lab
    before = session_sshd_pids(info)
    provider = provider_for(info, cluster_id="it-drop")
    try:
        assert await provider.get("proxy-it-none", "host0") is None
        ours = session_sshd_pids(info) - before
        assert ours, "no sshd session process appeared for the provider's connection"
        for pid in ours:  # the [priv] monitor's end takes its child along: that one may be gone already
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        await wait_until(lambda: bool(logs.lines("libvirt connection dropped")), 30, "the drop to be noticed")
        assert logs.lines("libvirt connection dropped")[0]["host"] == "host0"
        assert await provider.get("proxy-it-none", "host0") is None  # re-dialled
        assert len(logs.lines("libvirt host connected")) == 2
        assert session_sshd_pids(info) - before
    finally:
        await provider.close()
    # close() ends the SSH connection: its sshd session process goes away (nothing leaked).
    await wait_until(lambda: not (session_sshd_pids(info) - before), 30, "the SSH session to end")


async def test_a_control_character_in_placement_image_leaves_nothing(lab: Any, logs: Logs) -> None:
    """Issue 13 item 8, on the real host: a URL image with a control character, whose base is already in
    the pool (so nothing stops it at the download), used to get the overlay and the seed written before
    lxml refused the domain XML, and every retry wrote them again. Now it is refused before any RPC that
    changes the pool, naming the field, and the pool and the domain list are exactly as before."""
    from urllib.parse import urlsplit

    from egress_kvm.providers.base import PermanentError

    info = lab
    clean_leftovers(info)
    served = urlsplit(info.image.url)
    url = f"http://{served.hostname}:{served.port}/proxy-it-ctl\x01.qcow2"
    base = naming.base_volume(url=url)
    # The base and its marker as an earlier download would have left them (a tiny qcow2, its digest).
    script = (
        "set -e; d=$(mktemp -d); qemu-img create -q -f qcow2 $d/b.qcow2 16M; "
        "sha256sum $d/b.qcow2 | cut -c1-64 | tr -d '\\n' > $d/m; "
        f"virsh -q -c qemu:///system vol-create-as default {base} 0 --format raw; "
        f"virsh -q -c qemu:///system vol-upload --pool default {base} $d/b.qcow2; "
        f"virsh -q -c qemu:///system vol-create-as default {naming.marker_volume(base)} 0 --format raw; "
        f"virsh -q -c qemu:///system vol-upload --pool default {naming.marker_volume(base)} $d/m; rm -r $d")
    labmod.host_run(info, "host0", ["sh", "-c", script])
    provider = provider_for(info, cluster_id=f"it-ctl-{uuid.uuid4().hex[:6]}",
                            url_images=[f"{served.hostname}/32:{served.port}"])
    try:
        pool_before = volumes(info)
        domains_before = set(virsh(info, "list", "--all", "--name").split())
        for image in (url, "debian-12\x01"):
            # resolving (what the controller does first) refuses it ...
            with pytest.raises(PermanentError, match=r"placement\.image"):
                provider.resolve(Placement(zone="host0", image=image))
            # ... and so does create itself, for a placement that skipped that step
            where = ResolvedPlacement(zone="host0", machine_type="small", image=image)
            with pytest.raises(PermanentError, match=r"placement\.image"):
                await provider.create(CreateRequest(name="proxy-it-ctl", owner_uid="uid-ctl", placement=where,
                                                    user_data=user_data(info), owner_namespace="it",
                                                    owner_name="proxy-it-ctl"))
        assert volumes(info) == pool_before
        assert set(virsh(info, "list", "--all", "--name").split()) == domains_before
        print(f"\npool volumes before/after: {len(pool_before)}/{len(volumes(info))}; "
              "no volume of proxy-it-ctl")
    finally:
        await provider.close()
        for vol in (naming.marker_volume(base), base):
            virsh_ok(info, "vol-delete", "--pool", "default", vol)


async def test_lifecycle_events_reach_the_provider_and_a_redial_re_registers(lab: Any, logs: Logs) -> None:
    """Issue 9 item 1 on the host: `virsh suspend` and `virsh destroy` of our domain arrive through the
    provider's watch as InstanceEvents (libvirt's wire format: REGISTER_ANY, then proc 318 messages);
    after the SSH session is killed, the watch registers again on the new connection (the gap reported
    as EventsResumed) and the next destroy arrives too. On the way, the provider's start of the VM shut
    off, running and paused makes the calls the unit tests count in rounds (test_round_trips.py)."""
    from egress_kvm.providers.base import EventsResumed, InstanceChange, InstanceEvent

    info = lab
    clean_leftovers(info)
    provider = provider_for(info, cluster_id=f"it-ev-{uuid.uuid4().hex[:6]}")
    name = "proxy-it-events"
    got: list[Any] = []
    before = session_sshd_pids(info)
    try:
        await create_waiting(provider, request(provider, name, info))  # defined and started; no boot needed
        handle = provider.watch_instances(got.append)
        def subscribed() -> int:
            return sum(r["host"] == "host0" for r in logs.lines("lifecycle events subscribed"))
        await wait_until(lambda: subscribed() == 1, 60, "the subscription")

        def ours() -> list[Any]:
            return [e for e in got if isinstance(e, InstanceEvent) and e.name == name]
        await asyncio.to_thread(virsh, info, "suspend", name)
        await asyncio.to_thread(virsh, info, "destroy", name)
        await wait_until(lambda: len(ours()) >= 2, 30, "the suspend and destroy events")
        assert [(e.zone, e.change, e.detail) for e in ours()] == [
            ("host0", InstanceChange.PAUSED, "paused"), ("host0", InstanceChange.STOPPED, "destroyed")]
        assert not [e for e in got if isinstance(e, EventsResumed)]

        # A start of each shape on the host: after the lookup, its reads go out together (replies in any
        # order), the free memory with them for a domain the lookup says is inactive (shut off here).
        mark = logs.mark()
        await provider.start(name, "host0")
        calls = logs.rpcs(mark)
        assert calls[0] == "domain_lookup_by_name" and calls[4:] == ["domain_create_with_flags"], calls
        assert sorted(calls[1:4]) == ["domain_get_metadata", "domain_get_state", "node_get_free_memory"]
        mark = logs.mark()
        await provider.start(name, "host0")  # running: left alone
        calls = logs.rpcs(mark)
        assert calls[0] == "domain_lookup_by_name" and len(calls) == 3, calls
        assert sorted(calls[1:]) == ["domain_get_metadata", "domain_get_state"]
        await asyncio.to_thread(virsh, info, "suspend", name)
        mark = logs.mark()
        await provider.start(name, "host0")  # paused: resumed
        calls = logs.rpcs(mark)
        assert calls[0] == "domain_lookup_by_name" and calls[3:] == ["domain_resume"], calls
        assert sorted(calls[1:3]) == ["domain_get_metadata", "domain_get_state"]
        assert virsh(info, "domstate", name).strip() == "running"

        # The SSH session dies: the watch re-dials, registers again, and reports the gap.
        for pid in session_sshd_pids(info) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        await wait_until(lambda: subscribed() == 2, 60, "re-registration")
        assert any(isinstance(e, EventsResumed) and e.zone == "host0" for e in got)
        got.clear()
        await asyncio.to_thread(virsh, info, "destroy", name)
        await wait_until(lambda: len(ours()) >= 1, 30, "the destroy event on the new connection")
        assert (ours()[0].change, ours()[0].detail) == (InstanceChange.STOPPED, "destroyed")
        print(f"\nlifecycle events: {len(logs.lines('lifecycle event'))} delivered, "
              f"{subscribed()} registrations on host0")
        await handle.close()
        await provider.delete(name, "host0")
    finally:
        await provider.close()
        clean_leftovers(info)


def host_volumes(info: Any, host: str) -> set[str]:
    out = labmod.virsh(info, host, "vol-list", "default")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def clean_host(info: Any, host: str, *prefixes: str) -> None:
    """Remove this module's domains (proxy-it*) and the volumes named by `prefixes` from `host`."""
    ok = {"check": False}
    for name in labmod.virsh(info, host, "list", "--all", "--name").split():
        if name.startswith("proxy-it"):
            labmod.host_run(info, host, ["virsh", "-q", "-c", "qemu:///system", "destroy", name], **ok)
            labmod.host_run(info, host, ["virsh", "-q", "-c", "qemu:///system", "undefine", name, "--nvram"],
                            **ok)
    for vol in host_volumes(info, host):
        if vol.startswith(("proxy-it", *prefixes)):
            labmod.host_run(info, host, ["virsh", "-q", "-c", "qemu:///system", "vol-delete", "--pool",
                                         "default", vol], **ok)


def backing_of(info: Any, vol: str) -> str | None:
    xml = etree.fromstring(virsh(info, "vol-dumpxml", "--pool", "default", vol).encode())
    path: str | None = xml.findtext("backingStore/path")
    return path


async def test_a_changed_image_url_imports_a_new_base_and_the_old_one_goes_after_its_last_overlay(
        lab: Any, logs: Logs) -> None:
    """Issue 9 item 4 on the real host. A key's url changes (same bytes, another URL: unpinned, so
    another base name): the VM made before keeps running on the old base, a new VM gets the new one
    imported beside it; the GC pass keeps the old base (and a legacy `base-<key>.qcow2` under an
    overlay left by the operator before content addressing: the migration path) while anything backs
    onto it, and collects both, markers first, once nothing does. A key's current base left without its
    marker (an operator killed mid-import) is collected as incomplete. No VM is booted to the end."""
    info = lab
    key = f"{RUN_IMAGE_KEY}-{uuid.uuid4().hex[:8]}"
    killed = f"{key}-killed"
    clean_host(info, "host0", RUN_IMAGE_PREFIX)
    v1 = {"url": info.image.url, "format": info.image.format}  # unpinned: named by its URL
    v2 = {**v1, "url": info.image.url + "?v=2"}  # the same file, served for any query string
    cluster = f"it-{uuid.uuid4().hex[:8]}"
    before = provider_for(info, cluster_id=cluster, images={key: v1})
    after = provider_for(info, cluster_id=cluster, images={key: v2, killed: v1})
    killed_base = naming.base_volume(key=killed, url=v1["url"])
    old_base, new_base = (naming.base_volume(key=key, url=v["url"]) for v in (v1, v2))
    legacy = naming.legacy_base_volume(key)
    pool = info.hosts[0].pool_path

    def overlay(name: str) -> str:
        return naming.overlay_volume(name, cluster_id=cluster, namespace="it")

    try:
        # The legacy base and an overlay on it, as an operator before content addressing left them.
        labmod.host_run(info, "host0", ["sh", "-c", (
            "set -e; d=$(mktemp -d); qemu-img create -q -f qcow2 $d/b.qcow2 16M; "
            "sha256sum $d/b.qcow2 | cut -c1-64 | tr -d '\\n' > $d/m; "
            f"virsh -q -c qemu:///system vol-create-as default {legacy} 0 --format raw; "
            f"virsh -q -c qemu:///system vol-upload --pool default {legacy} $d/b.qcow2; "
            f"virsh -q -c qemu:///system vol-create-as default {legacy}.sha256 0 --format raw; "
            f"virsh -q -c qemu:///system vol-upload --pool default {legacy}.sha256 $d/m; rm -r $d; "
            "virsh -q -c qemu:///system pool-refresh default >/dev/null; "
            f"virsh -q -c qemu:///system vol-create-as default proxy-it-legacy.qcow2 1G --format qcow2 "
            f"--backing-vol {legacy} --backing-vol-format qcow2; "
            f"virsh -q -c qemu:///system vol-create-as default {killed_base} 1M --format raw")])
        await create_waiting(before, request(before, "proxy-it-v1", info, image=key))
        await create_waiting(after, request(after, "proxy-it-v2", info, image=key))
        assert {old_base, new_base, f"{old_base}.sha256", f"{new_base}.sha256"} <= volumes(info)
        assert backing_of(info, overlay("proxy-it-v1")) == f"{pool}/{old_base}"  # untouched, still running
        assert backing_of(info, overlay("proxy-it-v2")) == f"{pool}/{new_base}"
        assert backing_of(info, "proxy-it-legacy.qcow2") == f"{pool}/{legacy}"
        assert virsh(info, "domstate", "proxy-it-v1").strip() == "running"

        collected = await after.evict_unused_images(grace=0.0)
        assert not {f"host0/{v}" for v in (old_base, legacy, new_base)} & set(collected), collected
        assert {old_base, legacy, new_base} <= volumes(info)
        assert f"host0/{killed_base}" in collected and killed_base not in volumes(info)  # incomplete

        await before.delete("proxy-it-v1", "host0")
        virsh(info, "vol-delete", "--pool", "default", "proxy-it-legacy.qcow2")
        collected = await after.evict_unused_images(grace=0.0)
        assert {f"host0/{old_base}", f"host0/{legacy}"} <= set(collected), collected
        assert not {old_base, f"{old_base}.sha256", legacy, f"{legacy}.sha256"} & volumes(info)
        assert {new_base, f"{new_base}.sha256", overlay("proxy-it-v2")} <= volumes(info)  # current: kept
        print(f"\ncollected after the last overlay went: {collected}")
    finally:
        await before.close()
        await after.close()
        clean_host(info, "host0", RUN_IMAGE_PREFIX)


class Trickle:
    """A real HTTP server announcing a 3 GiB image: a valid qcow2 header, then 128 KiB every 0.5 s
    (above the default minimum rate, so only its waiters' leaving can end it early)."""

    ANNOUNCED = 3 * 1024**3

    def __init__(self, address: str) -> None:
        self.address = address
        self.url = ""
        self.sent = 0
        self.closed = asyncio.Event()
        self.stop = asyncio.Event()
        self.runner: Any = None

    async def start(self) -> None:
        from aiohttp import web
        from fakes import qcow2_image

        async def handle(req: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Length": str(self.ANNOUNCED)})
            await resp.prepare(req)
            try:
                await resp.write(qcow2_image(1024 * 1024))
                self.sent += 1024 * 1024
                while not self.stop.is_set():
                    await resp.write(bytes(128 * 1024))
                    self.sent += 128 * 1024
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), 0.5)
            except ConnectionError:
                self.closed.set()  # the operator hung up
            return resp

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.address, 0).start()
        self.url = f"http://{self.address}:{self.runner.addresses[0][1]}/huge.qcow2"

    async def close(self) -> None:
        self.stop.set()
        if self.runner is not None:
            await self.runner.cleanup()


async def test_a_3gib_import_delays_no_cached_create_and_is_cancelled_when_nobody_waits(
        lab: Any, logs: Logs) -> None:
    """Issue 9 item 3 on the real hosts. A Proxy's image is a 3 GiB download trickling from a real HTTP
    server: while it runs, creates on the cached image complete on host0 (where the import writes) and
    on host1 (their create returns while the import is still under way: it did not wait for it). Then
    the only instance waiting on the import is deleted: the download stops, the connection closes and
    the partial volume is deleted from the pool."""
    info = lab
    for h in ("host0", "host1"):
        clean_host(info, h, "base-it-huge")
    root_ip = info.hosts[0].ip.rsplit(".", 1)[0] + ".1"  # the root side of host0's veth: this lab's
    trickle = Trickle(root_ip)
    await trickle.start()
    port = urllib.parse.urlsplit(trickle.url).port
    key = f"it-huge-{uuid.uuid4().hex[:6]}"
    provider = provider_for(info, cluster_id=f"it-{uuid.uuid4().hex[:8]}", images={key: {"url": trickle.url}},
                            allow=[f"{root_ip}/32:{port}"])
    huge_base = naming.base_volume(key=key, url=trickle.url)
    try:
        for h in ("host0", "host1"):  # the lab image cached on both hosts (imported if need be)
            await create_waiting(provider, request(provider, f"proxy-it-warm-{h}", info, zone=h,
                                                          image=IMAGE_KEY))
            await provider.delete(f"proxy-it-warm-{h}", h)

        with pytest.raises(InProgress) as waiting:
            await provider.create(request(provider, "proxy-it-huge", info, image=key))
        await wait_until(lambda: huge_base in volumes(info) and trickle.sent > 2 * 1024 * 1024, 60,
                         "the 3 GiB import under way")
        wake = waiting.value.wake
        assert wake is not None
        for h in ("host0", "host1"):
            t0 = time.monotonic()
            inst = await provider.create(request(provider, f"proxy-it-cached-{h}", info, zone=h,
                                                   image=IMAGE_KEY))
            took = time.monotonic() - t0
            assert inst.power_state == PowerState.RUNNING
            assert not wake.done() and not trickle.closed.is_set()  # the import still runs
            print(f"\ncreate on the cached image on {h} during the 3 GiB import: {took:.1f}s "
                  f"(import at {trickle.sent / 1e6:.0f} MB)")
        # Its status shows bytes, percent and rate once the first progress report is due (every 5 s of
        # download: polled, since the creates above may take less than that).
        shown = ""
        deadline = time.monotonic() + 60
        while not re.search(r"downloading image .* of 3221 MB \(0%, [0-9.]+ MB/s\)", shown):
            assert time.monotonic() < deadline, f"no download progress in status: {shown}"
            await asyncio.sleep(1)
            with pytest.raises(InProgress) as again:
                await provider.create(request(provider, "proxy-it-huge", info, image=key))
            shown = str(again.value)

        await provider.delete("proxy-it-huge", "host0")  # nobody waits for the import any more
        await asyncio.wait_for(wake, 30)
        await asyncio.wait_for(trickle.closed.wait(), 30)
        await wait_until(lambda: not {huge_base, f"{huge_base}.sha256"} & volumes(info), 30,
                         "the partial base deleted")
        assert logs.lines("image import cancelled: nobody waits for it any more")
        for h in ("host0", "host1"):
            await provider.delete(f"proxy-it-cached-{h}", h)
    finally:
        await provider.close()
        await trickle.close()
        for h in ("host0", "host1"):
            clean_host(info, h, "base-it-huge")
