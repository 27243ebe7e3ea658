"""Deletion's decisions as tables: which provider deletes each instance, and when the finalizer stays."""

from __future__ import annotations

import pytest

from egress_kvm.controller.deletion import DeletionPlan, Missing, blocked, escape_hatch, plan_deletion
from egress_kvm.controller.outcome import Retry
from egress_kvm.controller.plan import WARNING
from egress_kvm.controller.status import Ref
from egress_kvm.kube.interfaces import FINALIZER

from .fakeprovider import FakeProvider

HOME = FakeProvider("kvm-home", zones=("nas1", "nas2"))
OTHER = FakeProvider("kvm-other", zones=("nas1",))
LONE = FakeProvider("kvm-lone", zones=("nas9",))

CUR = Ref("proxy-cur", "nas1", provider="kvm-home")
PREV = Ref("proxy-prev", "nas2", provider="kvm-home")
OLD_STYLE = Ref("proxy-old", "nas9")  # status from before the provider was recorded
ELSEWHERE = Ref("proxy-else", "nas1", provider="kvm-gone")


def plan(refs: list[Ref], providers: dict[str, FakeProvider],
         spec_provider: str = "kvm-home") -> DeletionPlan:
    return plan_deletion(refs, spec_provider=spec_provider, providers=providers)  # type: ignore[arg-type]


@pytest.mark.parametrize(("refs", "providers", "spec_provider", "deleted_by", "missing"), [
    # every entry there: each instance to the entry that made it
    ([CUR, PREV], {"kvm-home": HOME}, "kvm-home",
     [("proxy-cur", "kvm-home"), ("proxy-prev", "kvm-home")], []),
    # nothing to delete: nothing blocks
    ([], {}, "kvm-home", [], []),
    # the entry is gone (e.g. the providers ConfigMap reset to `providers: []`): blocked, named
    ([CUR], {}, "kvm-home", [], [("proxy-cur", "kvm-home")]),
    # another entry's same-named host is not where the VM is
    ([CUR], {"kvm-other": OTHER}, "kvm-home", [], [("proxy-cur", "kvm-home")]),
    # one entry gone, the other there: what can go goes, the rest blocks
    ([CUR, ELSEWHERE], {"kvm-home": HOME}, "kvm-home", [("proxy-cur", "kvm-home")],
     [("proxy-else", "kvm-gone")]),
    # old status without a provider: the one entry serving the zone, else the spec's entry is missing
    ([OLD_STYLE], {"kvm-lone": LONE}, "kvm-home", [("proxy-old", "kvm-lone")], []),
    ([OLD_STYLE], {"kvm-home": HOME}, "kvm-home", [], [("proxy-old", "kvm-home")]),
    # two entries serve the zone and status does not say which: never guess
    ([Ref("proxy-amb", "nas1")], {"kvm-other": OTHER, "kvm-x": FakeProvider("kvm-x", zones=("nas1",))},
     "kvm-home", [], [("proxy-amb", "kvm-home")]),
])
def test_plan_deletion(refs, providers, spec_provider, deleted_by, missing) -> None:  # type: ignore[no-untyped-def]
    p = plan(refs, providers, spec_provider)
    assert [(r.name, prov.name) for r, prov in p.delete] == deleted_by
    assert [(m.ref.name, m.entry) for m in p.missing] == missing


def test_blocked_names_the_entry_the_instance_and_both_ways_out() -> None:
    t = blocked([Missing(CUR, "kvm-home")], namespace="team-a", name="px1")
    assert t.reason == "DeleteBlocked" and t.retry is Retry.QUOTA
    assert t.event is not None and t.event.type_ == WARNING and t.event.reason == "DeleteBlocked"
    assert t.event.message == t.message
    assert "provider 'kvm-home' is not in the providers file" in t.message
    assert "instance proxy-cur on nas1 was made by provider 'kvm-home'" in t.message
    assert FINALIZER in t.message and "until the entry is back" in t.message
    assert t.message.endswith(escape_hatch(namespace="team-a", name="px1"))


def test_blocked_on_two_entries_names_both() -> None:
    t = blocked([Missing(CUR, "kvm-home"), Missing(ELSEWHERE, "kvm-gone")], namespace="ns", name="px")
    assert "provider 'kvm-gone', 'kvm-home' are not in the providers file" in t.message


def test_escape_hatch_is_the_documented_command() -> None:
    cmd = escape_hatch(namespace="default", name="proxy-kvm-sample")
    assert cmd == ("kubectl patch px proxy-kvm-sample -n default --type=json "
                   """-p '[{"op":"remove","path":"/metadata/finalizers"}]'""")
