"""`egress-kvm emulator`: serve the Kubernetes API emulator until SIGTERM/SIGINT.

For the local demo and manual kubectl sessions: it writes a kubeconfig (cluster, user and context all
named `emulator`) and serves plain HTTP on loopback. See docs/emulator.md.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from egress_kvm import log
from testbed.emulator import Emulator


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise argparse.ArgumentTypeError(f"--listen: {value!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "emulator", help="serve a Kubernetes API emulator (for tests and the local demo)", description=__doc__
    )
    p.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 6443),
        metavar="HOST:PORT",
        help="address to serve plain HTTP on (default 127.0.0.1:6443; port 0 picks a free one)",
    )
    p.add_argument(
        "--kubeconfig-out",
        metavar="PATH",
        help="write a kubeconfig for the emulator here (context 'emulator', namespace 'default')",
    )
    p.add_argument(
        "--namespace-create",
        action="append",
        default=[],
        metavar="NAME",
        help="create this namespace at start (repeatable; default, kube-system, kube-public exist)",
    )
    p.add_argument(
        "--bookmark-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between BOOKMARK events on watches that allow them (default 10)",
    )
    p.add_argument(
        "--zap-log-level", default="info", help="log verbosity: info, debug (every request), error"
    )
    p.set_defaults(func=_run)


async def _run(args: argparse.Namespace) -> int:
    log.configure(args.zap_log_level)
    logger = log.get_logger("emulator")
    host, port = args.listen
    emu = Emulator(host=host, port=port, bookmark_interval=args.bookmark_interval)
    for ns in args.namespace_create:
        if emu.store.get(("", "namespaces"), "", ns) is None:
            emu.create_namespace(ns)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await emu.start()
    try:
        if args.kubeconfig_out:
            path = emu.write_kubeconfig(args.kubeconfig_out)
            logger.info("kubeconfig written", path=str(path))
        print(f"emulator serving on {emu.url}", flush=True)
        await stop.wait()
    finally:
        await emu.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    logger.info("emulator stopped")
    return 0
