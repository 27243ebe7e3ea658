"""The Ready reason of a Failed Proxy names what cannot work (the REASON column of a plain `kubectl get
px`), decided from the error's field as a table."""

from __future__ import annotations

import pytest

from egress_kvm.controller.outcome import failed_reason


@pytest.mark.parametrize("message,spec_error,reason", [
    ("spec.provider: 'nope' is not in the providers file (configured: kvm-home)", True, "UnknownProvider"),
    ("spec.provider: is required in Managed mode", True, "UnknownProvider"),
    ("spec.placement: unknown placement.zone 'nas9' for provider 'kvm-home' (known: nas1)", True,
     "InvalidPlacement"),
    ("spec.cloudInit: set userData or secretRef, not both", True, "InvalidCloudInit"),
    ("spec.cloudInit.userData: must be a string", True, "InvalidCloudInit"),
    ("spec.external.address: is required in External mode", True, "InvalidExternalAddress"),
    ("spec.healthCheck.url: 'ftp://x' is not an http(s) URL", True, "InvalidHealthCheck"),
    ("spec.port: 70000 is not in 1..65535", True, "InvalidSpec"),
    ("spec: is required", True, "InvalidSpec"),
    ("spec.providerx: odd", True, "InvalidSpec"),  # a prefix match must end at a field boundary
    ("image 'debian-13' (https://example.test/x.qcow2) is not a qcow2 image", False, "ProviderRejected"),
])
def test_failed_reason(message: str, spec_error: bool, reason: str) -> None:
    assert failed_reason(message, spec_error=spec_error) == reason
