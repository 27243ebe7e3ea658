"""Wire constants of libvirt's remote protocol, and the libvirt enums callers compare results with.

Program numbers and limits come from the vendored .x files through the generated protocol_constants
(one place for each fact); the enums (virerror.h, libvirt-*.h) are IntEnum so a value read off the wire
prints with its name in logs and test failures.
"""

from __future__ import annotations

import enum

from . import protocol_constants as _x

# -- programs and limits (generated from the .x files) -------------------------------------------
KEEPALIVE_PROC_PING = _x.KEEPALIVE_PROC_PING
KEEPALIVE_PROC_PONG = _x.KEEPALIVE_PROC_PONG
KEEPALIVE_PROGRAM = _x.KEEPALIVE_PROGRAM
KEEPALIVE_PROTOCOL_VERSION = _x.KEEPALIVE_PROTOCOL_VERSION
#: libvirt's QEMU-specific program (agent and monitor commands, qemu_protocol.x): the client never
#: calls it; a server (the simulator, testbed/sim) receives it from virsh.
QEMU_PROGRAM = 0x20008087
REMOTE_AUTH_TYPE_LIST_MAX = _x.REMOTE_AUTH_TYPE_LIST_MAX
REMOTE_DOMAIN_INTERFACE_MAX = _x.REMOTE_DOMAIN_INTERFACE_MAX
REMOTE_DOMAIN_IP_ADDR_MAX = _x.REMOTE_DOMAIN_IP_ADDR_MAX
REMOTE_DOMAIN_LIST_MAX = _x.REMOTE_DOMAIN_LIST_MAX
REMOTE_PROGRAM = _x.REMOTE_PROGRAM
REMOTE_PROTOCOL_VERSION = _x.REMOTE_PROTOCOL_VERSION
REMOTE_STORAGE_POOL_LIST_MAX = _x.REMOTE_STORAGE_POOL_LIST_MAX
REMOTE_STORAGE_VOL_LIST_MAX = _x.REMOTE_STORAGE_VOL_LIST_MAX
REMOTE_STRING_MAX = _x.REMOTE_STRING_MAX
VIR_UUID_BUFLEN = _x.VIR_UUID_BUFLEN

# -- framing ----------------------------------------------------------------------------------------
LEN_SIZE = 4
HEADER_SIZE = 24
#: Smallest legal packet: the length word plus the header, no payload.
MIN_PACKET = LEN_SIZE + HEADER_SIZE
#: VIR_NET_MESSAGE_MAX: the most a packet may hold after its length word (32 MiB; 16 MiB on old daemons).
MESSAGE_MAX = _x.VIR_NET_MESSAGE_MAX
#: The payload of one stream packet as libvirt's own client sizes it (VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX);
#: the payload ceiling is MESSAGE_MAX.
STREAM_CHUNK = _x.VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX


class MessageType(enum.IntEnum):
    CALL = 0
    REPLY = 1
    MESSAGE = 2
    STREAM = 3
    CALL_WITH_FDS = 4
    REPLY_WITH_FDS = 5
    STREAM_HOLE = 6


class MessageStatus(enum.IntEnum):
    OK = 0
    ERROR = 1
    CONTINUE = 2




class AuthType(enum.IntEnum):
    NONE = 0
    SASL = 1
    POLKIT = 2


#: CONNECT_SUPPORTS_FEATURE feature number that turns server keepalive on for the connection.
FEATURE_PROGRAM_KEEPALIVE = 10
CONNECT_RO = 1


class ErrorCode(enum.IntEnum):
    """virErrorNumber values this client names; any other code is kept as a plain int."""

    OK = 0
    INTERNAL_ERROR = 1
    NO_MEMORY = 2
    NO_SUPPORT = 3
    UNKNOWN_HOST = 4
    NO_CONNECT = 5
    INVALID_CONN = 6
    INVALID_DOMAIN = 7
    INVALID_ARG = 8
    OPERATION_FAILED = 9
    GET_FAILED = 10
    POST_FAILED = 11
    HTTP_ERROR = 12
    SEXPR_SERIAL = 13
    NO_XEN = 14
    XEN_CALL = 15
    OS_TYPE = 16
    NO_KERNEL = 17
    NO_ROOT = 18
    NO_SOURCE = 19
    NO_TARGET = 20
    NO_NAME = 21
    NO_OS = 22
    NO_DEVICE = 23
    NO_XENSTORE = 24
    DRIVER_FULL = 25
    CALL_FAILED = 26
    XML_ERROR = 27
    DOM_EXIST = 28
    OPERATION_DENIED = 29
    OPEN_FAILED = 30
    READ_FAILED = 31
    PARSE_FAILED = 32
    CONF_SYNTAX = 33
    WRITE_FAILED = 34
    XML_DETAIL = 35
    INVALID_NETWORK = 36
    NETWORK_EXIST = 37
    SYSTEM_ERROR = 38
    RPC = 39
    GNUTLS_ERROR = 40
    NO_WEB = 41
    NO_DOMAIN = 42
    NO_NETWORK = 43
    INVALID_MAC = 44
    AUTH_FAILED = 45
    INVALID_STORAGE_POOL = 46
    INVALID_STORAGE_VOL = 47
    NO_STORAGE_POOL = 49
    NO_STORAGE_VOL = 50
    NO_NODE = 51
    INVALID_NODE_DEVICE = 52
    NO_NODE_DEVICE = 53
    NO_SECURITY_MODEL = 54
    OPERATION_INVALID = 55
    NO_INTERFACE = 57
    MULTIPLE_INTERFACES = 59
    BUILD_FIREWALL = 60
    NO_STORAGE_POOL_SOURCE = 61
    CPU_INCOMPATIBLE = 63
    XML_INVALID_SCHEMA = 64
    HOOK_SCRIPT_FAILED = 65
    INVALID_DOMAIN_SNAPSHOT = 66
    CONFIG_UNSUPPORTED = 67
    OPERATION_TIMEOUT = 68
    MIGRATE_PERSIST_FAILED = 69
    NO_DOMAIN_SNAPSHOT = 72
    INVALID_STREAM = 73
    ARGUMENT_UNSUPPORTED = 74
    STORAGE_PROBE_FAILED = 75
    STORAGE_POOL_BUILT = 76
    SNAPSHOT_REVERT_RISKY = 77
    OPERATION_ABORTED = 78
    AUTH_CANCELLED = 79
    NO_DOMAIN_METADATA = 80
    MIGRATE_UNSAFE = 81
    OVERFLOW = 82
    BLOCK_COPY_ACTIVE = 83
    OPERATION_UNSUPPORTED = 84
    SSH = 85
    AGENT_UNRESPONSIVE = 86
    RESOURCE_BUSY = 87
    ACCESS_DENIED = 88
    DBUS_SERVICE = 89
    STORAGE_VOL_EXIST = 90
    CPU_INCOMPATIBLE_OLD = 91
    XML_INVALID_SCHEMA_OLD = 92
    MIGRATE_FINISH_OK = 93
    AUTH_UNAVAILABLE = 94
    NO_SERVER = 95
    NO_CLIENT = 96
    AGENT_UNSYNCED = 97
    LIBSSH = 98
    DEVICE_MISSING = 99
    INVALID_NWFILTER_BINDING = 100
    NO_NWFILTER_BINDING = 101


def error_code_name(code: int) -> str:
    """The virErrorNumber name without its VIR_ERR_ prefix ("NO_DOMAIN"), or "UNKNOWN_<n>"."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"UNKNOWN_{code}"


class DomainState(enum.IntEnum):
    NOSTATE = 0
    RUNNING = 1
    BLOCKED = 2
    PAUSED = 3
    SHUTDOWN = 4
    SHUTOFF = 5
    CRASHED = 6
    PMSUSPENDED = 7


#: virDomainPausedReason IOERROR: paused because a disk write failed (typically a full pool).
DOMAIN_PAUSED_IOERROR = 5


class DomainEventID(enum.IntEnum):
    LIFECYCLE = 0
    REBOOT = 1
    AGENT_LIFECYCLE = 18


class AgentLifecycleState(enum.IntEnum):
    """virConnectDomainEventAgentLifecycleState: the guest agent's channel opened or closed."""

    CONNECTED = 1
    DISCONNECTED = 2


class AgentLifecycleReason(enum.IntEnum):
    """virConnectDomainEventAgentLifecycleReason: why libvirt reports the agent's state."""

    UNKNOWN = 0
    DOMAIN_STARTED = 1  # the state was found while the domain started (or libvirtd reconnected)
    CHANNEL = 2  # the guest opened or closed the channel


class DomainEventType(enum.IntEnum):
    DEFINED = 0
    UNDEFINED = 1
    STARTED = 2
    SUSPENDED = 3
    RESUMED = 4
    STOPPED = 5
    SHUTDOWN = 6
    PMSUSPENDED = 7
    CRASHED = 8


class StoragePoolState(enum.IntEnum):
    INACTIVE = 0
    BUILDING = 1
    RUNNING = 2
    DEGRADED = 3
    INACCESSIBLE = 4


class StorageVolType(enum.IntEnum):
    FILE = 0
    BLOCK = 1
    DIR = 2
    NETWORK = 3
    NETDIR = 4
    PLOOP = 5


class InterfaceAddressesSource(enum.IntEnum):
    LEASE = 0
    AGENT = 1
    ARP = 2


class IPAddrType(enum.IntEnum):
    IPV4 = 0
    IPV6 = 1


# -- flags callers pass ---------------------------------------------------------------------------
DOMAIN_METADATA_DESCRIPTION = 0
DOMAIN_METADATA_TITLE = 1
DOMAIN_METADATA_ELEMENT = 2
DOMAIN_AFFECT_CURRENT = 0
DOMAIN_AFFECT_LIVE = 1
DOMAIN_AFFECT_CONFIG = 2
DOMAIN_UNDEFINE_MANAGED_SAVE = 1
DOMAIN_UNDEFINE_SNAPSHOTS_METADATA = 2
DOMAIN_UNDEFINE_NVRAM = 4
DOMAIN_DESTROY_DEFAULT = 0
DOMAIN_DESTROY_GRACEFUL = 1
CONNECT_LIST_DOMAINS_ACTIVE = 1
CONNECT_LIST_DOMAINS_INACTIVE = 2
CONNECT_LIST_DOMAINS_PERSISTENT = 4
CONNECT_LIST_DOMAINS_TRANSIENT = 8
STORAGE_VOL_DELETE_NORMAL = 0
DOMAIN_XML_SECURE = 1
DOMAIN_XML_INACTIVE = 2
