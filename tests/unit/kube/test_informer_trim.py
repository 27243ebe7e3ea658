"""The informer's cache keeps only what the controller reads (issue 13 item 6): no inline user-data, no
last-applied copy of the spec, no managedFields, from the list and from watch events alike."""

from __future__ import annotations

import asyncio
from typing import Any

from .kube_scripted_api import ScriptedApi, WatchStream, proxy
from .test_informer_faults import informer_on

USER_DATA = "#cloud-config\n" + "x" * 64 * 1024


def fat(name: str, rv: int) -> dict[str, Any]:
    obj = proxy(name, rv, cloudInit={"userData": USER_DATA}, port=3128)
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": USER_DATA,
                                      "team": "a"}
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    return obj


async def test_the_cache_keeps_no_user_data_from_lists_or_watches() -> None:
    async def plan(s: WatchStream) -> None:
        await s.send("ADDED", fat("b", 101))
        await asyncio.sleep(3600)

    api = ScriptedApi(items=[fat("a", 90)], plans=[plan])
    async with informer_on(api) as (inf, rec, _):
        await rec.wait_for(lambda: len(rec.events) == 2)
        for name in ("a", "b"):
            obj = inf.get(("default", name))
            assert obj is not None
            assert obj["spec"]["cloudInit"] == {} and obj["spec"]["port"] == 3128
            assert obj["metadata"]["annotations"] == {"team": "a"}
            assert "managedFields" not in obj["metadata"]
            assert obj["metadata"]["uid"] == f"uid-default-{name}"
            assert USER_DATA not in repr(obj)


async def test_the_list_is_read_in_pages() -> None:
    api = ScriptedApi(items=[fat(f"p{i}", 10 + i) for i in range(5)], paginate=True)
    async with informer_on(api, page_size=2) as (inf, rec, _):
        await rec.wait_for(lambda: len(rec.events) == 5)
        assert sorted(k[1] for k in inf.keys()) == [f"p{i}" for i in range(5)]  # noqa: SIM118 - a store
        pages = [(q["limit"], q.get("continue")) for q in api.list_queries]
        assert pages == [("2", None), ("2", "2"), ("2", "4")]
        assert inf.resource_version == "100"
