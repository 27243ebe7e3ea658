"""A simulated host's kernel neighbour entries, written over rtnetlink as `ip neigh` writes them.

The simulator used to run `ip neigh replace|del ...` once per guest boot and forget: a fork+exec and a
watcher thread each, a tenth of a simulated host's CPU at fleet scale, on the cores the operator under
test needs. The same two requests now go over one NETLINK_ROUTE socket, opened in the simulator's own
network namespace (the host's), with what iproute2 puts in them: RTM_NEWNEIGH with NLM_F_CREATE |
NLM_F_REPLACE, ndm_state NUD_PERMANENT, NDA_DST and NDA_LLADDR for `replace IP lladdr MAC dev BR nud
permanent`; RTM_DELNEIGH with NDA_DST for `del IP dev BR`. So the kernel's table ends up as `ip` left
it. Every request asks for the kernel's acknowledgement; a refusal raises `NeighbourError`, naming the
request as the `ip` command it stands for and the kernel's reason.

The requests run on one worker thread, in order: the kernel handles a netlink request in the sender's
own system call, under the RTNL lock another namespace's set-up or teardown may hold for a while, and
the simulator's event loop must not wait on that (it did not wait on an `ip` process either).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import ipaddress
import os
import re
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

RTM_NEWNEIGH = 28
RTM_DELNEIGH = 29
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_CREATE = 0x400
NUD_PERMANENT = 0x80
NDA_DST = 1
NDA_LLADDR = 2
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NDMSG = struct.Struct("=BBHiHBB")  # family, pad1, pad2, ifindex, state, flags, type
_RTATTR = struct.Struct("=HH")  # len, type
_NLMSGERR = struct.Struct("=i")  # the error (negative errno, 0 = acknowledged), then the request's header
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


class NeighbourError(OSError):
    """The kernel refused a neighbour request; str() names it as the `ip` command it stands for."""


class Op(enum.Enum):
    REPLACE = "replace"
    DELETE = "del"


@dataclass(frozen=True)
class Request:
    """One `ip neigh replace IP lladdr MAC dev DEV nud permanent` or `ip neigh del IP dev DEV`."""

    op: Op
    ip: str
    dev: str
    mac: str | None = None  # REPLACE only

    def __post_init__(self) -> None:
        """A ValueError naming the bad value, before anything reaches the kernel."""
        ipaddress.IPv4Address(self.ip)
        if (self.mac is None) != (self.op is Op.DELETE) or (self.mac is not None and
                                                            not _MAC.fullmatch(self.mac)):
            raise ValueError(f"neighbour {self.op.value} of {self.ip}: lladdr {self.mac!r}")

    def command(self) -> str:
        if self.op is Op.REPLACE:
            return f"ip neigh replace {self.ip} lladdr {self.mac} dev {self.dev} nud permanent"
        return f"ip neigh del {self.ip} dev {self.dev}"


def _attr(kind: int, data: bytes) -> bytes:
    size = _RTATTR.size + len(data)
    return _RTATTR.pack(size, kind) + data + b"\0" * (-size % 4)


def encode(request: Request, *, ifindex: int, seq: int) -> bytes:
    """The netlink message iproute2 sends for `request` (with NLM_F_ACK, as its rtnl_talk asks)."""
    attrs = _attr(NDA_DST, ipaddress.IPv4Address(request.ip).packed)
    if request.op is Op.REPLACE:
        assert request.mac is not None
        attrs += _attr(NDA_LLADDR, bytes.fromhex(request.mac.replace(":", "")))
        kind, flags = RTM_NEWNEIGH, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    else:
        kind, flags = RTM_DELNEIGH, NLM_F_REQUEST | NLM_F_ACK
    body = _NDMSG.pack(socket.AF_INET, 0, 0, ifindex, NUD_PERMANENT, 0, 0) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def ack_errno(data: bytes, *, seq: int) -> int | None:
    """The errno the kernel answered request `seq` with (0: done); None when `data` holds no answer to it."""
    at = 0
    while at + _NLMSGHDR.size <= len(data):
        size, kind, _flags, got_seq, _pid = _NLMSGHDR.unpack_from(data, at)
        if size < _NLMSGHDR.size or at + size > len(data):
            return None
        if kind == NLMSG_ERROR and got_seq == seq and size >= _NLMSGHDR.size + _NLMSGERR.size:
            return -int(_NLMSGERR.unpack_from(data, at + _NLMSGHDR.size)[0])
        at += (size + 3) & ~3
    return None


class Neighbours:
    """One host's neighbour writer: a NETLINK_ROUTE socket and the one thread that uses it."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._sock: socket.socket | None = None
        self._seq = 0
        self._closed = False

    async def apply(self, request: Request) -> None:
        """Send `request` and wait for the kernel's answer; NeighbourError when it refuses, or when this
        writer is closed (a request after close() must not start a thread nobody ends)."""
        if self._closed:
            raise NeighbourError(errno.ESHUTDOWN, f"{request.command()}: the neighbour writer is closed")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-neigh")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._apply, request)

    def _apply(self, request: Request) -> None:  # on the worker thread only
        try:
            ifindex = socket.if_nametoindex(request.dev)
        except OSError:
            raise NeighbourError(errno.ENODEV, f"{request.command()}: Cannot find device "
                                               f"{request.dev!r}") from None
        self._seq += 1
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                self._sock.bind((0, 0))
            self._sock.send(encode(request, ifindex=ifindex, seq=self._seq))
            while (code := ack_errno(self._sock.recv(65536), seq=self._seq)) is None:
                pass
        except OSError as exc:  # the socket's own failure (ENOBUFS: an answer was dropped): a new one next
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            code = exc.errno or errno.EIO
            raise NeighbourError(code, f"{request.command()}: {os.strerror(code)}") from None
        if code:
            raise NeighbourError(code, f"{request.command()}: {os.strerror(code)}")

    def close(self) -> None:
        """Wait for the requests already sent, then end the thread and close the socket; for good."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
