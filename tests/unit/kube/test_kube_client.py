"""Where credentials come from: --kubeconfig, KUBECONFIG, the pod's service account, in that order."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
import yaml

from egress_kvm.kube.client import KubeConfigError, new_api_client, own_pool, pod_namespace
from egress_kvm.kube.rest import request_json
from testbed.emulator import Emulator, kubeconfig

pytestmark = pytest.mark.timeout(30)


def self_signed_ca() -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def service_account(tmp_path: Path, token: str = "tok-123", ca: bytes | None = None) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes(ca if ca is not None else self_signed_ca())
    (sa / "namespace").write_text("ops-ns\n")
    return sa


async def test_kubeconfig_flag_and_env_reach_the_server(tmp_path: Path) -> None:
    async with Emulator.running(port=0) as emu:
        kc = emu.write_kubeconfig(tmp_path / "kc")
        for kwargs in ({"kubeconfig": str(kc), "environ": {}}, {"environ": {"KUBECONFIG": str(kc)}}):
            client, source = await new_api_client(**kwargs)  # type: ignore[arg-type]
            async with client:
                assert source.kind == "kubeconfig" and source.path == str(kc)
                ns = await request_json(client, "GET", "/api/v1/namespaces/kube-system")
                assert ns["metadata"]["name"] == "kube-system"


async def test_the_flag_wins_over_env_and_env_over_in_cluster(tmp_path: Path) -> None:
    async with Emulator.running(port=0) as emu:
        kc = emu.write_kubeconfig(tmp_path / "kc")
        sa = service_account(tmp_path)
        env = {"KUBECONFIG": str(tmp_path / "missing"), "KUBERNETES_SERVICE_HOST": "10.0.0.1",
               "KUBERNETES_SERVICE_PORT": "443"}
        client, source = await new_api_client(kubeconfig=str(kc), environ=env, service_account_dir=str(sa))
        await client.close()
        assert source.path == str(kc)
        with pytest.raises(KubeConfigError, match=r"KUBECONFIG: .*missing.* does not exist"):
            await new_api_client(environ=env, service_account_dir=str(sa))


async def test_in_cluster_uses_the_service_account(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    client, source = await new_api_client(environ=env, service_account_dir=str(sa))
    async with client:
        assert source.kind == "in-cluster"
        conf = client.configuration
        assert conf.host == "https://[fd00::1]:6443"
        assert conf.api_key["BearerToken"] == "Bearer tok-123"
        assert conf.ssl_ca_cert == f"{sa}/ca.crt"
    assert pod_namespace(str(sa / "namespace")) == "ops-ns"
    assert pod_namespace(str(tmp_path / "nope")) is None


async def test_in_cluster_without_a_token_names_the_problem(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match=r"in-cluster service account: .*token"):
        await new_api_client(environ=env, service_account_dir=str(tmp_path / "empty"))


async def test_a_kubeconfig_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("just: [a, list]\n")
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await new_api_client(kubeconfig=str(bad), environ={})


async def test_a_corrupt_ca_bundle_names_the_file(tmp_path: Path) -> None:
    sa = service_account(tmp_path, ca=b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match=r"ca\.crt"):
        await new_api_client(environ=env, service_account_dir=str(sa))


async def test_the_client_resolves_the_proxy_once_and_does_not_read_the_environment_per_request(
        tmp_path: Path) -> None:
    async with Emulator.running(port=0) as emu:
        kc = emu.write_kubeconfig(tmp_path / "kc")
        client, _ = await new_api_client(kubeconfig=str(kc), environ={"HTTP_PROXY": "http://corp:3128"})
        async with client:
            assert client.rest_client.pool_manager.trust_env is False
            assert client.rest_client.proxy is None  # loopback: never proxied (envproxy.py)
            ns = await request_json(client, "GET", "/api/v1/namespaces/kube-system")
            assert ns["metadata"]["name"] == "kube-system"
    remote = kubeconfig.write(tmp_path / "remote", "https://api.example:6443")
    client, _ = await new_api_client(kubeconfig=str(remote), environ={"HTTPS_PROXY": "http://corp:3128"})
    async with client:
        assert client.rest_client.proxy == "http://corp:3128"
    with_url = kubeconfig.kubeconfig("https://api.example:6443")
    with_url["clusters"][0]["cluster"]["proxy-url"] = "http://kc:1"
    (tmp_path / "proxy-url").write_text(yaml.safe_dump(with_url))
    client, _ = await new_api_client(kubeconfig=str(tmp_path / "proxy-url"),
                                     environ={"HTTPS_PROXY": "http://corp:3128"})
    async with client:
        assert client.rest_client.proxy == "http://kc:1"  # the kubeconfig's proxy-url wins, as in client-go


async def test_own_pool_gets_through_while_the_first_clients_pool_is_full(tmp_path: Path) -> None:
    """The Lease renewals' client (operator/process.py): the workers' requests fill the main client's
    pool (kubernetes-asyncio queues past `connection_pool_maxsize`), the other pool still answers at once,
    with the same credentials and resolved proxy."""
    async with Emulator.running(port=0) as emu:
        kc = emu.write_kubeconfig(tmp_path / "kc")
        client, _ = await new_api_client(kubeconfig=str(kc), environ={})
        async with client:
            session = client.rest_client.pool_manager
            held = [await session.get(f"{emu.url}/api/v1/namespaces?watch=true") for _ in range(100)]
            try:
                with pytest.raises(TimeoutError):  # the main pool is full: a request waits for a connection
                    await asyncio.wait_for(request_json(client, "GET", "/api/v1/namespaces/kube-system"), 0.5)
                lease = own_pool(client)
                async with lease:
                    assert lease.configuration is client.configuration  # same server and credentials
                    assert lease.rest_client.pool_manager is not session
                    assert lease.rest_client.pool_manager.trust_env is False
                    ns = await asyncio.wait_for(
                        request_json(lease, "GET", "/api/v1/namespaces/kube-system"), 5.0)
                    assert ns["metadata"]["name"] == "kube-system"
            finally:
                for resp in held:
                    resp.close()
    remote = kubeconfig.write(tmp_path / "remote", "https://api.example:6443")
    client, _ = await new_api_client(kubeconfig=str(remote), environ={"HTTPS_PROXY": "http://corp:3128"})
    async with client, own_pool(client) as lease:
        assert lease.rest_client.proxy == "http://corp:3128"  # resolved once, carried over
