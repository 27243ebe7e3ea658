"""The lab's names and addresses: derived from the index alone, distinct across labs, inside 10.231/16."""

import ipaddress
import itertools

import pytest

from testbed.lab.layout import (
    LAB_SUPERNET,
    MAX_HOSTS,
    MAX_INDEX,
    LabLayout,
    default_state_dir,
    selftest_index,
)


def test_lab0_host0_matches_the_documented_plan():
    h = LabLayout.make(index=0, hosts=1).host(0)
    assert (h.root_ip, h.ip) == ("10.231.0.1", "10.231.0.2")
    assert (h.gateway, h.lan_cidr) == ("10.231.1.1", "10.231.1.0/24")
    assert h.dhcp_range == ("10.231.1.100", "10.231.1.199")


def test_lab3_host1_addresses():
    h = LabLayout.make(index=3, hosts=2).host(1)
    assert h.link_cidr == "10.231.50.0/24"
    assert h.ip == "10.231.50.2"
    assert h.lan_cidr == "10.231.51.0/24"
    assert h.gateway == "10.231.51.1"


def test_every_slot_is_distinct_and_inside_the_lab_range():
    nets, names = [], []
    for index, number in itertools.product(range(MAX_INDEX + 1), range(MAX_HOSTS)):
        h = LabLayout.make(index=index, hosts=MAX_HOSTS).host(number)
        for cidr in (h.link_cidr, h.lan_cidr):
            net = ipaddress.IPv4Network(cidr)
            assert net.subnet_of(LAB_SUPERNET)
            nets.append(net)
        for ip in (h.ip, h.root_ip, h.gateway, *h.dhcp_range):
            assert ipaddress.IPv4Address(ip) in ipaddress.IPv4Network(h.link_cidr if ip in (h.ip, h.root_ip)
                                                                      else h.lan_cidr)
        names += [h.netns, h.veth_root, h.veth_host]
        assert all(len(n) <= 15 for n in (h.veth_root, h.veth_host))  # IFNAMSIZ
    assert len(set(nets)) == len(nets)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(nets, 2))
    assert len(set(names)) == len(names)


def test_default_state_dir_and_paths():
    lab = LabLayout.make(index=2, hosts=1)
    assert lab.state_dir == default_state_dir(2)
    assert str(lab.state_dir) == "/var/tmp/egress-kvm-lab/lab2"
    assert lab.host(0).dir == lab.state_dir / "host0"
    assert lab.authorized_keys_name.endswith("lab2")


@pytest.mark.parametrize("index", [-1, 8, "1", True, 1.0])
def test_bad_index_is_rejected_naming_it(index):
    with pytest.raises(ValueError, match=r"lab index: .* 0\.\.7"):
        LabLayout.make(index=index, hosts=1)


@pytest.mark.parametrize("hosts", [0, 9, "2"])
def test_bad_host_count_is_rejected_naming_it(hosts):
    with pytest.raises(ValueError, match=r"lab hosts: .* 1\.\.8"):
        LabLayout.make(index=0, hosts=hosts)


def test_simulated_hosts_live_beside_the_real_lab_in_their_own_range():
    from testbed.lab.layout import MAX_SIM_HOSTS, SIM_SUPERNET

    h = LabLayout.make(index=3, hosts=10, simulated=True).host(9)
    assert (h.netns, h.veth_root) == ("ekvm3s9", "ekvm3s9c")
    assert (h.ip, h.lan_cidr, h.gateway) == ("10.232.114.2", "10.232.115.0/24", "10.232.115.1")
    assert (h.hypervisor, h.sim_control.name) == ("libvirt-sim", "sim.sock")
    assert default_state_dir(3, simulated=True).name == "lab3-sim"
    nets, names = [], []
    for index, number in itertools.product(range(MAX_INDEX + 1), range(MAX_SIM_HOSTS)):
        s = LabLayout.make(index=index, hosts=MAX_SIM_HOSTS, simulated=True).host(number)
        nets += [ipaddress.IPv4Network(s.link_cidr), ipaddress.IPv4Network(s.lan_cidr)]
        names += [s.netns, s.veth_root, s.veth_host]
        assert all(len(n) <= 15 for n in (s.veth_root, s.veth_host))
        real = LabLayout.make(index=index, hosts=MAX_HOSTS).host(number % MAX_HOSTS)
        assert s.netns != real.netns
    assert all(n.subnet_of(SIM_SUPERNET) for n in nets)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(nets, 2))
    assert len(set(names)) == len(names)
    with pytest.raises(ValueError, match=r"lab hosts: .* 1\.\.16"):
        LabLayout.make(index=0, hosts=17, simulated=True)


@pytest.mark.parametrize(("main", "selftest"),
                         [(0, 4), (1, 5), (2, 6), (3, 7), (4, 0), (5, 1), (6, 2), (7, 3)])
def test_the_selftest_lab_is_half_the_index_range_away(main, selftest):
    assert selftest_index(main) == selftest


def test_selftest_labs_of_main_labs_0_to_3_are_nobodys_main_lab():
    """Sessions side by side with main labs 0-3: no self-test lab is any session's main lab, or another
    session's self-test lab, and every one is a valid index (its own subnets, docs/lab.md)."""
    mains = range((MAX_INDEX + 1) // 2)
    selftests = [selftest_index(m) for m in mains]
    assert not set(selftests) & set(mains) and len(set(selftests)) == len(selftests)
    assert all(0 <= s <= MAX_INDEX for s in selftests)


def test_selftest_index_refuses_an_index_out_of_range():
    with pytest.raises(ValueError, match=r"lab index: 8 is not an integer in 0\.\.7"):
        selftest_index(8)
