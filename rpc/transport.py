"""Ways to reach libvirtd: its unix socket directly, or that socket forwarded over SSH.

Over SSH the socket is reached with a direct-streamlocal channel (asyncssh's open_unix_connection), the
same thing `ssh -L` or libvirt's `qemu+ssh` nc helper achieve, without a remote process. One SSH
connection can carry many such channels: `connect_over` opens a libvirt client on an SSH connection the
caller owns, `connect_ssh` opens (and owns) its own. Host keys are checked by asyncssh against the
known_hosts file given; there is no default, so skipping the check is always an explicit `None`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from typing import Any, Protocol, cast

import asyncssh

from .client import Client
from .coalesce import CoalescingConnector
from .connection import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_EVENT_QUEUE,
    DEFAULT_KEEPALIVE_COUNT,
    DEFAULT_KEEPALIVE_INTERVAL,
    DOWNLOAD_HIGH_WATER,
)
from .errors import ConnectFailed, HostKeyRejected, LibvirtError, RpcError
from .link import BaseLink, SSHLink, open_unix_link
from .observe import Observer
from .trace import Tracer

DEFAULT_URI = "qemu:///system"
DEFAULT_SOCKET = "/var/run/libvirt/libvirt-sock"
DEFAULT_CONNECT_TIMEOUT = 30.0
#: AES-GCM first: in asyncssh it runs as one OpenSSL AEAD call per packet (AES-NI), measurably cheaper
#: than chacha20-poly1305 (asyncssh's first choice) for the same security; the rest are fallbacks.
#: `encryption_algs=` passed to connect_ssh/open_ssh overrides it.
PREFERRED_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


async def _open_client(
    link: BaseLink,
    *,
    uri: str | None,
    timeout: float,
    call_timeout: float,
    observer: Observer | None,
    keepalive_interval: float | None,
    keepalive_count: int,
    readonly: bool,
    event_queue_max: int,
    download_high_water: int = DOWNLOAD_HIGH_WATER,
    tracer: Tracer | None = None,
) -> Client:
    """Run the handshake on `link`; `timeout` bounds the whole of it (what is left of connect_*'s)."""
    client = Client(
        link,
        call_timeout=call_timeout,
        observer=observer,
        event_queue_max=event_queue_max,
        download_high_water=download_high_water,
        tracer=tracer,
    )
    try:
        async with asyncio.timeout(timeout) as whole:
            await client._handshake(
                uri=uri,
                readonly=readonly,
                keepalive_interval=keepalive_interval,
                keepalive_count=keepalive_count,
                timeout=timeout,
            )
    except BaseException as e:
        await client._finish_close()
        if isinstance(e, TimeoutError) and whole.expired():
            raise ConnectFailed(f"{link.description}: handshake not done within {timeout:.2g} s") from None
        if isinstance(e, ConnectFailed | LibvirtError) or not isinstance(e, RpcError):
            raise
        raise ConnectFailed(f"{link.description}: handshake failed: {e}") from e
    return client


class Dialer(Protocol):
    """One way to reach libvirtd's socket: `dial` returns a connected link or raises ConnectFailed."""

    description: str

    async def dial(self, timeout: float) -> BaseLink: ...


class UnixDialer:
    """libvirtd's unix socket, directly (an asyncio.Protocol on it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.description = f"unix:{path}"

    async def dial(self, timeout: float) -> BaseLink:
        try:
            return await asyncio.wait_for(open_unix_link(self.path), timeout)
        except TimeoutError:
            raise ConnectFailed(f"{self.description}: no connection within {timeout:g} s") from None
        except OSError as e:
            raise ConnectFailed(f"{self.description}: {e.strerror or e}") from e


class SSHDialer:
    """libvirtd's unix socket through an SSH direct-streamlocal channel (an asyncssh session on it).
    With `owns_ssh`, closing the link closes the SSH connection too."""

    def __init__(
        self, ssh_conn: asyncssh.SSHClientConnection, socket_path: str, *, owns_ssh: bool = False
    ) -> None:
        self.ssh_conn = ssh_conn
        self.socket_path = socket_path
        self.owns_ssh = owns_ssh
        host = ssh_conn.get_extra_info("peername") or ("?", 0)
        self.description = f"ssh://{host[0]}:{host[1]}{socket_path}"

    async def _close_ssh(self) -> None:
        self.ssh_conn.close()
        with contextlib.suppress(TimeoutError):  # close() already dropped the transport; don't hang on it
            await asyncio.wait_for(self.ssh_conn.wait_closed(), 5.0)

    async def dial(self, timeout: float) -> BaseLink:
        where = self.description
        on_close = self._close_ssh if self.owns_ssh else None
        # asyncssh types session factories as SSHUNIXSession; SSHLink has that shape (connection_made,
        # data_received, eof_received, connection_lost, pause/resume_writing) without the base class.
        factory = cast(Any, lambda: SSHLink(description=where, on_close=on_close))
        try:
            _, session = await asyncio.wait_for(
                self.ssh_conn.create_unix_connection(factory, self.socket_path, encoding=None), timeout
            )
            link = cast(SSHLink, session)
        except TimeoutError:
            raise ConnectFailed(f"{where}: the SSH server opened no channel within {timeout:g} s") from None
        except asyncssh.ChannelOpenError as e:
            raise ConnectFailed(
                f"{where}: the SSH server refused to forward the libvirt socket: {e.reason} "
                "(is libvirtd running there, and may the SSH user open its socket?)"
            ) from e
        except (asyncssh.Error, OSError) as e:
            raise ConnectFailed(f"{where}: {e}") from e
        return link


class _Deadline:
    """One connect timeout shared by its steps (SSH, channel, handshake): each gets what is left."""

    def __init__(self, timeout: float, where: str) -> None:
        self._end = asyncio.get_running_loop().time() + timeout
        self._timeout = timeout
        self._where = where

    def left(self) -> float:
        left = self._end - asyncio.get_running_loop().time()
        if left <= 0:
            raise ConnectFailed(f"{self._where}: not connected within {self._timeout:g} s")
        return left


def _check_timeout(name: str, value: float | None) -> float:
    if value is None or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


async def connect_unix(
    path: str,
    uri: str | None = DEFAULT_URI,
    *,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    observer: Observer | None = None,
    keepalive_interval: float | None = DEFAULT_KEEPALIVE_INTERVAL,
    keepalive_count: int = DEFAULT_KEEPALIVE_COUNT,
    readonly: bool = False,
    event_queue_max: int = DEFAULT_EVENT_QUEUE,
    download_high_water: int = DOWNLOAD_HIGH_WATER,
    tracer: Tracer | None = None,
) -> Client:
    """A client on libvirtd's unix socket at `path`, handshake done (auth, keepalive, CONNECT_OPEN uri).
    `tracer` receives one record per packet (header fields only; see rpc.trace)."""
    timeout = _check_timeout("timeout", timeout)
    _check_timeout("call_timeout", call_timeout)
    deadline = _Deadline(timeout, f"unix:{path}")
    link = await UnixDialer(path).dial(timeout)
    try:
        left = deadline.left()
    except ConnectFailed:
        await link.aclose()
        raise
    return await _open_client(
        link,
        uri=uri,
        timeout=left,
        call_timeout=call_timeout,
        observer=observer,
        keepalive_interval=keepalive_interval,
        keepalive_count=keepalive_count,
        readonly=readonly,
        event_queue_max=event_queue_max,
        download_high_water=download_high_water,
        tracer=tracer,
    )


async def connect_over(
    ssh_conn: asyncssh.SSHClientConnection,
    *,
    socket_path: str = DEFAULT_SOCKET,
    uri: str | None = DEFAULT_URI,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    observer: Observer | None = None,
    keepalive_interval: float | None = DEFAULT_KEEPALIVE_INTERVAL,
    keepalive_count: int = DEFAULT_KEEPALIVE_COUNT,
    readonly: bool = False,
    event_queue_max: int = DEFAULT_EVENT_QUEUE,
    download_high_water: int = DOWNLOAD_HIGH_WATER,
    tracer: Tracer | None = None,
    _owns_ssh: bool = False,
) -> Client:
    """A client on an SSH connection the caller already has; its close() closes only its own channel."""
    timeout = _check_timeout("timeout", timeout)
    _check_timeout("call_timeout", call_timeout)
    dialer = SSHDialer(ssh_conn, socket_path, owns_ssh=_owns_ssh)
    deadline = _Deadline(timeout, dialer.description)
    link = await dialer.dial(timeout)
    try:
        left = deadline.left()
    except ConnectFailed:
        await link.aclose()
        raise
    return await _open_client(
        link,
        uri=uri,
        timeout=left,
        call_timeout=call_timeout,
        observer=observer,
        keepalive_interval=keepalive_interval,
        keepalive_count=keepalive_count,
        readonly=readonly,
        event_queue_max=event_queue_max,
        download_high_water=download_high_water,
        tracer=tracer,
    )


async def open_ssh(
    host: str,
    port: int = 22,
    *,
    username: str | None = None,
    client_keys: Sequence[Any] | None = None,
    known_hosts: str | os.PathLike[str] | None,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    coalesce: bool = False,
    **ssh_options: Any,
) -> asyncssh.SSHClientConnection:
    """An SSH connection with the same checks connect_ssh makes, for callers who share one per host.
    `coalesce`: the writes of one event-loop turn leave in one send (coalesce.py; needs config=None)."""
    timeout = _check_timeout("timeout", timeout)
    where = f"ssh://{username + '@' if username else ''}{host}:{port}"
    kh: Any = None
    if known_hosts is not None:
        kh = os.fspath(known_hosts)
        if not os.path.isfile(kh):  # noqa: ASYNC240 - one stat before connecting, on purpose
            raise ConnectFailed(f"{where}: known_hosts file {kh!r} does not exist")
    options: dict[str, Any] = {"known_hosts": kh, "encryption_algs": PREFERRED_CIPHERS}
    if coalesce:
        # One send per loop turn (coalesce.py). It makes the TCP connection itself, so a tunnel, socket
        # or proxy command (given, in an options object, or from an ssh config file) would be bypassed:
        # refuse those instead.
        clash = sorted({"tunnel", "sock", "proxy_command", "options"} & ssh_options.keys())
        if clash or ssh_options.get("config", ()) is not None:
            raise ValueError(f"open_ssh: coalesce=True needs config=None and no "
                             f"{', '.join(clash) or 'tunnel'} (it opens the TCP connection itself)")
        create = {k: ssh_options.pop(k) for k in ("family", "flags", "local_addr") if k in ssh_options}
        options["tunnel"] = CoalescingConnector(**create)
    if username is not None:
        options["username"] = username
    if client_keys is not None:
        options["client_keys"] = list(client_keys)
    options.update(ssh_options)
    try:
        return await asyncio.wait_for(asyncssh.connect(host, port, **options), timeout)
    except TimeoutError:
        raise ConnectFailed(f"{where}: no SSH connection within {timeout:g} s") from None
    except asyncssh.HostKeyNotVerifiable as e:
        raise HostKeyRejected(
            f"{where}: host key not accepted: it is not in known_hosts {kh!r} (unknown host, or the key "
            f"changed): {e.reason}"
        ) from e
    except asyncssh.PermissionDenied as e:
        raise ConnectFailed(f"{where}: SSH authentication failed for user {username!r}: {e.reason}") from e
    except asyncssh.Error as e:
        raise ConnectFailed(f"{where}: SSH error: {e.reason}") from e
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as e:
        raise ConnectFailed(f"{where}: client_keys {_key_names(client_keys)}: cannot load a key: {e}") from e
    except OSError as e:
        if e.filename:
            what = f"{e.strerror}: {e.filename!r}"
        elif e.errno and e.strerror and os.strerror(e.errno) not in e.strerror:
            what = f"{os.strerror(e.errno)} ({e.strerror})"
        else:
            what = e.strerror or str(e)
        raise ConnectFailed(f"{where}: {what}") from e


def _key_names(keys: Sequence[Any] | None) -> str:
    """Key paths as given (never key material) for error messages."""
    if keys is None:
        return "(default)"
    names = [repr(os.fspath(k)) if isinstance(k, str | os.PathLike) else type(k).__name__ for k in keys]
    return "[" + ", ".join(names) + "]"


async def connect_ssh(
    host: str,
    port: int = 22,
    *,
    username: str | None = None,
    client_keys: Sequence[Any] | None = None,
    known_hosts: str | os.PathLike[str] | None,
    socket_path: str = DEFAULT_SOCKET,
    uri: str | None = DEFAULT_URI,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    observer: Observer | None = None,
    keepalive_interval: float | None = DEFAULT_KEEPALIVE_INTERVAL,
    keepalive_count: int = DEFAULT_KEEPALIVE_COUNT,
    readonly: bool = False,
    event_queue_max: int = DEFAULT_EVENT_QUEUE,
    download_high_water: int = DOWNLOAD_HIGH_WATER,
    tracer: Tracer | None = None,
    **ssh_options: Any,
) -> Client:
    """A client through its own SSH connection (closed with the client). `known_hosts` is required:
    a path, or None to skip host-key checking explicitly. Extra keywords go to asyncssh.connect.
    `timeout` bounds the whole: SSH connection, channel and handshake together."""
    timeout = _check_timeout("timeout", timeout)
    deadline = _Deadline(timeout, f"ssh://{username + '@' if username else ''}{host}:{port}")
    ssh_conn = await open_ssh(
        host,
        port,
        username=username,
        client_keys=client_keys,
        known_hosts=known_hosts,
        timeout=timeout,
        **ssh_options,
    )
    try:
        return await connect_over(
            ssh_conn,
            socket_path=socket_path,
            uri=uri,
            timeout=deadline.left(),
            call_timeout=call_timeout,
            observer=observer,
            keepalive_interval=keepalive_interval,
            keepalive_count=keepalive_count,
            readonly=readonly,
            event_queue_max=event_queue_max,
            download_high_water=download_high_water,
            tracer=tracer,
            _owns_ssh=True,
        )
    except BaseException:
        ssh_conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ssh_conn.wait_closed(), 5.0)
        raise
