"""The operator's flags: names, defaults and parsing as a kubebuilder manager has them."""

from __future__ import annotations

import logging

import pytest

from egress_kvm.operator.flags import BindAddress, Options, parse_bind_address, parse_duration, parse_options


def test_defaults() -> None:
    o = parse_options([])
    assert o == Options()
    assert o.metrics_bind_address == BindAddress(None, 8080)
    assert o.health_probe_bind_address == BindAddress(None, 8081)
    assert o.providers_config == "/etc/proxy-operator/providers.yaml"
    assert o.max_concurrent_reconciles == 256
    assert o.leader_elect is False
    assert o.namespace == ""


def test_every_flag_parses() -> None:
    o = parse_options([
        "--zap-log-level=debug", "--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:9440",
        "--leader-elect", "--leader-election-namespace=ops", "--providers-config=/tmp/p.yaml",
        "--namespace=team-a", "--kubeconfig=/tmp/kc", "--max-concurrent-reconciles=8",
        "--cluster-id=abc", "--resync-period=1m", "--gc-interval=30s", "--gc-grace-period=1h",
        "--probe-time-refresh=10m",
    ])
    assert o.zap_log_level == logging.INFO - 1
    assert o.metrics_bind_address is None
    assert o.health_probe_bind_address == BindAddress("127.0.0.1", 9440)
    assert o.leader_elect is True
    assert o.leader_election_namespace == "ops"
    assert o.providers_config == "/tmp/p.yaml"
    assert o.namespace == "team-a"
    assert o.kubeconfig == "/tmp/kc"
    assert o.max_concurrent_reconciles == 8
    assert o.cluster_id == "abc"
    assert (o.resync_period, o.gc_interval, o.gc_grace_period) == (60, 30, 3600)
    assert o.probe_time_refresh == 600
    assert parse_options([]).probe_time_refresh == 0  # default: a lone lastProbeTime is never written


@pytest.mark.parametrize("text,expected", [("--leader-elect=false", False), ("--leader-elect=true", True),
                                           ("--leader-elect", True)])
def test_go_style_bool(text: str, expected: bool) -> None:
    assert parse_options([text]).leader_elect is expected


@pytest.mark.parametrize("level,expected", [("info", logging.INFO), ("error", logging.ERROR),
                                            ("2", logging.INFO - 2)])
def test_zap_levels(level: str, expected: int) -> None:
    assert parse_options([f"--zap-log-level={level}"]).zap_log_level == expected


@pytest.mark.parametrize("argv,needle", [
    (["--zap-log-level=loud"], "--zap-log-level"),
    (["--max-concurrent-reconciles=0"], "at least 1"),
    (["--resync-period=soon"], "not a duration"),
    (["--probe-time-refresh=often"], "not a duration"),
    (["--metrics-bind-address=8080"], "host:port"),
    (["--health-probe-bind-address=:http"], "not a number"),
])
def test_bad_flags_exit_with_a_message_naming_the_value(argv: list[str], needle: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_options(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("text,seconds", [("300", 300), ("2.5", 2.5), ("90s", 90), ("5m", 300),
                                          ("1h30m", 5400), ("500ms", 0.5), ("1m0.5s", 60.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "m5", "-3", "1h-2m", "5 m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text,expected", [(":8080", BindAddress(None, 8080)), ("0", None),
                                           ("[::1]:9", BindAddress("::1", 9)),
                                           ("127.0.0.1:0", BindAddress("127.0.0.1", 0))])
def test_bind_addresses(text: str, expected: BindAddress | None) -> None:
    assert parse_bind_address(text) == expected


def test_bare_command_means_run() -> None:
    from egress_kvm.cli import build_parser

    args = build_parser().parse_args(["run", "--namespace=x"])
    assert args.command == "run" and args.namespace == "x"


def test_zap_flags_as_controller_runtime_has_them() -> None:
    from egress_kvm import log

    o = parse_options(["--zap-devel", "--zap-encoder=json", "--zap-stacktrace-level=panic",
                       "--zap-time-encoding=rfc3339nano"])
    z = o.zap_options()
    assert z.development and z.resolved_encoder is log.Encoder.JSON
    assert z.resolved_level == logging.INFO - 1  # --zap-devel: debug unless --zap-log-level says otherwise
    assert z.resolved_stacktrace_level == logging.CRITICAL
    assert z.resolved_time_encoding is log.TimeEncoding.RFC3339NANO
    dev = parse_options(["--zap-devel=true"]).zap_options()
    assert (dev.resolved_encoder, dev.resolved_stacktrace_level) == (log.Encoder.CONSOLE, logging.WARNING)
    prod = parse_options([]).zap_options()
    assert (prod.resolved_encoder, prod.resolved_level, prod.resolved_stacktrace_level,
            prod.resolved_time_encoding) == (log.Encoder.JSON, logging.INFO, logging.ERROR,
                                             log.TimeEncoding.EPOCH)
    explicit = parse_options(["--zap-devel", "--zap-log-level=error"]).zap_options()
    assert explicit.resolved_level == logging.ERROR


@pytest.mark.parametrize("argv,needle", [
    (["--zap-encoder=xml"], "--zap-encoder: 'xml' is not one of json, console"),
    (["--zap-time-encoding=unix"], "--zap-time-encoding: 'unix' is not one of epoch, millis, nano"),
    (["--zap-stacktrace-level=2"], "--zap-stacktrace-level: '2' is not one of"),
    (["--zap-devel=maybe"], "not a boolean"),
])
def test_bad_zap_flags_name_the_flag(argv: list[str], needle: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_options(argv)
    assert needle in capsys.readouterr().err
