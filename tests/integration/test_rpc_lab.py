"""rpc against a real libvirtd (the lab host's, own config/pid file/socket group) through a real sshd with
key auth and known_hosts checked, as the non-root `virt` user in group libvirt; and through the unix
socket directly. Results are compared with what `virsh` on the host reports for the same objects."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import uuid
from pathlib import Path

import pytest
import rpc_lab as L

import rpc
from rpc.constants import (
    DOMAIN_AFFECT_CONFIG,
    DOMAIN_METADATA_ELEMENT,
    DOMAIN_XML_INACTIVE,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

META_URI = "https://egress-kvm.example/rpctest"


@pytest.fixture
async def client(lab_host):  # type: ignore[no-untyped-def]
    c = await L.connect_ssh(lab_host)
    yield c
    await c.close()


# -- connection-level calls ---------------------------------------------------------------------------


async def test_connection_facts_match_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    version = L.virsh(lab_host, "version")
    lib = re.search(r"Using library: libvirt (\d+)\.(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    hv = re.search(r"Running hypervisor: QEMU (\d+)\.(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    assert await client.connect_get_lib_version() == int(lib[0]) * 1000000 + int(lib[1]) * 1000 + int(lib[2])
    assert await client.connect_get_version() == int(hv[0]) * 1000000 + int(hv[1]) * 1000 + int(hv[2])
    assert await client.connect_get_hostname() == L.virsh(lab_host, "hostname").strip()
    assert await client.connect_get_uri() == L.virsh(lab_host, "uri").strip() == "qemu:///system"
    assert await client.connect_get_type() == "QEMU"
    assert await client.connect_supports_feature(10) == 1
    assert await client.auth_list() == (rpc.AuthType.NONE,)  # the lab's socket: auth_unix_rw = "none"
    assert client.keepalive_interval == 5.0


async def test_node_info_and_free_memory_match_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    text = L.virsh(lab_host, "nodeinfo")
    field = {
        k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)
    }
    info = await client.node_get_info()
    assert info.model == field["CPU model"]
    assert info.cpus == int(field["CPU(s)"])
    assert info.mhz == int(field["CPU frequency"].split()[0])
    assert info.sockets == int(field["CPU socket(s)"])
    assert info.cores == int(field["Core(s) per socket"])
    assert info.threads == int(field["Thread(s) per core"])
    assert info.nodes == int(field["NUMA cell(s)"])
    assert info.memory == int(field["Memory size"].split()[0])
    # Free memory moves (the machine is shared): our value (bytes) must lie between two `virsh freecell
    # --all` readings (KiB) taken around it, give or take 64 MiB.
    before = free_kib(L.virsh(lab_host, "freecell", "--all"))
    free = await client.node_get_free_memory()
    after = free_kib(L.virsh(lab_host, "freecell", "--all"))
    slack = 64 << 20
    low, high = min(before, after) * 1024 - slack, max(before, after) * 1024 + slack
    assert low <= free <= high, (before, free, after)
    assert 0 < free <= info.memory * 1024


def free_kib(text: str) -> int:
    """`virsh freecell --all`: one "N: X KiB" line per NUMA cell, and a "Total: X KiB" line if several."""
    cells = {k: int(v.split()[0]) for k, v in L.fields(text).items()}
    return cells["Total"] if "Total" in cells else sum(cells.values())


def pool_fields(lab_host, pool: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return L.fields(L.virsh(lab_host, "pool-info", pool, "--bytes"))


async def test_storage_pool_calls_match_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    pool = await client.storage_pool_lookup_by_name(h.pool)
    text = L.virsh(lab_host, "pool-info", h.pool, "--bytes")
    field = {
        k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)
    }
    assert pool.name == h.pool and pool.uuid_str == field["UUID"]
    await client.storage_pool_refresh(pool)
    info = await client.storage_pool_get_info(pool)
    assert info.state == rpc.StoragePoolState.RUNNING and field["State"] == "running"
    assert info.capacity == int(field["Capacity"].split()[0])
    assert info.allocation + info.available <= info.capacity
    # allocation/available are the filesystem's, which other work on this machine moves: bracket ours
    # between two virsh readings, give or take 256 MiB.
    after = pool_fields(lab_host, h.pool)
    slack = 256 << 20
    for name in ("allocation", "available"):
        a, b = int(field[name.capitalize()]), int(after[name.capitalize()])
        ours = getattr(info, name)
        assert min(a, b) - slack <= ours <= max(a, b) + slack, (name, a, ours, b)
    pools = await client.connect_list_all_storage_pools()
    assert {p.name for p in pools.pools} == set(L.virsh(lab_host, "pool-list", "--all", "--name").split())
    assert pools.ret == len(pools.pools)
    with pytest.raises(rpc.NotFoundError) as ei:
        await client.storage_pool_lookup_by_name("no-such-pool")
    assert ei.value.code_name == "NO_STORAGE_POOL"


# -- domains ------------------------------------------------------------------------------------------


async def test_domain_lifecycle_with_events_and_virsh_agreeing(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("dom")
    try:
        async with client.lifecycle_events() as events:
            dom = await client.domain_define_xml(L.domain_xml(name))
            assert dom.name == name and dom.id == -1
            assert dom.uuid_str == L.virsh(lab_host, "domuuid", name).strip()
            assert await client.domain_lookup_by_name(name) == dom
            assert await client.domain_lookup_by_uuid(dom.uuid) == dom
            assert await client.domain_is_active(dom) == 0
            state = await client.domain_get_state(dom)
            assert state.state == rpc.DomainState.SHUTOFF
            assert L.virsh(lab_host, "domstate", name).strip() == "shut off"

            running = await client.domain_create_with_flags(dom)
            assert running.id > 0 and running.uuid == dom.uuid
            assert L.virsh(lab_host, "domid", name).strip() == str(running.id)
            assert (await client.domain_get_state(dom)).state == rpc.DomainState.RUNNING
            assert await client.domain_is_active(dom) == 1
            assert (await client.domain_get_xml_desc(dom)).strip() == L.virsh(
                lab_host, "dumpxml", name
            ).strip()
            inactive = await client.domain_get_xml_desc(dom, DOMAIN_XML_INACTIVE)
            assert inactive.strip() == L.virsh(lab_host, "dumpxml", name, "--inactive").strip()

            listed = await client.connect_list_all_domains()
            assert name in {d.name for d in listed.domains}
            assert {d.name for d in listed.domains} == set(
                L.virsh(lab_host, "list", "--all", "--name").split()
            )
            active = await client.connect_list_all_domains(1, 1)  # ACTIVE
            assert name in {d.name for d in active.domains}
            count_only = await client.connect_list_all_domains(0)
            assert count_only.domains == () and count_only.ret == listed.ret

            await client.domain_destroy(dom)
            assert L.virsh(lab_host, "domstate", name).strip() == "shut off"
            await client.domain_create(dom)
            assert L.virsh(lab_host, "domstate", name).strip() == "running"
            await client.domain_shutdown_flags(dom)  # ACPI request: accepted even though nothing listens
            assert L.virsh(lab_host, "domstate", name).strip() == "running"  # no OS: nobody obeys it
            assert (await client.domain_get_state(dom)).state == rpc.DomainState.RUNNING
            await client.domain_destroy_flags(dom, 0)
            assert L.virsh(lab_host, "domstate", name).strip() == "shut off"
            assert name in L.virsh(lab_host, "list", "--all", "--name").split()
            await client.domain_undefine_flags(dom, 0)
            assert name not in L.virsh(lab_host, "list", "--all", "--name").split()

            got = []
            while rpc.DomainEventType.UNDEFINED not in got:
                ev = await asyncio.wait_for(events.__anext__(), 30)
                if ev.dom.name == name:
                    got.append(rpc.DomainEventType(ev.event))
        E = rpc.DomainEventType
        # libvirt also reports RESUMED (QEMU starts paused) and SHUTDOWN around these; the ones the
        # operator acts on must all arrive, in this order.
        key = [e for e in got if e not in (E.RESUMED, E.SHUTDOWN, E.SUSPENDED)]
        assert key == [E.DEFINED, E.STARTED, E.STOPPED, E.STARTED, E.STOPPED, E.UNDEFINED], got
        with pytest.raises(rpc.NotFoundError) as ei:
            await client.domain_lookup_by_name(name)
        assert (ei.value.code, ei.value.code_name) == (42, "NO_DOMAIN")
    finally:
        L.remove_domain(lab_host, name)


async def test_domain_events_for_one_domain_only(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    mine, other = L.unique("ev"), L.unique("other")
    try:
        dom = await client.domain_define_xml_flags(L.domain_xml(mine), 0)
        async with client.lifecycle_events(dom) as events:
            await client.domain_define_xml(L.domain_xml(other))  # must not show up here
            await client.domain_create(dom)
            seen = [await asyncio.wait_for(events.__anext__(), 30)]
            while seen[-1].event != rpc.DomainEventType.STARTED:
                seen.append(await asyncio.wait_for(events.__anext__(), 30))
            await client.domain_destroy(dom)
            while seen[-1].event != rpc.DomainEventType.STOPPED:
                seen.append(await asyncio.wait_for(events.__anext__(), 30))
            assert seen[-1].detail == 1  # DESTROYED
            assert {ev.dom.name for ev in seen} == {mine}
            assert {ev.callback_id for ev in seen} == {events.callback_id}
        await client.domain_undefine(dom)
    finally:
        L.remove_domain(lab_host, mine)
        L.remove_domain(lab_host, other)


async def test_typical_domain_errors(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("err")
    try:
        dom = await client.domain_define_xml(L.domain_xml(name, agent=True, nic=True))
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_destroy(dom)  # not running
        assert (ei.value.code, ei.value.code_name) == (55, "OPERATION_INVALID")
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_get_metadata(dom, DOMAIN_METADATA_ELEMENT, META_URI)
        assert (ei.value.code, ei.value.code_name) == (80, "NO_DOMAIN_METADATA")
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_define_xml(L.domain_xml(name, dom_uuid=str(uuid.uuid4())))
        assert (ei.value.code, ei.value.code_name) == (9, "OPERATION_FAILED")
        assert "already exists" in ei.value.message

        await client.domain_create(dom)
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_create(dom)  # already running
        assert (ei.value.code, ei.value.code_name) == (55, "OPERATION_INVALID")
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_interface_addresses(dom, rpc.InterfaceAddressesSource.AGENT)
        assert (ei.value.code, ei.value.code_name) == (86, "AGENT_UNRESPONSIVE")
        ifaces = await client.domain_interface_addresses(dom, rpc.InterfaceAddressesSource.LEASE)
        assert ifaces == ()  # br0 is not a libvirt-managed network: no leases to report
        assert L.virsh(lab_host, "domifaddr", name, "--source", "lease").strip() == ""  # virsh agrees
        await client.domain_destroy(dom)
        await client.domain_undefine(dom)
    finally:
        L.remove_domain(lab_host, name)


async def test_domain_metadata_round_trip_matches_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("meta")
    try:
        dom = await client.domain_define_xml(L.domain_xml(name))
        element = "<proxy><owner>ns/p1</owner></proxy>"
        await client.domain_set_metadata(
            dom, DOMAIN_METADATA_ELEMENT, element, "ekvm", META_URI, DOMAIN_AFFECT_CONFIG
        )
        got = await client.domain_get_metadata(dom, DOMAIN_METADATA_ELEMENT, META_URI, DOMAIN_AFFECT_CONFIG)
        assert "<owner>ns/p1</owner>" in got
        assert got.strip() == L.virsh(lab_host, "metadata", name, META_URI, "--config").strip()
        await client.domain_set_metadata(
            dom, DOMAIN_METADATA_ELEMENT, None, None, META_URI, DOMAIN_AFFECT_CONFIG
        )
        with pytest.raises(rpc.LibvirtError) as ei:
            await client.domain_get_metadata(dom, DOMAIN_METADATA_ELEMENT, META_URI, DOMAIN_AFFECT_CONFIG)
        assert ei.value.code_name == "NO_DOMAIN_METADATA"
        await client.domain_undefine(dom)
    finally:
        L.remove_domain(lab_host, name)


# -- volumes ------------------------------------------------------------------------------------------


async def test_volume_calls_match_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    name, clone = L.unique("vol") + ".qcow2", L.unique("clone") + ".qcow2"
    try:
        pool = await client.storage_pool_lookup_by_name(h.pool)
        vol = await client.storage_vol_create_xml(pool, L.vol_xml(name, capacity=1 << 20, fmt="qcow2"))
        assert (vol.pool, vol.name) == (h.pool, name)
        assert await client.storage_vol_lookup_by_name(pool, name) == vol
        path = await client.storage_vol_get_path(vol)
        assert path == L.virsh(lab_host, "vol-path", "--pool", h.pool, name).strip() == vol.key
        text = L.virsh(lab_host, "vol-info", "--pool", h.pool, name, "--bytes")
        field = {
            k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)
        }
        info = await client.storage_vol_get_info(vol)
        assert info.type_ == rpc.StorageVolType.FILE and field["Type"] == "file"
        assert info.capacity == int(field["Capacity"].split()[0]) == 1 << 20
        assert info.allocation == int(field["Allocation"].split()[0])
        assert await client.storage_vol_get_info_flags(vol, 0) == info
        xml = await client.storage_vol_get_xml_desc(vol)
        assert xml.strip() == L.virsh(lab_host, "vol-dumpxml", "--pool", h.pool, name).strip()
        assert "<format type='qcow2'/>" in xml

        with pytest.raises(rpc.LibvirtError) as ei:
            await client.storage_vol_create_xml(pool, L.vol_xml(name, capacity=1 << 20, fmt="qcow2"))
        assert (ei.value.code, ei.value.code_name) == (90, "STORAGE_VOL_EXIST")

        await client.storage_vol_resize(vol, 2 << 20)
        assert (await client.storage_vol_get_info(vol)).capacity == 2 << 20
        assert vol_fields(lab_host, h.pool, name)["Capacity"] == str(2 << 20)
        copy = await client.storage_vol_create_xml_from(
            pool, L.vol_xml(clone, capacity=2 << 20, fmt="qcow2"), vol
        )
        assert (copy.pool, copy.name) == (h.pool, clone)
        assert copy.key == L.virsh(lab_host, "vol-path", "--pool", h.pool, clone).strip()
        cinfo = await client.storage_vol_get_info(copy)
        cfield = vol_fields(lab_host, h.pool, clone)
        assert (cinfo.capacity, cinfo.allocation) == (int(cfield["Capacity"]), int(cfield["Allocation"]))
        assert cinfo.capacity == 2 << 20
        assert "<format type='qcow2'/>" in L.virsh(lab_host, "vol-dumpxml", "--pool", h.pool, clone)
        same = L.lab.host_run(lab_host, L.HOST, ["qemu-img", "compare", vol.key, copy.key], check=False)
        assert same.returncode == 0, same.stdout + same.stderr  # the clone holds the source's content
        listed = await client.storage_pool_list_all_volumes(pool)
        assert {v.name for v in listed.vols} >= {name, clone}
        assert {v.name for v in listed.vols} == {
            line.split()[0]
            for line in L.virsh(lab_host, "vol-list", "--pool", h.pool).splitlines()
            if line.strip()
        }
        await client.storage_vol_delete(copy)
        await client.storage_vol_delete(vol, 0)
        listing = L.virsh(lab_host, "vol-list", "--pool", h.pool)
        left = {line.split()[0] for line in listing.splitlines() if line.strip()}
        assert name not in left and clone not in left
        with pytest.raises(rpc.NotFoundError) as ei:
            await client.storage_vol_lookup_by_name(pool, name)
        assert (ei.value.code, ei.value.code_name) == (50, "NO_STORAGE_VOL")
    finally:
        L.remove_volume(lab_host, name)
        L.remove_volume(lab_host, clone)


async def test_64mib_random_upload_reads_back_byte_for_byte(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    name = L.unique("up") + ".raw"
    data = os.urandom(64 << 20)
    try:
        pool = await client.storage_pool_lookup_by_name(h.pool)
        vol = await client.storage_vol_create_xml(pool, L.vol_xml(name, capacity=len(data)))
        assert await client.storage_vol_upload(vol, 0, len(data), 0, data) == len(data)
        on_disk = await asyncio.to_thread(Path(h.pool_dir, name).read_bytes)
        assert hashlib.sha256(on_disk).digest() == hashlib.sha256(data).digest()
        back = bytearray()
        async for chunk in client.storage_vol_download(vol, 0, 0):
            back += chunk
        assert len(back) == len(data) and bytes(back) == data
        # a piece in the middle, by offset and length
        part = await client.storage_vol_download(vol, 1 << 20, 4096).read_all()
        assert part == data[1 << 20 : (1 << 20) + 4096]
        await client.storage_vol_delete(vol)
    finally:
        L.remove_volume(lab_host, name)


async def test_upload_from_an_async_iterable_over_unix(lab_host) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    name = L.unique("iter") + ".raw"
    pieces = [os.urandom(100_000) for _ in range(30)]
    try:
        async with await rpc.connect_unix(L.unix_socket_path(lab_host)) as client:
            pool = await client.storage_pool_lookup_by_name(h.pool)
            vol = await client.storage_vol_create_xml(pool, L.vol_xml(name, capacity=3_000_000))

            async def source():  # type: ignore[no-untyped-def]
                for p in pieces:
                    yield p

            assert await client.storage_vol_upload(vol, 0, 0, 0, source()) == 3_000_000
            assert await asyncio.to_thread(Path(h.pool_dir, name).read_bytes) == b"".join(pieces)
            await client.storage_vol_delete(vol)
    finally:
        L.remove_volume(lab_host, name)


async def test_upload_to_a_missing_volume_fails_cleanly(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    ghost = rpc.StorageVol(h.pool, "rpctest-does-not-exist", "x")
    with pytest.raises(rpc.NotFoundError):
        await client.storage_vol_upload(ghost, 0, 0, 0, b"abc")
    with pytest.raises(rpc.NotFoundError):
        await client.storage_vol_download(ghost, 0, 0).read_all()
    assert client.protocol.streams == {} and await client.connect_get_lib_version() > 0


def vol_fields(lab_host, pool: str, name: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    got = L.fields(L.virsh(lab_host, "vol-info", "--pool", pool, name, "--bytes"))
    return {k: v.split()[0] if k in ("Capacity", "Allocation") else v for k, v in got.items()}


# -- transports ---------------------------------------------------------------------------------------


async def test_read_only_connect_open_is_refused_writes(lab_host) -> None:  # type: ignore[no-untyped-def]
    """CONNECT_OPEN with flags=1 (VIR_CONNECT_RO): reads work, the daemon refuses writes as virsh -r does."""
    name = L.unique("ro")
    async with await L.connect_ssh(lab_host, readonly=True) as ro:
        assert await ro.connect_get_hostname() == L.virsh(lab_host, "hostname").strip()
        with pytest.raises(rpc.LibvirtError) as ei:
            await ro.domain_define_xml(L.domain_xml(name))
        assert (ei.value.code, ei.value.code_name) == (29, "OPERATION_DENIED")
        assert "read only" in ei.value.message
    assert name not in L.virsh(lab_host, "list", "--all", "--name").split()


async def test_client_from_connect_ssh_closes_its_ssh_connection(lab_host, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """connect_ssh owns its SSH connection: close() closes it, and the sshd session process goes away."""
    import rpc.transport

    opened = []
    real_open_ssh = rpc.transport.open_ssh

    async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        conn = await real_open_ssh(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(rpc.transport, "open_ssh", spy)
    before = L.owned_ssh_pids(lab_host)
    client = await L.connect_ssh(lab_host)
    sessions = L.owned_ssh_pids(lab_host) - before
    assert sessions, "no sshd session process for our connection"
    assert await client.connect_get_lib_version() > 0
    await client.close()
    (ssh_conn,) = opened
    await asyncio.wait_for(ssh_conn.wait_closed(), 10)
    assert ssh_conn.is_closed()
    for pid in sessions:
        await asyncio.to_thread(L.wait_gone, pid)


async def test_unix_socket_as_root_sees_the_same_daemon(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    async with await rpc.connect_unix(L.unix_socket_path(lab_host)) as direct:
        assert await direct.connect_get_hostname() == await client.connect_get_hostname()
        pool_a = await direct.storage_pool_lookup_by_name(L.host(lab_host).pool)
        pool_b = await client.storage_pool_lookup_by_name(L.host(lab_host).pool)
        assert pool_a == pool_b


async def test_one_ssh_connection_carries_many_clients(lab_host) -> None:  # type: ignore[no-untyped-def]
    kw = L.ssh_kwargs(lab_host)
    ssh = await rpc.open_ssh(
        L.host(lab_host).ip, kw["port"], username=kw["username"], client_keys=kw["client_keys"],
        known_hosts=kw["known_hosts"],
    )  # fmt: skip
    try:
        a = await rpc.connect_over(ssh, socket_path=kw["socket_path"])
        b = await rpc.connect_over(ssh, socket_path=kw["socket_path"])
        va, vb = await asyncio.gather(a.connect_get_lib_version(), b.connect_get_lib_version())
        assert va == vb
        await a.close()
        assert not a.is_connected and b.is_connected
        assert await b.connect_get_hostname()  # the shared SSH connection is still up
        await b.close()
        async with await rpc.connect_over(ssh, socket_path=kw["socket_path"]) as c:
            assert await c.connect_get_uri() == "qemu:///system"
    finally:
        ssh.close()
        await ssh.wait_closed()


async def test_many_calls_in_flight_over_ssh(client: rpc.Client) -> None:
    results = await asyncio.gather(*[client.connect_get_lib_version() for _ in range(200)])
    assert len(set(results)) == 1


async def test_observer_records_real_calls(lab_host) -> None:  # type: ignore[no-untyped-def]
    records: list[rpc.CallRecord] = []
    async with await L.connect_ssh(lab_host, observer=records.append) as c:
        with pytest.raises(rpc.NotFoundError):
            await c.domain_lookup_by_name("rpctest-nope")
    methods = [r.method for r in records]
    assert methods == [
        "auth_list",
        "connect_supports_feature",
        "connect_open",
        "domain_lookup_by_name",
        "connect_close",
    ]
    miss = records[3]
    assert miss.identifiers == {"domain": "rpctest-nope"} and miss.libvirt_error.code_name == "NO_DOMAIN"  # type: ignore[union-attr]


async def test_unknown_host_and_changed_host_key_are_refused(lab_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(rpc.HostKeyRejected, match="host key not accepted"):
        await L.connect_ssh(lab_host, known_hosts=str(empty))
    L.keygen(tmp_path / "other")
    forged = tmp_path / "forged_known_hosts"
    forged.write_text(f"{h.ip} {(tmp_path / 'other.pub').read_text().split(' ', 2)[0]} "
                      f"{(tmp_path / 'other.pub').read_text().split(' ', 2)[1]}\n")  # fmt: skip
    with pytest.raises(rpc.HostKeyRejected):
        await L.connect_ssh(lab_host, known_hosts=str(forged))
    # the explicit insecure opt-out connects without checking
    async with await L.connect_ssh(lab_host, known_hosts=None) as c:
        assert await c.connect_get_lib_version() > 0


async def test_wrong_client_key_is_a_clear_connect_failure(lab_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    L.keygen(tmp_path / "k")
    with pytest.raises(rpc.ConnectFailed, match="authentication failed for user 'virt'"):
        await L.connect_ssh(lab_host, client_keys=[str(tmp_path / "k")])


async def test_raw_event_registration_and_connect_close(lab_host) -> None:  # type: ignore[no-untyped-def]
    client = await L.connect_ssh(lab_host)
    try:
        cb = await client.connect_domain_event_callback_register_any(rpc.DomainEventID.LIFECYCLE)
        assert isinstance(cb, int)
        await client.connect_domain_event_callback_deregister_any(cb)
        with pytest.raises(rpc.LibvirtError):
            await client.connect_domain_event_callback_deregister_any(cb)  # already gone
        await client.connect_close()  # the daemon answers, then hangs up
        with pytest.raises(rpc.ConnectionLost):
            for _ in range(100):
                await client.connect_get_lib_version()
                await asyncio.sleep(0.05)
    finally:
        await client.close()
