"""The V(5) wire tier's logging: off below V(5) (no tracer at all, so the rpc client traces nothing),
and at V(5) one `libvirt packet` line per record with the header fields only."""

from __future__ import annotations

import io
import json

from egress_kvm import log
from egress_kvm.providers.kvm.calllog import make_tracer
from rpc.trace import Direction, PacketTrace


def test_no_tracer_below_v5() -> None:
    try:
        for level in ("info", "debug", "2", "4"):
            log.configure(level, stream=io.StringIO())
            assert make_tracer(log.get_logger("kvm"), host="h") is None, level
    finally:
        log.configure("info")


def test_one_line_per_record_at_v5() -> None:
    out = io.StringIO()
    log.configure("5", stream=out)
    try:
        tracer = make_tracer(log.get_logger("kvm").with_values(provider="p"), host="h")
        assert tracer is not None
        tracer(PacketTrace(Direction.OUT, "REMOTE", 1, "DOMAIN_DEFINE_XML", "CALL", 7, "OK", 412))
        tracer(
            PacketTrace(Direction.IN, "REMOTE", 1, "STORAGE_VOL_DOWNLOAD", "STREAM", 9, "CONTINUE", 9000, 40)
        )
    finally:
        log.configure("info")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [ln["msg"] for ln in lines] == ["libvirt packet", "libvirt packet"]
    first, second = lines
    assert first["logger"] == "kvm.libvirt" and first["level"] == "Level(-5)"
    assert (first["provider"], first["host"]) == ("p", "h")
    assert {
        k: first[k] for k in ("direction", "program", "version", "procedure", "type", "serial", "status")
    } == {
        "direction": "out",
        "program": "REMOTE",
        "version": 1,
        "procedure": "DOMAIN_DEFINE_XML",
        "type": "CALL",
        "serial": 7,
        "status": "OK",
    }
    assert first["length"] == 412 and "packets" not in first
    assert second["packets"] == 40 and second["length"] == 9000
