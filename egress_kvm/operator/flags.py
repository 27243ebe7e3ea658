"""The operator's command-line flags, named and defaulted like a kubebuilder manager's.

Kept apart from the process so flag parsing is tested without starting anything, and so the bare
`egress-kvm --flags` form (what the Deployment runs) and `egress-kvm run --flags` share one definition.
Durations accept Go's syntax (`90s`, `5m`, `1h30m`, `500ms`) as well as plain seconds, because users
copy flags between controller-runtime operators.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from .. import log
from ..policy import namekey

DEFAULT_PROVIDERS_CONFIG = "/etc/proxy-operator/providers.yaml"
DEFAULT_NAMESPACE = "egress-proxies-operator-system"
# Reconcile workers: each waits out its pass's round trips, so more passes in flight, not CPU, is what
# a fleet's creates lack (docs/performance.md, "Round 10").
DEFAULT_WORKERS = 256

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds from `300`, `2.5`, `90s`, `5m`, `1h30m`, `500ms`. Negative durations are refused."""
    value = text.strip()
    if not value:
        raise ValueError("empty duration")
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _PART.finditer(value):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(value) or pos == 0:
            raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m or plain seconds)") from None
    if seconds < 0:
        raise ValueError(f"{text!r}: a duration must not be negative")
    return seconds


@dataclass(frozen=True)
class BindAddress:
    host: str | None  # None: every interface (the `:8080` form)
    port: int

    def __str__(self) -> str:
        return f"{self.host or ''}:{self.port}"


def parse_bind_address(text: str) -> BindAddress | None:
    """`:8080`, `127.0.0.1:8080`, `[::1]:8080`; `0` (or empty) disables the server (None)."""
    value = text.strip()
    if value in ("", "0"):
        return None
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} is not host:port (use :PORT for every interface, 0 to disable)")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is out of range")
    return BindAddress(host or None, port)


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bind_arg(text: str) -> BindAddress | None:
    try:
        return parse_bind_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _level_arg(text: str) -> int:
    try:
        return log.parse_zap_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stacktrace_arg(text: str) -> int:
    try:
        return log.parse_stacktrace_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _choice_arg(enum: type[log.Encoder] | type[log.TimeEncoding], flag: str):  # type: ignore[no-untyped-def]
    names = ", ".join(e.value for e in enum)

    def parse(text: str) -> log.Encoder | log.TimeEncoding:
        try:
            return enum(text.strip().lower())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} is not one of {names}") from None

    return parse


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return n


def _bool_arg(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "t", "true", "yes", "y", "on"):
        return True
    if v in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean")


def add_flags(p: argparse.ArgumentParser) -> None:
    # controller-runtime's zap flags: --zap-devel changes the defaults, the others override them.
    p.add_argument("--zap-devel", type=_bool_arg, nargs="?", const=True, default=False, metavar="BOOL",
                   help="development mode defaults (encoder=console, level=debug, stacktrace-level=warn); "
                        "production mode defaults (encoder=json, level=info, stacktrace-level=error)")
    p.add_argument("--zap-log-level", type=_level_arg, default=None, metavar="LEVEL",
                   help="debug, info, error, or an integer verbosity N (V(N) lines)")
    p.add_argument("--zap-encoder", type=_choice_arg(log.Encoder, "--zap-encoder"), default=None,
                   metavar="ENCODER", help="log encoding: json or console")
    p.add_argument("--zap-stacktrace-level", type=_stacktrace_arg, default=None, metavar="LEVEL",
                   help="level at and above which stack traces are logged: debug, info, warn, error or "
                        "panic (default error; warn with --zap-devel)")
    p.add_argument("--zap-time-encoding", type=_choice_arg(log.TimeEncoding, "--zap-time-encoding"),
                   default=None, metavar="ENCODING",
                   help="epoch, millis, nano, iso8601, rfc3339 or rfc3339nano (default epoch)")
    p.add_argument("--metrics-bind-address", type=_bind_arg, default=parse_bind_address(":8080"),
                   metavar="ADDR", help="where /metrics is served (default :8080; 0 disables)")
    p.add_argument("--health-probe-bind-address", type=_bind_arg, default=parse_bind_address(":8081"),
                   metavar="ADDR", help="where /healthz and /readyz are served (default :8081; 0 disables)")
    # Go's bool flags accept `--leader-elect` and `--leader-elect=true|false`.
    p.add_argument("--leader-elect", type=_bool_arg, nargs="?", const=True, default=False,
                   metavar="BOOL", help="run the controller only while holding the leader Lease")
    p.add_argument("--leader-election-namespace", default="", metavar="NS",
                   help="namespace of the leader Lease (default: the pod's namespace, else "
                        f"{DEFAULT_NAMESPACE})")
    p.add_argument("--leader-election-id", default="egress-kvm.egressproxies.io", metavar="NAME",
                   help="name of the leader Lease")
    p.add_argument("--providers-config", default=DEFAULT_PROVIDERS_CONFIG, metavar="PATH",
                   help=f"providers file (default {DEFAULT_PROVIDERS_CONFIG}); re-read when it changes")
    p.add_argument("--providers-poll-interval", type=_duration_arg, default=10.0, metavar="DURATION",
                   help="how often the providers file is checked for changes (default 10s)")
    p.add_argument("--namespace", default="", metavar="NS",
                   help="watch Proxies in this namespace only (default: all namespaces)")
    p.add_argument("--kubeconfig", default="", metavar="PATH",
                   help="kubeconfig file (default: KUBECONFIG, then the in-cluster service account)")
    p.add_argument("--max-concurrent-reconciles", type=_positive_int, default=DEFAULT_WORKERS, metavar="N",
                   help=f"reconcile workers (default {DEFAULT_WORKERS})")
    p.add_argument("--cluster-id", default="", metavar="ID",
                   help="marks this cluster's VMs on shared hosts (default: the kube-system Namespace uid)")
    p.add_argument("--instance-name-key-file", default=namekey.DEFAULT_PATH, metavar="PATH",
                   help="secret that keys the user-data digest in instance names (default: "
                        f"{namekey.DEFAULT_PATH}; missing: keyed with the cluster id only; "
                        "see docs/security.md)")
    p.add_argument("--resync-period", type=_duration_arg, default=300.0, metavar="DURATION",
                   help="re-reconcile every Proxy this often (default 5m)")
    p.add_argument("--probe-time-refresh", type=_duration_arg, default=0.0, metavar="DURATION",
                   help="write a newer status.lastProbeTime alone this often; 0 (default): never, "
                        "status is written only when something else changed (docs/crd.md)")
    p.add_argument("--gc-interval", type=_duration_arg, default=120.0, metavar="DURATION",
                   help="how often orphan VMs are looked for (default 2m)")
    p.add_argument("--gc-grace-period", type=_duration_arg, default=600.0, metavar="DURATION",
                   help="an orphan VM younger than this is spared (a Create in flight; default 10m)")
    p.add_argument("--graceful-shutdown-timeout", type=_duration_arg, default=25.0, metavar="DURATION",
                   help="on SIGTERM, how long in-flight reconciles may finish (default 25s)")


@dataclass(frozen=True)
class Options:
    zap_devel: bool = False
    zap_log_level: int | None = None  # None: info, or debug with --zap-devel
    zap_encoder: log.Encoder | None = None
    zap_stacktrace_level: int | None = None
    zap_time_encoding: log.TimeEncoding | None = None
    metrics_bind_address: BindAddress | None = BindAddress(None, 8080)
    health_probe_bind_address: BindAddress | None = BindAddress(None, 8081)
    leader_elect: bool = False
    leader_election_namespace: str = ""
    leader_election_id: str = "egress-kvm.egressproxies.io"
    providers_config: str = DEFAULT_PROVIDERS_CONFIG
    providers_poll_interval: float = 10.0
    namespace: str = ""
    kubeconfig: str = ""
    max_concurrent_reconciles: int = DEFAULT_WORKERS
    cluster_id: str = ""
    instance_name_key_file: str = namekey.DEFAULT_PATH
    resync_period: float = 300.0
    probe_time_refresh: float = 0.0
    gc_interval: float = 120.0
    gc_grace_period: float = 600.0
    graceful_shutdown_timeout: float = 25.0

    def zap_options(self) -> log.ZapOptions:
        return log.ZapOptions(development=self.zap_devel, level=self.zap_log_level,
                              encoder=self.zap_encoder, stacktrace_level=self.zap_stacktrace_level,
                              time_encoding=self.zap_time_encoding)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        return cls(**{name: getattr(args, name) for name in cls.__dataclass_fields__})


def parse_options(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="egress-kvm run")
    add_flags(p)
    return Options.from_args(p.parse_args(argv))
