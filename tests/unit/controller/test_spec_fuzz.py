"""Fuzzing Proxy specs and providers files through the real path to the host (issue 13 item 8).

Every input ends one of two ways: a clear error that names the offending field, or an instance; and
never with a volume left on the host by an attempt that failed. The host is the in-memory fake libvirt
(tests/fakes), driven by the real KvmProvider; the real-lab counterpart is
tests/integration/test_kvm_provider.py::test_a_control_character_in_placement_image_leaves_nothing.
"""

from __future__ import annotations

import asyncio
import copy
import http.server
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import LOOPBACK_EGRESS, FakeHypervisors, precache_image, qcow2_image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress_kvm.config import ConfigError, parse_providers
from egress_kvm.controller.desired import Waiting, desired_instance
from egress_kvm.controller.proxyspec import SpecError, parse_spec
from egress_kvm.policy.secrets import USABLE
from egress_kvm.providers.base import CreateRequest, PermanentError, ProviderError, ResolvedPlacement
from egress_kvm.providers.kvm import KvmProvider

from .fakekube import FakeKube

# Text a tenant (or an admin's typo) could send: control characters, separators, non-ASCII, URLs.
NASTY = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=20),
    st.sampled_from(["", " ", "\x00", "a\x01b", "line\nbreak", "tab\there", "x" * 300, "../../etc", "a:b",
                     "http://images.test/\x7fx.qcow2", "https://169.254.169.254/", "debian-12\n", "ä",
                     "[::1]:1", "http://SERVED/a\x01b.qcow2", "http://SERVED/ok.qcow2"]),
)
# URL images served by a real loopback server (SERVED is replaced by its address), so bad paths get past
# the download to where volumes are made.
SERVED_URL = st.text(max_size=12).map(lambda path: f"http://SERVED/{path}.qcow2")
VALUE = st.one_of(NASTY, SERVED_URL, st.none(), st.integers(-5, 70000), st.booleans(),
                  st.lists(st.text(max_size=5), max_size=2))
SPEC_FIELDS = [("mode",), ("provider",), ("placement", "zone"), ("placement", "machineType"),
               ("placement", "image"), ("placement", "region"), ("port",), ("cloudInit", "userData"),
               ("cloudInit", "secretRef", "name"), ("cloudInit", "secretRef", "key"),
               ("auth", "secretRef", "name"), ("external", "address"), ("healthCheck", "url"),
               ("healthCheck", "intervalSeconds")]

GOOD_SPEC: dict[str, Any] = {"mode": "Managed", "provider": "kvm-test",
                             "placement": {"zone": "host0", "machineType": "small", "image": "debian-12"},
                             "cloudInit": {"userData": "#cloud-config\n"}}
GOOD_PROVIDERS: dict[str, Any] = {"egress": {"allowedCIDRs": ["127.0.0.0/8"]}, "providers": [{
    "name": "kvm-test", "type": "kvm",
    "kvm": {"sshKeyFile": "/nonexistent/id", "insecureIgnoreHostKey": True,
            "images": {"debian-12": {"url": "http://127.0.0.1:9/debian-12.qcow2"}},
            "urlImages": ["SERVED"],  # the loopback image server only
            "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
            "hosts": [{"name": "host0", "address": "host0.test:22", "user": "virt", "bridge": "br0"}]}}]}
KVM = ("providers", 0, "kvm")
PROVIDER_FIELDS = [("providers", 0, "name"), (*KVM, "hosts", 0, "name"), (*KVM, "hosts", 0, "address"),
                   (*KVM, "hosts", 0, "bridge"), (*KVM, "hosts", 0, "pool"), (*KVM, "hosts", 0, "user"),
                   (*KVM, "machineTypes", "small", "memoryMiB"), (*KVM, "diskSizeGb"), (*KVM, "vendorData"),
                   (*KVM, "urlImages"), (*KVM, "urlImages", 0), ("egress", "allowedCIDRs"),
                   ("egress", "authEndpoints", 0), ("egress", "clusterCIDRs")]


def _put(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = doc
    for part in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(part, [] if isinstance(part, int) else {})
        elif isinstance(node, list) and isinstance(part, int):
            while len(node) <= part:
                node.append({})
            node = node[part]
        else:
            return
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = value


def _names_a_field(message: str) -> bool:
    return bool(re.search(r"\bspec(\.[A-Za-z]+)+|\bplacement\.[A-Za-z]+|spec: is required", message))


def _served(doc: Any, address: str) -> Any:
    if isinstance(doc, str):
        return doc.replace("SERVED", address)
    if isinstance(doc, dict):
        return {k: _served(v, address) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_served(v, address) for v in doc]
    return doc


async def _attempt(spec_doc: Any, providers_doc: dict[str, Any], *, served: str) -> None:
    """Validate and provision as the operator does; assert the outcome rules."""
    spec_doc, providers_doc = _served(spec_doc, served), _served(providers_doc, served)
    try:
        config = parse_providers(copy.deepcopy(providers_doc))
    except ConfigError as exc:
        assert re.search(r"(providers|egress)(\[\d+\])?\.?[A-Za-z\[\]0-9.]*: ", str(exc)), str(exc)
        return
    entry = config.providers[0]
    assert entry.kvm is not None
    hv = FakeHypervisors([h.name for h in entry.kvm.hosts])
    image = qcow2_image()
    for hyp in hv.hosts.values():
        for key in entry.kvm.images:
            configured = entry.kvm.images[key]
            precache_image(hyp, key, image, url=configured.url, sha256=configured.sha256)
    before = {name: set(h.volumes) for name, h in hv.hosts.items()}
    provider = KvmProvider(name=entry.name, config=entry.kvm, cluster_id="fuzz", dial=hv.dial,
                           egress=config.egress)
    kube = FakeKube()
    kube.put_secret("default", "ci", {"user-data": b"#cloud-config\n"}, labels=USABLE)
    proxy = {"metadata": {"namespace": "default", "name": "px", "uid": "uid-1"}, "spec": spec_doc}
    created = None
    try:
        spec = parse_spec(spec_doc)
        if spec.mode != "Managed":
            return
        desired = await desired_instance(proxy=proxy, spec=spec, providers={entry.name: provider}, kube=kube)
        created = await desired.provider.create(CreateRequest(
            name=desired.name, owner_uid="uid-1", placement=desired.resolved, user_data=desired.user_data,
            owner_namespace="default", owner_name="px"))
    except (SpecError, Waiting) as exc:
        assert _names_a_field(str(exc)), str(exc)
    except PermanentError as exc:
        assert _names_a_field(str(exc)) or "refused" in str(exc), str(exc)
    except ProviderError:
        pass  # quota/transient: retried by the controller, still nothing may be left (below)
    finally:
        if created is not None:
            await provider.delete(created.name, created.zone)
        await provider.close()
    for name, h in hv.hosts.items():
        # base-* volumes are the image cache (kept by design, shared); anything else is the attempt's
        left = {v for v in set(h.volumes) - before[name] if not v.startswith("base-")}
        assert not left, f"left behind on {name}: {left}"
        assert not h.domains


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """A loopback HTTP server answering every GET with a small qcow2 image (in a thread: each example
    runs its own event loop)."""
    body = qcow2_image()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(SPEC_FIELDS), VALUE), max_size=4),
       whole=st.one_of(st.none(), VALUE))
def test_fuzzed_proxy_specs_fail_clearly_or_provision_and_leave_nothing(
        served: str, changes: list[tuple[tuple[str, ...], Any]], whole: Any) -> None:
    spec: Any = copy.deepcopy(GOOD_SPEC)
    for path, value in changes:
        _put(spec, path, value)
    if whole is not None and not changes:
        spec = whole  # not even an object
    asyncio.run(_attempt(spec, GOOD_PROVIDERS, served=served))


@FUZZ
@given(image=st.one_of(SERVED_URL, NASTY, st.none()), zone=st.one_of(st.none(), st.just("host0"), NASTY),
       machine_type=st.one_of(st.none(), st.just("small"), NASTY))
def test_fuzzed_placements_fail_clearly_or_provision_and_leave_nothing(
        served: str, image: str | None, zone: str | None, machine_type: str | None) -> None:
    """The placement alone, where most values reach the host: images are served, so a bad one gets past
    the download to where the overlay, the seed and the domain XML are made."""
    spec = copy.deepcopy(GOOD_SPEC)
    spec["placement"] = {"image": image, "zone": zone, "machineType": machine_type}
    asyncio.run(_attempt(spec, GOOD_PROVIDERS, served=served))


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(PROVIDER_FIELDS), VALUE), min_size=1, max_size=3))
def test_fuzzed_providers_files_fail_clearly_or_provision_and_leave_nothing(
        served: str, changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    doc = copy.deepcopy(GOOD_PROVIDERS)
    for path, value in changes:
        _put(doc, path, value)
    asyncio.run(_attempt(copy.deepcopy(GOOD_SPEC), doc, served=served))


def test_a_control_character_in_the_image_is_refused_before_any_volume(served: str) -> None:
    """The defect the review found: lxml raised after the overlay and seed were written."""
    for image in ("debian-12\x01", f"http://{served}/a\x01b.qcow2", f"http://{served}/\x7f"):
        spec = copy.deepcopy(GOOD_SPEC)
        spec["placement"]["image"] = image
        try:
            parse_spec(spec)
        except SpecError as exc:
            assert str(exc).startswith("spec.placement.image: ") and "control characters" in str(exc)
        else:
            raise AssertionError(f"{image!r} passed")
    # and the provider refuses it on its own, for a caller that skipped the spec checks
    asyncio.run(_provider_refuses_control_characters(served))


async def _provider_refuses_control_characters(served: str) -> None:
    egress = LOOPBACK_EGRESS.model_dump(by_alias=True, exclude_none=True)
    config = parse_providers(_served(copy.deepcopy(GOOD_PROVIDERS), served) | {"egress": egress})
    entry = config.providers[0]
    assert entry.kvm is not None
    hv = FakeHypervisors(["host0"])
    provider = KvmProvider(name=entry.name, config=entry.kvm, cluster_id="fuzz", dial=hv.dial)
    try:
        for image in (f"http://{served}/a\x01b.qcow2", "debian-12\x01"):
            try:
                where = ResolvedPlacement(zone="host0", machine_type="small", image=image)
                await provider.create(CreateRequest(name="proxy-abc", owner_uid="u", placement=where,
                                                    user_data=b""))
            except PermanentError as exc:
                assert "placement.image" in str(exc)
            else:
                raise AssertionError("created")
    finally:
        await provider.close()
    assert {v for v in hv["host0"].volumes if not v.startswith("base-")} == set()
    assert hv["host0"].domains == {}
