"""display_url: what may be printed of an image URL."""

from __future__ import annotations

import pytest

from egress_kvm.config.urls import display_url


@pytest.mark.parametrize(("url", "shown"), [
    ("https://u:secret@h.example/x.qcow2?X-Amz-Signature=abc", "https://h.example/x.qcow2?..."),
    ("https://token@h.example:8443/x.qcow2", "https://h.example:8443/x.qcow2"),
    ("http://127.0.0.1:8080/a.qcow2", "http://127.0.0.1:8080/a.qcow2"),
    ("https://[::1]:9/x#frag", "https://[::1]:9/x"),
    ("ftp://u:p@x/y?sig=1", "ftp://x/y?..."),
    ("u:secret@h/x?sig=1", "h/x"),
    ("http://h:99999/x?sig=secret", "<unparseable URL>"),
])
def test_display_url_drops_userinfo_query_and_fragment(url: str, shown: str) -> None:
    assert display_url(url) == shown
    assert "secret" not in display_url(url)
