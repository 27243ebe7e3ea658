"""redact_url / scrub: userinfo and query strings never survive into a message."""

from __future__ import annotations

import pytest

from egress_kvm.redact import redact_url, scrub


@pytest.mark.parametrize(("url", "want"), [
    ("https://user:tok3n@img.example:8443/a/b.qcow2?X-Amz-Signature=abc&X-Amz-Expires=60#frag",
     "https://REDACTED@img.example:8443/a/b.qcow2?REDACTED"),
    ("http://user@img.example/x", "http://REDACTED@img.example/x"),
    ("http://10.231.1.1:8080/healthz", "http://10.231.1.1:8080/healthz"),
    ("http://[fd00::1]:80/p?token=t0k", "http://[fd00::1]:80/p?REDACTED"),
    ("http://h:99999/?token=t0k", "http://REDACTED"),  # unparsable port: only the scheme survives
    ("https://[::1]:9/x#frag", "https://[::1]:9/x"),
    ("ftp://u:p@x/y?sig=1", "ftp://REDACTED@x/y?REDACTED"),
    ("u:secret@h/x?sig=1", "h/x?REDACTED"),  # no scheme: what looks like userinfo still goes
    ("h/x", "h/x"),
])
def test_redact_url(url: str, want: str) -> None:
    assert redact_url(url) == want
    assert not any(secret in redact_url(url) for secret in ("secret", "tok3n", "t0k", "sig="))


def test_scrub_replaces_the_url_and_its_secret_parts_wherever_quoted() -> None:
    url = "https://bob:s3cret@example.test/p?sig=XyZ"
    text = f"Cannot connect to {url} (bob:s3cret; query sig=XyZ)"
    out = scrub(text, url)
    assert "s3cret" not in out and "XyZ" not in out
    assert "https://REDACTED@example.test/p?REDACTED" in out


@pytest.mark.parametrize("quoted", [
    "https://example.test/p?X-Amz-Signature=ab%2Fcd%3D&X-Amz-Credential=AKIA%2F2026",  # as given
    "https://example.test/p?X-Amz-Signature=ab/cd=&X-Amz-Credential=AKIA/2026",  # decoded by yarl
    "https://example.test/p?x-amz-signature=ab%2fcd%3d",  # lower-case hex
    "signature ab%2Fcd%3D rejected; credential AKIA%2F2026",  # values alone
    "userinfo b%40b:p%3Ass rejected",  # encoded userinfo
    "userinfo b@b:p:ss rejected",  # decoded userinfo
])
def test_scrub_catches_percent_encoded_and_decoded_forms(quoted: str) -> None:
    url = "https://b%40b:p%3Ass@example.test/p?X-Amz-Signature=ab%2Fcd%3D&X-Amz-Credential=AKIA%2F2026"
    out = scrub(f"failed: {quoted}", url)
    for secret in ("ab%2Fcd", "ab/cd", "ab%2fcd", "AKIA%2F2026", "AKIA/2026", "p%3Ass", "p:ss"):
        assert secret not in out, out
