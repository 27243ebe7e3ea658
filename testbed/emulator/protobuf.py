"""Just enough of Kubernetes' protobuf encoding to read the bodies kubectl's typed commands send.

`kubectl create namespace|secret|configmap|serviceaccount` use the generated clientset, which always
encodes built-in kinds as protobuf (`application/vnd.kubernetes.protobuf`): the bytes `k8s\\0`, then a
runtime.Unknown {typeMeta=1, raw=2, ...} whose `raw` is the object's own message. This module decodes
those few kinds into the JSON form the rest of the emulator handles; any other kind is refused with 415.
Field numbers are those of k8s.io/api/core/v1 and apimachinery's generated.proto.
"""

from __future__ import annotations

import base64
from typing import Any

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """The wire-level (field number, wire type, value) triples of one message."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            value, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtobufError("truncated field")
            value, i = buf[i : i + n], i + n
        elif wt == 1:
            value, i = buf[i : i + 8], i + 8
        elif wt == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ProtobufError(f"unsupported wire type {wt}")
        out.append((num, wt, value))
    return out


# message -> field number -> (json name, kind, repeated)
Schema = dict[int, tuple[str, str, bool]]
MESSAGES: dict[str, Schema] = {
    "ObjectMeta": {
        1: ("name", "string", False),
        2: ("generateName", "string", False),
        3: ("namespace", "string", False),
        11: ("labels", "map_ss", False),
        12: ("annotations", "map_ss", False),
        13: ("ownerReferences", "OwnerReference", True),
        14: ("finalizers", "string", True),
    },
    "OwnerReference": {
        1: ("kind", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
        6: ("controller", "bool", False),
        7: ("blockOwnerDeletion", "bool", False),
    },
    "ObjectReference": {
        1: ("kind", "string", False),
        2: ("namespace", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
        6: ("resourceVersion", "string", False),
        7: ("fieldPath", "string", False),
    },
    "LocalObjectReference": {1: ("name", "string", False)},
    "NamespaceSpec": {1: ("finalizers", "string", True)},
    "Namespace": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "NamespaceSpec", False)},
    "Secret": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map_sb", False),
        3: ("type", "string", False),
        4: ("stringData", "map_ss", False),
        5: ("immutable", "bool", False),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map_ss", False),
        3: ("binaryData", "map_sb", False),
        4: ("immutable", "bool", False),
    },
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta", False),
        2: ("secrets", "ObjectReference", True),
        3: ("imagePullSecrets", "LocalObjectReference", True),
        4: ("automountServiceAccountToken", "bool", False),
    },
    # k8s.io/api/authorization/v1: what `kubectl auth can-i` sends.
    "ResourceAttributes": {
        1: ("namespace", "string", False),
        2: ("verb", "string", False),
        3: ("group", "string", False),
        4: ("version", "string", False),
        5: ("resource", "string", False),
        6: ("subresource", "string", False),
        7: ("name", "string", False),
    },
    "NonResourceAttributes": {1: ("path", "string", False), 2: ("verb", "string", False)},
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes", False),
        2: ("nonResourceAttributes", "NonResourceAttributes", False),
    },
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SelfSubjectAccessReviewSpec", False),
    },
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "string", False)},
    "SelfSubjectRulesReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SelfSubjectRulesReviewSpec", False),
    },
}
KINDS = ("Namespace", "Secret", "ConfigMap", "ServiceAccount", "SelfSubjectAccessReview",
         "SelfSubjectRulesReview")


def _scalar(kind: str, wt: int, value: Any) -> Any:
    if kind == "string":
        return bytes(value).decode()
    if kind == "bytes":
        return base64.b64encode(bytes(value)).decode()
    if kind == "bool":
        return bool(value)
    if kind == "int64":
        return int(value)
    raise ProtobufError(f"unknown scalar kind {kind}")


def decode_message(name: str, buf: bytes) -> dict[str, Any]:
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for num, wt, value in fields(buf):
        if num not in schema:
            continue  # a field this emulator does not model: dropped, like pruning
        key, kind, repeated = schema[num]
        if kind in ("map_ss", "map_sb"):
            entry = {n: v for n, _, v in fields(value)}
            k = bytes(entry.get(1, b"")).decode()
            raw = bytes(entry.get(2, b""))
            out.setdefault(key, {})[k] = raw.decode() if kind == "map_ss" else base64.b64encode(raw).decode()
            continue
        item = decode_message(kind, value) if kind in MESSAGES else _scalar(kind, wt, value)
        if item == "" and not repeated:
            continue  # gogo-protobuf writes empty strings; JSON would omit them
        if repeated:
            out.setdefault(key, []).append(item)
        else:
            out[key] = item
    return out


def decode(body: bytes, *, kind: str) -> dict[str, Any]:
    """A protobuf request body for `kind` as the JSON object it stands for."""
    if kind not in KINDS:
        raise ProtobufError(f"protobuf bodies are decoded only for {', '.join(KINDS)}, not {kind}")
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope")
    unknown = {n: v for n, _, v in fields(body[len(MAGIC) :])}
    type_meta = {n: bytes(v).decode() for n, _, v in fields(unknown.get(1, b""))}
    obj = decode_message(kind, bytes(unknown.get(2, b"")))
    if type_meta.get(2) and type_meta[2] != kind:
        raise ProtobufError(f"the body holds a {type_meta[2]}, not a {kind}")
    obj["apiVersion"] = type_meta.get(1) or ("authorization.k8s.io/v1" if "Review" in kind else "v1")
    obj["kind"] = kind
    return obj
