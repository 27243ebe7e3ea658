"""The V(5) raw wire trace against the lab's real libvirtd over real SSH, formatted by the operator's own
logger (`--zap-log-level=5`): one line per packet with header fields, stream data summarised, and the
payload (here a cloud-init marker in an upload and in a domain's XML) never in the log."""

from __future__ import annotations

import io
import json
import os
import uuid

import pytest
import rpc_lab as L

import rpc
from egress_kvm import log
from egress_kvm.providers.kvm.calllog import make_tracer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MARKER = "#cloud-config egress-wire-trace-marker-5f1e"


async def test_v5_traces_every_packet_over_ssh_and_never_the_payload(lab_host) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    out = io.StringIO()
    log.configure("5", stream=out)
    name = L.unique("trace") + ".raw"
    data = (MARKER.encode() + os.urandom(1000)) * 2000  # ~2 MiB: about 8 stream packets
    dom_name = L.unique("trace")
    try:
        tracer = make_tracer(log.get_logger("kvm"), host=h.name)
        assert tracer is not None
        async with await L.connect_ssh(lab_host, tracer=tracer) as client:
            pool = await client.storage_pool_lookup_by_name(h.pool)
            vol = await client.storage_vol_create_xml(pool, L.vol_xml(name, capacity=len(data)))
            assert await client.storage_vol_upload(vol, 0, len(data), 0, data) == len(data)
            assert await client.storage_vol_download(vol, 0, 0).read_all() == data
            xml = (
                f"<domain type='qemu'><name>{dom_name}</name><uuid>{uuid.uuid4()}</uuid>"
                f"<memory>65536</memory><description>{MARKER}</description><os><type>hvm</type></os></domain>"
            )
            dom = await client.domain_define_xml(xml)
            await client.domain_undefine(dom)
            await client.storage_vol_delete(vol)
    finally:
        log.configure("info")
        L.remove_volume(lab_host, name)
    text = out.getvalue()
    assert MARKER not in text and "egress-wire-trace" not in text
    lines = [json.loads(x) for x in text.splitlines()]
    packets = [r for r in lines if r["msg"] == "libvirt packet"]
    assert all(
        r["logger"] == "kvm.libvirt" and r["level"] == "Level(-5)" and r["host"] == h.name for r in packets
    )
    keys = {"direction", "program", "version", "procedure", "type", "serial", "status", "length"}
    assert all(keys <= r.keys() for r in packets)
    calls = [(r["procedure"], r["type"]) for r in packets if r["direction"] == "out" and r["type"] == "CALL"]
    replies = [
        (r["procedure"], r["type"]) for r in packets if r["direction"] == "in" and r["type"] == "REPLY"
    ]
    assert ("DOMAIN_DEFINE_XML", "CALL") in calls and ("STORAGE_VOL_UPLOAD", "CALL") in calls
    assert len(replies) == len(calls)  # every call (CONNECT_CLOSE included) traced both ways
    define = next(r for r in packets if r["procedure"] == "DOMAIN_DEFINE_XML" and r["type"] == "CALL")
    assert define["length"] > len(MARKER) and define["status"] == "OK"
    data_lines = [r for r in packets if r["type"] == "STREAM" and r.get("packets", 1) > 1]
    up = [r for r in data_lines if r["procedure"] == "STORAGE_VOL_UPLOAD" and r["direction"] == "out"]
    down = [r for r in data_lines if r["procedure"] == "STORAGE_VOL_DOWNLOAD" and r["direction"] == "in"]
    assert len(up) == 1 and up[0]["length"] >= len(data) and up[0]["packets"] >= len(data) // 262120
    assert len(down) == 1 and down[0]["length"] >= len(data)
    assert len(packets) < 60  # summarised: not one line per data packet


async def test_sparse_streams_are_refused_before_the_call(lab_host) -> None:  # type: ignore[no-untyped-def]
    h = L.host(lab_host)
    async with await L.connect_ssh(lab_host) as client:
        vol = rpc.StorageVol(h.pool, "rpctest-never-created", "x")
        sent = client.protocol.pending
        with pytest.raises(ValueError, match="sparse stream"):
            await client.storage_vol_upload(vol, 0, 0, 1, b"abc")
        with pytest.raises(ValueError, match="sparse stream"):
            client.storage_vol_download(vol, 0, 0, 1)
        assert client.protocol.pending == sent and client.is_connected
        assert await client.connect_get_lib_version() > 0
