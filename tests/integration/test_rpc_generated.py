"""Generated methods the provider does not use, against the lab's real libvirtd, compared with virsh.

The point is the shapes the hand-written table never had: typed parameters (an XDR union decoded from
the daemon's own bytes: int, unsigned int and unsigned long long arms), an `unsigned short` and an
`unsigned char` field, the `two calls` nparams convention, and a list of structs holding such lists.
"""

from __future__ import annotations

import pytest
import rpc_lab as L

import rpc
from rpc.protocol_constants import VIR_TYPED_PARAM_INT, VIR_TYPED_PARAM_UINT, VIR_TYPED_PARAM_ULLONG

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# virDomainStatsTypes (libvirt-domain.h)
STATS_STATE, STATS_CPU_TOTAL, STATS_BALLOON, STATS_VCPU = 1, 2, 4, 8


@pytest.fixture
async def client(lab_host):  # type: ignore[no-untyped-def]
    c = await L.connect_ssh(lab_host)
    yield c
    await c.close()


async def test_capabilities_match_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    caps = await client.connect_get_capabilities()
    assert caps.strip() == L.virsh(lab_host, "capabilities").strip()
    assert "<capabilities>" in caps


async def test_node_cpu_stats_take_two_calls_like_virsh(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    first = await client.node_get_cpu_stats(-1, 0)  # nparams 0: how many there are
    assert first.params == () and first.nparams > 0
    stats = await client.node_get_cpu_stats(-1, first.nparams)
    assert len(stats.params) == first.nparams  # (nparams is only filled in when asked with 0)
    ours = {p.field for p in stats.params}
    assert all(p.value > 0 for p in stats.params if p.field in ("kernel", "user", "idle"))
    text = L.virsh(lab_host, "nodecpustats")
    virsh = {line.split(":")[0].strip() for line in text.splitlines() if ":" in line}
    assert {"system" if f == "kernel" else f for f in ours} == virsh  # virsh prints kernel as "system"


async def test_domain_info_and_all_domain_stats_of_a_running_domain(lab_host, client: rpc.Client) -> None:  # type: ignore[no-untyped-def]
    name = L.unique("gen")
    try:
        dom = await client.domain_define_xml(L.domain_xml(name))
        dom = await client.domain_create_with_flags(dom)
        info = await client.domain_get_info(dom)
        fields = L.fields(L.virsh(lab_host, "dominfo", name))
        assert info.state == rpc.DomainState.RUNNING and fields["State"] == "running"
        assert info.max_mem == int(fields["Max memory"].split()[0]) == 32 * 1024
        assert info.nr_virt_cpu == int(fields["CPU(s)"]) == 1
        assert info.cpu_time >= 0

        records = await client.connect_get_all_domain_stats(
            (dom,), STATS_STATE | STATS_CPU_TOTAL | STATS_BALLOON | STATS_VCPU
        )
        [record] = records
        assert record.dom.uuid == dom.uuid
        params = {p.field: p.value for p in record.params}
        virsh = dict(
            line.strip().split("=", 1)
            for line in L.virsh(lab_host, "domstats", "--state", "--balloon", "--vcpu", name).splitlines()
            if "=" in line
        )
        # stable values agree with virsh's own call, each through the union arm virsh printed
        for key, arm in (
            ("state.state", VIR_TYPED_PARAM_INT),
            ("state.reason", VIR_TYPED_PARAM_INT),
            ("balloon.maximum", VIR_TYPED_PARAM_ULLONG),
            ("vcpu.current", VIR_TYPED_PARAM_UINT),
            ("vcpu.maximum", VIR_TYPED_PARAM_UINT),
        ):
            assert params[key].type_ == arm, key
            assert params[key].value == int(virsh[key]), key
        assert params["state.state"].value == rpc.DomainState.RUNNING
        assert params["cpu.time"].type_ == VIR_TYPED_PARAM_ULLONG and params["cpu.time"].value > 0
        # the daemon's whole key set for these groups is what virsh shows (cpu.* was not asked of virsh)
        assert {k for k in params if not k.startswith("cpu.")} == set(virsh)
    finally:
        L.remove_domain(lab_host, name)
