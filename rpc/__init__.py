"""A pure-Python asyncio client for libvirt's remote RPC protocol (no libvirt C library).

    async with await rpc.connect_ssh("host", username="virt", client_keys=["key"],
                                     known_hosts="known_hosts") as client:
        dom = await client.domain_lookup_by_name("vm1")

Layers: framing/xdr/procedures/messages and protocol (ClientProtocol: serials, deadlines, streams,
tombstones, subscriptions, keepalive) are the sans-IO core (bytes in, events out); connection is the
thin asyncio shell that moves bytes and completes futures; client adds one method per procedure;
link/transport open unix-socket and SSH-forwarded links. Nothing here knows about Kubernetes.
"""

from .agentevent import AgentLifecycleEvent
from .client import Client
from .constants import (
    AgentLifecycleReason,
    AgentLifecycleState,
    AuthType,
    DomainEventID,
    DomainEventType,
    DomainState,
    ErrorCode,
    InterfaceAddressesSource,
    IPAddrType,
    StoragePoolState,
    StorageVolType,
    error_code_name,
)
from .errors import (
    ConnectFailed,
    ConnectionLost,
    DeadlineExceeded,
    DownloadOverrun,
    EventsLost,
    HostKeyRejected,
    LibvirtError,
    MalformedEvent,
    NotFoundError,
    ProtocolError,
    RpcError,
)
from .events import AgentLifecycleSubscription, LifecycleSubscription
from .observe import CallRecord, Observer
from .streams import Download
from .trace import Direction, PacketTrace, Tracer
from .transport import DEFAULT_SOCKET, DEFAULT_URI, connect_over, connect_ssh, connect_unix, open_ssh
from .types import (
    ConnectListAllDomainsRet,
    ConnectListAllStoragePoolsRet,
    Domain,
    DomainGetStateRet,
    DomainInterface,
    DomainIPAddr,
    LifecycleEvent,
    NodeGetInfoRet,
    RemoteError,
    StoragePool,
    StoragePoolGetInfoRet,
    StoragePoolListAllVolumesRet,
    StorageVol,
    StorageVolGetInfoRet,
)

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_URI",
    "AgentLifecycleEvent",
    "AgentLifecycleReason",
    "AgentLifecycleState",
    "AgentLifecycleSubscription",
    "AuthType",
    "CallRecord",
    "Client",
    "ConnectFailed",
    "ConnectListAllDomainsRet",
    "ConnectListAllStoragePoolsRet",
    "ConnectionLost",
    "DeadlineExceeded",
    "Direction",
    "Domain",
    "DomainEventID",
    "DomainEventType",
    "DomainGetStateRet",
    "DomainIPAddr",
    "DomainInterface",
    "DomainState",
    "Download",
    "DownloadOverrun",
    "ErrorCode",
    "EventsLost",
    "HostKeyRejected",
    "IPAddrType",
    "InterfaceAddressesSource",
    "LibvirtError",
    "LifecycleEvent",
    "LifecycleSubscription",
    "MalformedEvent",
    "NodeGetInfoRet",
    "NotFoundError",
    "Observer",
    "PacketTrace",
    "ProtocolError",
    "RemoteError",
    "RpcError",
    "StoragePool",
    "StoragePoolGetInfoRet",
    "StoragePoolListAllVolumesRet",
    "StoragePoolState",
    "StorageVol",
    "StorageVolGetInfoRet",
    "StorageVolType",
    "Tracer",
    "connect_over",
    "connect_ssh",
    "connect_unix",
    "error_code_name",
    "open_ssh",
]
