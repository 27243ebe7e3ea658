"""What the lab writes for the operator: a providers file the project's own parser accepts, Proxy
manifests with the agreed spec, user-data that configures tinyproxy on spec.port, lab.json round trip."""

import json
from pathlib import Path

import pytest
import yaml

from egress_kvm.config.loading import parse_providers
from testbed.lab import manifests
from testbed.lab.host import conf_int
from testbed.lab.info import LabInfo
from testbed.lab.layout import LabLayout

IMAGE = {"url": "http://10.231.1.1:8081/debian12-proxy-0123.qcow2", "sha256": "ab" * 32, "size": 123,
         "format": "qcow2"}


def test_providers_file_passes_the_operators_parser(tmp_path):
    lab = LabLayout.make(index=1, hosts=2, state_dir=tmp_path)
    doc = yaml.safe_load(manifests.dump(manifests.providers_doc(lab, image=IMAGE)))
    cfg = parse_providers(doc).providers[0]
    assert (cfg.name, cfg.type) == ("lab", "kvm")
    kvm = cfg.kvm
    assert kvm.ssh_key_file == str(tmp_path / "id_ed25519")
    assert kvm.known_hosts_file == str(tmp_path / "known_hosts")
    assert kvm.images["debian-12"].url == IMAGE["url"]
    assert kvm.images["debian-12"].sha256 == IMAGE["sha256"]
    assert kvm.machine_types["small"].memory_mib == 512
    assert [h.address for h in kvm.hosts] == ["10.231.16.2:22", "10.231.18.2:22"]
    assert {h.bridge for h in kvm.hosts} == {"br0"}
    assert {h.seed_bus for h in kvm.hosts} == {"sata"}


def test_vendor_data_is_offline():
    vendor = yaml.safe_load(manifests.VENDOR_DATA)
    assert manifests.VENDOR_DATA.startswith("#cloud-config\n")
    assert "packages" not in vendor
    assert "runcmd" not in vendor  # user-data's runcmd would replace it; bootcmd survives
    assert any("qemu-guest-agent" in part for part in vendor["bootcmd"][0])


def test_providers_file_without_image_has_no_images():
    lab = LabLayout.make(index=0, hosts=1)
    doc = manifests.providers_doc(lab, image=None)
    assert doc["providers"][0]["kvm"]["images"] == {}
    parse_providers(yaml.safe_load(manifests.dump(doc)))


def test_user_data_configures_tinyproxy_on_the_port():
    text = manifests.user_data(port=3130)
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    conf = doc["write_files"][0]
    assert conf["path"] == "/etc/tinyproxy/tinyproxy.conf"
    lines = conf["content"].splitlines()
    assert "Port 3130" in lines
    assert "Allow 10.231.0.0/16" in lines
    assert doc["runcmd"] == [["systemctl", "restart", "tinyproxy"]]


def test_written_manifests(tmp_path):
    lab = LabLayout.make(index=0, hosts=2, state_dir=tmp_path)
    targets = {"host0": "http://10.231.1.1:8080/hello.txt", "host1": "http://10.231.3.1:8080/hello.txt"}
    paths = manifests.write_all(lab, image=IMAGE, targets=targets)
    assert len(paths) == 2
    docs = [yaml.safe_load(Path(p).read_text()) for p in paths]
    for doc, host in zip(docs, ("host0", "host1"), strict=True):
        assert doc["apiVersion"] == "egressproxies.io/v1alpha1"
        assert doc["kind"] == "Proxy"
        spec = doc["spec"]
        assert spec["mode"] == "Managed"
        assert spec["provider"] == "lab"
        assert spec["placement"] == {"zone": host, "machineType": "small", "image": "debian-12"}
        assert spec["port"] == 3128
        assert spec["healthCheck"] == {"url": targets[host], "intervalSeconds": 5, "timeoutSeconds": 5}
        assert spec["cloudInit"]["userData"] == manifests.user_data(port=3128)
    assert (tmp_path / "user-data.yaml").read_text() == manifests.user_data()
    assert "userData: |" in Path(paths[0]).read_text()  # readable block, not an escaped one-liner


def test_lab_json_round_trip_with_item_access(tmp_path):
    data = {
        "index": 0, "state_dir": str(tmp_path), "ssh_key": "k", "known_hosts": "kh", "providers_file": "p",
        "image": IMAGE, "http_target": "http://10.231.1.1:8080/hello.txt", "http_target_body": "hi\n",
        "hosts": [{"name": "host0", "ip": "10.231.0.2", "port": 22, "address": "10.231.0.2:22",
                   "user": "virt",
                   "netns": "ekvm0h0", "bridge": "br0", "pool": "default",
                   "pool_path": "/var/lib/libvirt/images", "lan_cidr": "10.231.1.0/24",
                   "gateway": "10.231.1.1", "socket": "/var/run/libvirt/libvirt-sock", "domain_type": "qemu",
                   "libvirtd_pid": 10, "sshd_pid": 11, "dnsmasq_leases": "l", "pool_dir": "d",
                   "http_target": "http://10.231.1.1:8080/hello.txt"}],
        "proxy_manifests": ["m"], "user_data_file": "u",
    }
    (tmp_path / "lab.json").write_text(json.dumps(data))
    info = LabInfo.load(tmp_path)
    assert info.hosts[0].ip == "10.231.0.2"
    assert info["hosts"][0]["address"] == "10.231.0.2:22"
    assert info.image is not None and info.image.sha256 == IMAGE["sha256"]
    assert info.host("host0").netns == "ekvm0h0"
    assert info.to_dict() == data
    info.save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == data


def test_a_lab_without_dhcp_gives_each_host_its_range_as_static_addresses(tmp_path):
    from testbed.lab.host import daemons

    lab = LabLayout.make(index=1, hosts=2, state_dir=tmp_path, dhcp=False)
    doc = yaml.safe_load(manifests.dump(manifests.providers_doc(lab, image=IMAGE)))
    hosts = parse_providers(doc).providers[0].kvm.hosts
    got = [(h.static_addresses.cidr, h.static_addresses.gateway, h.static_addresses.range) for h in hosts]
    assert got == [("10.231.17.0/24", "10.231.17.1", "10.231.17.100-10.231.17.199"),
                   ("10.231.19.0/24", "10.231.19.1", "10.231.19.100-10.231.19.199")]
    assert "dnsmasq" not in daemons(lab.host(0))
    with_dhcp = LabLayout.make(index=1, hosts=1, state_dir=tmp_path)
    assert "dnsmasq" in daemons(with_dhcp.host(0))
    plain = yaml.safe_load(manifests.dump(manifests.providers_doc(with_dhcp, image=IMAGE)))
    assert "staticAddresses" not in plain["providers"][0]["kvm"]["hosts"][0]


def test_lab_json_records_a_lab_without_dhcp_and_omits_the_default(tmp_path):
    info = LabInfo(index=0, state_dir=str(tmp_path), ssh_key="k", known_hosts="kh", providers_file="p",
                   image=None, http_target="t", http_target_body="b", hosts=[], dhcp=False)
    info.save(tmp_path / "lab.json")
    assert LabInfo.load(tmp_path).dhcp is False
    info.dhcp = True
    assert "dhcp" not in info.to_dict()


@pytest.mark.parametrize(("text", "want"), [
    ("#max_client_requests = 5\n", None),  # the distro's file: commented, the built-in default applies
    ("max_client_requests = 20\n", 20),
    ("  max_client_requests=7   # tuned\n", 7),
    ("admin_max_client_requests = 9\n", None),  # another setting whose name ends the same
    ("keepalive_interval = -1\n", -1),
])
def test_a_daemon_conf_setting_is_read_only_where_set(text: str, want: int | None) -> None:
    name = "keepalive_interval" if "keepalive" in text else "max_client_requests"
    assert conf_int(text, name) == want


def test_a_daemon_conf_setting_set_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="set 2 times"):
        conf_int("max_client_requests = 5\nmax_client_requests = 6\n", "max_client_requests")
