"""Protobuf request bodies as kubectl's typed commands send them (bytes captured from kubectl 1.37)."""

from __future__ import annotations

import pytest

from testbed.emulator import Api, protobuf

SECRET = (
    b'k8s\x00\n\x0c\n\x02v1\x12\x06Secret\x125\n\x13\n\x02s1\x12\x00\x1a\x01x"\x00*\x002\x008\x00B\x00'
    b'\x12\x06\n\x01a\x12\x01b\x1a\x16kubernetes.io/ssh-auth\x1a\x00"\x00'
)
NAMESPACE = (
    b'k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x1b\n\x13\n\x03foo\x12\x00\x1a\x00"\x00*\x002\x008\x00B\x00'
    b'\x12\x00\x1a\x02\n\x00\x1a\x00"\x00'
)


def test_secret() -> None:
    assert protobuf.decode(SECRET, kind="Secret") == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s1", "namespace": "x"},
        "data": {"a": "Yg=="},
        "type": "kubernetes.io/ssh-auth",
    }


def test_namespace_creates_through_the_api() -> None:
    obj = protobuf.decode(NAMESPACE, kind="Namespace")
    assert obj["metadata"] == {"name": "foo"}
    api = Api()
    created, _ = api.create(api.resource("", "v1", "namespaces"), "", obj)
    assert created["status"]["phase"] == "Active"


def test_wrong_kind_and_garbage_are_refused() -> None:
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(SECRET, kind="ConfigMap")
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(b"k8s\x00\n\xff", kind="Secret")
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(b"{}", kind="Secret")
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(SECRET, kind="Deployment")


def test_secret_string_data_is_folded_into_data() -> None:
    api = Api()
    secrets = api.resource("", "v1", "secrets")
    obj, _ = api.create(secrets, "default", {"metadata": {"name": "s"}, "stringData": {"password": "p"}})
    assert obj["data"] == {"password": "cA=="} and "stringData" not in obj and obj["type"] == "Opaque"
    obj, _ = api.patch(
        secrets, "default", "s", "application/merge-patch+json", {"stringData": {"username": "u"}}
    )
    assert obj["data"] == {"password": "cA==", "username": "dQ=="} and "stringData" not in obj
