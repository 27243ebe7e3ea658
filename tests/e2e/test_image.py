"""The operator image, built here (testbed.image: local stand-in bases, podman as root) and run as the
Deployment runs it: a Proxy reaches Ready with the operator inside the container.

The image is built once per recipe (Containerfile + the files it copies + the bases) and found again by
its tag on a later run; the module prints whether it was built or cached, the time and the size.
"""

from __future__ import annotations

import re
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from e2e_stack import (
    CANARY,
    OPERATOR_FLAGS,
    ContainerOperator,
    Stack,
    domains,
    log_records,
    timeout_with_boots,
    wait_until,
)

from testbed import image as imagemod

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(timeout_with_boots(1800, boot_waits=1))]  # 1 Proxy

DEPS = imagemod.REPO / "deploy" / "image-dependencies.txt"
PROXY = "lab-proxy-in-image"


@pytest.fixture(scope="module")
def built() -> imagemod.BuiltImage:
    reason = imagemod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    b = imagemod.build()
    size = imagemod.size_bytes(b.ref) / 1e6
    print(f"\nimage {b.ref}: {'cached' if b.cached else 'built'} in {b.seconds:.1f}s, {size:.1f} MB")
    return b


@pytest.fixture(scope="module")
def rootfs(built):
    with imagemod.mounted(built.ref) as path:
        yield path


def _wheel_tags(wheel: str) -> set[str]:
    py, abi, plat = wheel.removesuffix(".whl").split("-")[-3:]
    return {f"{p}-{a}-{pl}" for p in py.split(".") for a in abi.split(".") for pl in plat.split(".")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_image_holds_exactly_the_checked_wheels(rootfs: Path) -> None:
    """Every distribution in the image is a listed one at its listed version, built for the listed
    platform (its WHEEL tags are the listed file's), and nothing else is there but the operator."""
    listed = {}
    for line in DEPS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"(\S+)==(\S+) --hash=sha256:[0-9a-f]{64}\s+#\s+(\S+)", line)
            assert m, line
            listed[_norm(m.group(1))] = (m.group(2), _wheel_tags(m.group(3)))
    site = rootfs / "app" / "site"
    found = {}
    for info in site.glob("*.dist-info"):
        meta = dict(re.findall(r"^(Name|Version): (.+)$", (info / "METADATA").read_text(), re.MULTILINE))
        tags = set(re.findall(r"^Tag: (.+)$", (info / "WHEEL").read_text(), re.MULTILINE))
        found[_norm(meta["Name"])] = (meta["Version"], tags)
    ours = found.pop("egress-kvm")
    assert ours[0] == imagemod.version()
    assert found == listed
    assert not (rootfs / "build-backend").exists()  # the pinned setuptools stayed in the build stage


def test_image_holds_no_test_bed_no_libvirt_and_no_build_secret(rootfs: Path) -> None:
    names = [p for p in rootfs.rglob("*") if not p.is_symlink() or p.exists()]
    assert not [p for p in names if "testbed" in p.relative_to(rootfs).parts]
    # No libvirt library: no shared object of libvirt's (libvirt.so*, libvirt-python's libvirtmod*.so),
    # and no module or distribution named libvirt* where Python imports from. (Our own modules may be
    # named for libvirt: egress_kvm/providers/kvm/libvirt_api.py is the operator's typed client API.)
    assert not [p for p in names if p.name.lower().startswith("libvirt") and ".so" in p.name]
    import_roots = [rootfs / "app" / "site", *rootfs.glob("usr/lib/python3*"),
                    *rootfs.glob("usr/lib/python3*/*-packages"), *rootfs.glob("usr/lib/python3*/lib-dynload")]
    assert not [p for root in import_roots if root.is_dir() for p in root.iterdir()
                if p.name.lower().startswith("libvirt")]
    assert (rootfs / "app" / "site" / "egress_kvm").is_dir() and (rootfs / "app" / "site" / "rpc").is_dir()
    # The build read the CA bundle (with CA_CANARY in it) as a secret: no file holds the canary, nor the
    # body of any CA this machine added to its trust store (the one re-signing registry TLS, here).
    needles = [imagemod.CA_CANARY]
    for crt in Path("/usr/local/share/ca-certificates").glob("**/*.crt"):
        body = [ln for ln in crt.read_text().splitlines() if ln and not ln.startswith("-----")]
        needles += body[:1]
    grep = subprocess.run(["grep", "-rlF", *[a for n in needles for a in ("-e", n)], str(rootfs)],
                          capture_output=True, text=True)
    assert grep.returncode == 1, f"secret material in the image: {grep.stdout or grep.stderr}"


def test_operator_in_the_container_makes_a_proxy_ready(lab, built, tmp_path_factory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        health = f"127.0.0.1:{s.getsockname()[1]}"
    flags = list(OPERATOR_FLAGS)
    flags[flags.index("--health-probe-bind-address") + 1] = health
    stack = Stack(lab, tmp_path_factory.mktemp("image-e2e"), operator_image=built.ref, operator_flags=flags)
    try:
        stack.start()
        op = stack.operator
        assert isinstance(op, ContainerOperator)
        stack.kubectl.apply(stack.proxy(PROXY))
        st = stack.wait_ready(PROXY)
        assert st["instance"]["zone"] == "host0"
        assert st["instance"]["name"] in domains(lab, "host0")

        # The process that did it runs as the Deployment's securityContext says.
        pid = op.container_pid()
        assert pid is not None
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert status["Uid"].split() == ["65532"] * 4 and status["Gid"].split() == ["65532"] * 4
        assert {int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {0}
        assert status["NoNewPrivs"].strip() == "1"
        root = [ln.split() for ln in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if ln.split()[4] == "/"]
        assert root and "ro" in root[0][5].split(","), root
        assert b"egress_kvm.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert "/app/site/uvloop/loop.cpython-311" in Path(f"/proc/{pid}/maps").read_text()  # default loop
        with urllib.request.urlopen(f"http://{health}/readyz", timeout=10) as resp:
            assert resp.status == 200

        # The VM serves, and deleting the Proxy removes it: the whole cycle from inside the container.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{st['ip']}:3128"}))
        with opener.open(lab.http_target, timeout=30) as resp:
            assert resp.read().decode() == lab.http_target_body
        stack.kubectl("delete", "px", PROXY, "--wait=true", "--timeout=300s", timeout=330)
        wait_until(lambda: st["instance"]["name"] not in domains(lab, "host0"), timeout=60,
                   what="the VM gone")
        assert op.stop() == 0
        lines = op.log_lines()
        assert [r for r in log_records(lines) if r.get("msg") == "phase changed" and r.get("new") == "Ready"]
        assert not [ln for ln in lines if CANARY in ln]
    finally:
        stack.close()
    for started in stack.operators:  # stopping removed each container
        assert isinstance(started, ContainerOperator)
        exists = subprocess.run([*imagemod.podman(), "container", "exists", started.container.name])
        assert exists.returncode == 1, started.container.name


def test_a_build_without_cache_gives_the_same_image(built) -> None:
    """Reproducible: built again from nothing but the bases (every wheel downloaded anew, no layer
    cache), the image has the same layer digests and the same ID (config and creation time included)."""
    before = (imagemod.image_id(built.ref), imagemod.layers(built.ref))
    again = imagemod.build(rebuild=True)
    assert again.ref == built.ref and not again.cached
    print(f"\nrebuilt without cache in {again.seconds:.1f}s")
    assert (imagemod.image_id(again.ref), imagemod.layers(again.ref)) == before
