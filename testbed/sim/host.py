"""One simulated hypervisor host: the model, its knobs, the wire server, the guests and the control socket.

Guests: a domain start schedules a boot of `boot_delay_s`; then the guest takes the static address its
seed's cloud-init network-config gives its MAC (a host with staticAddresses: no lease is written, as no
DHCP ran), else the next free address of the host's guest network, reports it (guest agent and/or the
ARP table, per the knobs) and serves an HTTP forward proxy there on the port its cloud-init user-data
names (`Port N`, as the lab's tinyproxy config does) or the default. A stop, crash or pause ends or
freezes that proxy. The addresses are made local in the host's network namespace by the lab (an AnyIP
route), so the operator reaches them over the same veth and route it uses for a real lab VM.

Control: JSON lines on a unix socket (control.py is the client): knobs, guest crash/pause, a guest's
QEMU stopped and continued, host kill/revive, and the state a benchmark counts (domains, volumes, calls,
error replies by code).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from lxml import etree

from egress_kvm.providers.kvm.seed import read_seed_iso
from rpc.constants import AgentLifecycleReason, AgentLifecycleState, DomainState, ErrorCode

from . import proxy
from .knobs import Knobs
from .model import (
    DOMAIN_SHUTOFF_CRASHED,
    Domain,
    Hypervisor,
    Lifecycle,
    invalid,
    load_pool_dir,
    lv_error,
)
from .neigh import NeighbourError, Neighbours, Op, Request
from .server import WireConnection

log = logging.getLogger(__name__)

_PORT_LINE = re.compile(rb"^\s*Port\s+(\d{1,5})\s*$", re.MULTILINE)


class Guest:
    def __init__(self) -> None:
        self.boot: asyncio.Task[None] | None = None
        self.ip: str | None = None
        self.server: asyncio.Server | None = None

    def stop(self) -> None:
        if self.boot is not None:
            self.boot.cancel()
        if self.server is not None:
            self.server.close()
            self.server = None


class SimHost:
    def __init__(self, hyp: Hypervisor, knobs: Knobs, *, socket_path: str, guest_network: str | None,
                 socket_group: int | None = None) -> None:
        self.hyp = hyp
        self.knobs = knobs
        self.socket_path = socket_path
        self.socket_group = socket_group
        net = ipaddress.ip_network(guest_network) if guest_network else None
        # .1 is the bridge (the VMs' gateway and the lab's HTTP target): guests take the rest in order
        self.free_ips = [str(ip) for ip in net.hosts()][1:] if net else []
        self.guests: dict[str, Guest] = {}
        self.connections: set[WireConnection] = set()
        self.unfrozen = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.calls = 0
        self.errors: Counter[str] = Counter()  # error replies by code name (injected ones included)
        self.killed = False
        # In the lab: where a real host's dnsmasq and kernel would record a booted guest's address
        self.leases: Path | None = None
        self.bridge: str | None = None
        self.neighbours = Neighbours()
        self._background: set[asyncio.Task[None]] = set()
        self._callback_id = 0
        self.qemu_stopped: dict[str, asyncio.Event] = {}  # domain -> set when its QEMU continues
        hyp.listeners.append(self._lifecycle)
        hyp.agent_listeners.append(self._agent_lifecycle)
        self.apply_knobs()

    def next_callback_id(self) -> int:
        self._callback_id += 1
        return self._callback_id

    def apply_knobs(self) -> None:
        k = self.knobs
        self.hyp.pool_capacity = k.pool_capacity_bytes
        self.hyp.memory = k.memory_bytes
        self.hyp.arp_broken = k.arp_broken
        if k.frozen:
            self.unfrozen.clear()
        else:
            self.unfrozen.set()
        # the limit reaches open connections too (a test's convenience); the keepalive knobs, as libvirtd's
        # config, only connections opened after them
        for conn in list(self.connections):
            conn.set_max_client_requests(k.max_client_requests)

    # -- the wire server --------------------------------------------------------------------------

    async def listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(lambda: WireConnection(self), self.socket_path)
        if self.socket_group is not None:
            os.chown(self.socket_path, 0, self.socket_group)
        os.chmod(self.socket_path, 0o770)  # like libvirtd's unix_sock_rw_perms in the lab

    def kill(self) -> int:
        """The host dies: no daemon on the socket, every connection cut, every guest gone (running domains
        are shut off, transient ones vanish); volumes and persistent definitions stay, as on disk.
        Returns how many guests it stopped (a chaos run asserts its kill hit something)."""
        self.killed = True
        if self.server is not None:
            self.server.close()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        for conn in list(self.connections):
            conn.close()
        stopped = 0
        for dom in list(self.hyp.domains.values()):
            if dom.id != -1:
                self.hyp.shut_off(dom.name, reason=0)
                stopped += 1
        return stopped

    async def revive(self) -> None:
        self.killed = False
        await self.listen()

    # -- guests ---------------------------------------------------------------------------------

    def _lifecycle(self, dom: Domain, event: Lifecycle, detail: int) -> None:
        for conn in list(self.connections):
            conn.lifecycle(dom, event, detail)
        if event in (Lifecycle.STOPPED, Lifecycle.UNDEFINED) and dom.id == -1:
            self.cont_qemu(dom.name)  # its QEMU is gone: what waited on its monitor is answered now
        guest = self.guests.get(dom.name)
        if event == Lifecycle.STARTED:
            if guest is not None:
                self._release(dom.name, guest)
            guest = self.guests[dom.name] = Guest()
            guest.boot = asyncio.get_running_loop().create_task(self._boot(dom, guest))
        elif guest is not None and (event == Lifecycle.STOPPED or
                                    (event == Lifecycle.UNDEFINED and dom.id == -1)):
            self._release(dom.name, guest)

    def _agent_lifecycle(self, dom: Domain, state: AgentLifecycleState, reason: AgentLifecycleReason) -> None:
        for conn in list(self.connections):
            conn.agent_lifecycle(dom, state, reason)

    def _release(self, name: str, guest: Guest) -> None:
        """The guest is gone: its address goes back to the pool, but only once its neighbour entry is gone
        (`_forget`), so no new guest takes the address while the kernel still maps it to the old MAC."""
        guest.stop()
        self.guests.pop(name, None)
        if guest.ip is not None:
            self.hyp.forget_vm_ip(name)
            if self.bridge is None:
                self._reuse(guest.ip)
            else:
                task = asyncio.get_running_loop().create_task(self._forget(guest.ip))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    def _reuse(self, ip: str) -> None:
        """`ip` free again, unless a guest holds it meanwhile (a static address is taken, pool or not)."""
        if ip not in self.free_ips and all(g.ip != ip for g in self.guests.values()):
            self.free_ips.insert(0, ip)

    async def _boot(self, dom: Domain, guest: Guest) -> None:
        await asyncio.sleep(self.knobs.boot_delay_s)
        if self.hyp.domains.get(dom.name) is not dom or dom.id == -1:
            return
        seed = self._seed_files(dom)  # read once: each read parses the ISO
        static = self._static_ip(dom, seed)
        if static is not None:
            with contextlib.suppress(ValueError):
                self.free_ips.remove(static)
            guest.ip = static
        elif self.free_ips:
            guest.ip = self.free_ips.pop(0)
        else:
            return
        port = self._proxy_port(seed)
        try:
            guest.server = await proxy.serve(guest.ip, port)
        except OSError:
            guest.server = None  # the address is not local here (no guest network): no proxy, still an IP
        if guest.boot is not None and guest.boot.cancelled():
            guest.stop()
            return
        self.hyp.set_vm_ip(dom.name, guest.ip, agent=self.knobs.agent)
        await self._announce(dom, guest.ip, dhcp=static is None)

    async def _announce(self, dom: Domain, ip: str, *, dhcp: bool = True) -> None:
        """What a real guest's DHCP and first packets leave on a host: a lease, a neighbour entry.

        The entry is `permanent`: a real guest's entry stays fresh because the host forwards the probes
        to it, but a simulated guest's address is local (no ARP traffic), so a `reachable` entry would go
        stale and, past the kernel's gc_thresh2 (512 entries, counted across every namespace of this
        machine, where a fleet of 10 hosts holds 1,000), be collected within seconds. Permanent entries
        are not counted or collected (Linux >= 4.20), as a busy real host's are not."""
        if dhcp and self.leases is not None:
            with self.leases.open("a") as f:
                f.write(f"{int(time.time()) + 3600} {dom.mac} {ip} {dom.name} *\n")
        if self.bridge is not None:
            await self._neighbour(Op.REPLACE, ip, dom.mac)

    async def _forget(self, ip: str) -> None:
        """Delete `ip`'s neighbour entry, then let the address be taken again (also when the kernel
        refused the delete: that is logged, and a pool that never got its address back would shrink)."""
        try:
            if self.bridge is not None:
                await self._neighbour(Op.DELETE, ip)
        finally:
            self._reuse(ip)

    async def _neighbour(self, op: Op, ip: str, mac: str | None = None) -> None:
        """One neighbour entry written or deleted on the bridge. A refusal (the kernel's, or a MAC it could
        not take) is logged naming the command (sim.log in the lab): the guest's address stands without
        it, as a real guest's does when its host's table misses it. A delete that finds no entry is no
        refusal: the guest went before its boot wrote one."""
        assert self.bridge is not None
        try:
            await self.neighbours.apply(Request(op, ip, self.bridge, mac))
        except NeighbourError as exc:
            if not (op is Op.DELETE and exc.errno == errno.ENOENT):
                log.warning("%s", exc)
        except ValueError as exc:
            log.warning("ip neigh %s %s dev %s: %s", op.value, ip, self.bridge, exc)

    async def close(self) -> None:
        """At the daemon's exit (after kill()): the neighbour deletes already due are done, the thread
        that writes them is ended."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self.neighbours.close()

    def _seed_files(self, dom: Domain) -> dict[str, bytes]:
        """The files of the domain's seed ISO (its cdrom), as cloud-init's NoCloud would read them."""
        root = etree.fromstring(dom.xml.encode())
        for disk in root.iterfind("devices/disk"):
            src = disk.find("source")
            vol = self.hyp.volumes.get(src.get("volume", "")) if src is not None else None
            if vol is None or disk.get("device") != "cdrom":
                continue
            with contextlib.suppress(Exception):  # not an ISO we can read: no seed
                return read_seed_iso(bytes(vol.data[0:len(vol.data)])).files
        return {}

    def _proxy_port(self, seed: dict[str, bytes]) -> int:
        """The `Port N` the guest's cloud-init user-data configures (tinyproxy's syntax), else the default."""
        match = _PORT_LINE.search(seed.get("user-data", b""))
        if match and 0 < int(match.group(1)) < 65536:
            return int(match.group(1))
        return self.knobs.default_proxy_port

    def _static_ip(self, dom: Domain, seed: dict[str, bytes]) -> str | None:
        """The IPv4 the seed's network-config (version 2) gives the NIC with this domain's MAC, as
        cloud-init would apply it; None without one (the guest uses DHCP)."""
        return static_address(seed.get("network-config"), mac=dom.mac)

    def agent_command(self, handle: Any, command: str) -> str:
        """The simulated guest agent: `guest-ping`, and `guest-exec` of `systemctl stop qemu-guest-agent`
        (which ends its address reports, as on a real guest); anything else is refused as unknown."""
        dom = self.hyp.domain(handle)
        if dom.id == -1:
            raise invalid("domain is not running")
        if dom.name not in self.hyp.agent_ips:
            raise lv_error(ErrorCode.AGENT_UNRESPONSIVE, "Guest agent is not responding: QEMU guest agent "
                                                         "is not connected")
        try:
            request = json.loads(command)
        except ValueError:
            raise lv_error(ErrorCode.INTERNAL_ERROR, "internal error: unparsable agent command") from None
        execute = request.get("execute") if isinstance(request, dict) else None
        if execute == "guest-ping":
            return '{"return":{}}'
        args = request.get("arguments") or {}
        argv = [str(args.get("path", "")), *map(str, args.get("arg") or [])]
        if execute == "guest-exec" and "stop" in argv and "qemu-guest-agent" in argv:
            self.hyp.agent_stopped(dom.name)
            return '{"return":{"pid":1}}'
        raise lv_error(ErrorCode.INTERNAL_ERROR, f"internal error: unable to execute QEMU agent command "
                                                 f"'{execute}': not simulated")

    def stop_qemu(self, name: str) -> None:
        """The domain's QEMU is stopped (SIGSTOP): it answers nothing on its monitor until continued."""
        self.qemu_stopped.setdefault(name, asyncio.Event())

    def cont_qemu(self, name: str) -> None:
        event = self.qemu_stopped.pop(name, None)
        if event is not None:
            event.set()

    async def monitor(self, name: str) -> None:
        """Returns once the domain's QEMU would answer on its monitor (at once unless it is stopped)."""
        event = self.qemu_stopped.get(name)
        if event is not None:
            await event.wait()

    def crash_guest(self, name: str) -> None:
        """QEMU died: the domain is shut off (reason CRASHED) and its proxy stops."""
        self.hyp.shut_off(name, reason=DOMAIN_SHUTOFF_CRASHED)

    def pause_guest(self, name: str) -> None:
        self.hyp.pause(name)

    # -- what a benchmark counts ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        domains = [{"name": d.name, "state": DomainState(d.state).name.lower(), "reason": d.reason,
                    "persistent": d.persistent, "ip": self.hyp.agent_ips.get(d.name) or
                    (self.guests[d.name].ip if d.name in self.guests else None)}
                   for d in self.hyp.domains.values()]
        volumes = [{"name": v.name, "allocation": v.allocation, "capacity": v.capacity}
                   for v in self.hyp.volumes.values()]
        return {"name": self.hyp.name, "killed": self.killed, "calls": self.calls,
                "errors": dict(self.errors), "connections": len(self.connections),
                "knobs": self.knobs.to_dict(), "domains": domains,
                "volumes": volumes, "pool": {"capacity": self.hyp.pool_capacity,
                                             "available": self.hyp.pool_available()},
                "free_memory": self.hyp.free_memory()}

    # -- control socket ---------------------------------------------------------------------------

    async def control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "state":
            return self.state()
        if op == "set":
            self.knobs.update(dict(request.get("knobs") or {}))
            self.apply_knobs()
            return self.knobs.to_dict()
        if op in ("crash", "pause", "stop", "cont"):
            name = str(request.get("domain"))
            if name not in self.hyp.domains or self.hyp.domains[name].id == -1:
                raise ValueError(f"domain {name!r}: not running on {self.hyp.name}")
            {"crash": self.crash_guest, "pause": self.pause_guest, "stop": self.stop_qemu,
             "cont": self.cont_qemu}[op](name)
            return {}
        if op == "fill_pool":
            self.hyp.outside_usage += self.hyp.pool_available()
            return {}
        if op == "free_pool":
            self.hyp.free_pool_space()
            return {}
        if op == "kill":
            return {"stopped": self.kill()}
        if op == "revive":
            await self.revive()
            return {}
        raise ValueError(f"op {op!r}: unknown (state, set, crash, pause, stop, cont, fill_pool, free_pool, "
                         "kill, revive)")

    async def _control_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    reply = {"ok": True, "result": await self.control(json.loads(line))}
                except (ValueError, TypeError, KeyError) as exc:
                    reply = {"ok": False, "error": str(exc)}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve_control(self, path: str) -> asyncio.Server:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(self._control_client, path)
        os.chmod(path, 0o600)
        return server


def static_address(network_config: bytes | None, *, mac: str) -> str | None:
    """From a cloud-init network-config v2 document: the first IPv4 address of the ethernet matched by
    `mac`, without its prefix length; None when there is none (or the document is not v2 YAML)."""
    if not network_config:
        return None
    try:
        doc = yaml.safe_load(network_config)
    except yaml.YAMLError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != 2 or not isinstance(doc.get("ethernets"), dict):
        return None
    for nic in doc["ethernets"].values():
        match = nic.get("match") if isinstance(nic, dict) else None
        if not isinstance(match, dict) or str(match.get("macaddress", "")).lower() != mac.lower():
            continue
        for addr in nic.get("addresses") or []:
            with contextlib.suppress(ValueError):
                return str(ipaddress.IPv4Interface(str(addr)).ip)
    return None


def make_host(*, name: str, pool_path: str, knobs: Knobs, socket_path: str, guest_network: str | None,
              socket_group: int | None = None) -> SimHost:
    hyp = Hypervisor(name, pool_path=pool_path, volume_files=True, pool_capacity=knobs.pool_capacity_bytes,
                     memory=knobs.memory_bytes)
    Path(pool_path).mkdir(parents=True, exist_ok=True)
    load_pool_dir(hyp)
    return SimHost(hyp, knobs, socket_path=socket_path, guest_network=guest_network,
                   socket_group=socket_group)
