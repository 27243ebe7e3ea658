"""The lab image's recipe (testbed/lab/build-image.sh) trims the boot for software emulation; these rows
check that the trimming keeps what the lab's VMs need: the cloud-init modules the lab's user-data and
vendor-data use, the initramfs's root-disk drivers, no blacklisted driver a proxy VM's devices need."""

from __future__ import annotations

import re

import pytest
import yaml

from testbed.lab import image, manifests

RECIPE = image.RECIPE.read_text()


def _heredoc(tag: str) -> str:
    m = re.search(rf"<<'{tag}'\n(.*?)\n{tag}\n", RECIPE, re.S)
    assert m is not None, f"no {tag} heredoc in the recipe"
    return m.group(1)


def _shell_words(var: str) -> set[str]:
    m = re.search(rf'^{var}="([^"]*)"', RECIPE, re.M)
    assert m is not None, f"no {var}= in the recipe"
    return set(m.group(1).split())


MODULES = yaml.safe_load(_heredoc("CFG"))
ALL_MODULES = {m for stage in MODULES.values() for m in stage}
# cloud-config key -> the modules acting on it (runcmd only writes the script; scripts_user runs it)
KEY_MODULES = {"bootcmd": {"bootcmd"}, "write_files": {"write_files"}, "runcmd": {"runcmd", "scripts_user"}}


@pytest.mark.parametrize(("name", "doc"), [
    ("user-data", manifests.user_data(port=3128)),
    ("vendor-data", manifests.VENDOR_DATA),
])
def test_every_key_the_labs_cloud_config_uses_has_its_module(name: str, doc: str) -> None:
    keys = set(yaml.safe_load(doc))
    assert keys <= set(KEY_MODULES), f"{name} uses {keys - set(KEY_MODULES)}: add them to KEY_MODULES"
    for key in keys:
        assert KEY_MODULES[key] <= ALL_MODULES, f"{name}'s {key} needs {KEY_MODULES[key] - ALL_MODULES}"


def test_the_module_lists_are_cloud_inits_three_stages() -> None:
    assert set(MODULES) == {"cloud_init_modules", "cloud_config_modules", "cloud_final_modules"}


@pytest.mark.parametrize("module", ["virtio_pci", "virtio_blk", "ext4"])
def test_the_initramfs_carries_the_root_disks_drivers(module: str) -> None:
    assert module in _heredoc("HOOK").split("for m in ")[1].split(";")[0].split()


@pytest.mark.parametrize("module", [
    "ahci", "sr_mod", "cdrom", "virtio_scsi",  # the seed cdrom (SATA per the spec, or virtio-scsi)
    "virtio_net", "virtio_console", "virtio_rng", "virtio_blk", "ext4", "isofs",  # NIC, agent, RNG, disks
])
def test_no_driver_a_proxy_vm_needs_is_blacklisted(module: str) -> None:
    assert module not in _shell_words("BLACKLIST")


@pytest.mark.parametrize(("fragment", "why"), [
    ("KERNEL=linux-image-amd64", "the full kernel: the cloud kernel lacks AHCI"),
    ("datasource_list: [ NoCloud, None ]", "the seed is NoCloud"),
    ("qemu-guest-agent", "the agent reports the IP"),
    ("tinyproxy", "the proxy"),
    ("console=ttyS0", "virsh console shows the boot"),
])
def test_the_recipe_keeps_the_requirements(fragment: str, why: str) -> None:
    assert fragment in RECIPE, why
