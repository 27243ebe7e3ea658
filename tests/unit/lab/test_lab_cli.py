"""`egress-kvm lab` argument handling: bad values are refused naming the flag, before anything runs."""

import pytest

from egress_kvm.cli import build_parser


@pytest.mark.parametrize(("argv", "flag"), [
    (["lab", "up", "--index", "8"], "--index"),
    (["lab", "up", "--index", "x"], "--index"),
    (["lab", "up", "--hosts", "0"], "--hosts"),
    (["lab", "down", "--index", "-1"], "--index"),
    (["lab", "up", "--small-pool", "x"], "--small-pool"),
    (["lab", "up", "--small-pool", "8"], "--small-pool"),
    (["lab", "up", "--small-pool", "70000"], "--small-pool"),
    (["lab", "pool", "--size", "big"], "--size"),
    (["lab", "pool", "--size", "0"], "--size"),
    (["lab", "pool"], "--size"),
])
def test_bad_flag_values_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert flag in capsys.readouterr().err


def test_up_defaults():
    args = build_parser().parse_args(["lab", "up"])
    assert (args.index, args.hosts, args.no_image, args.state_dir) == (0, 1, False, None)
    assert args.small_pool is None


def test_small_pool_flags():
    assert build_parser().parse_args(["lab", "up", "--small-pool", "1536"]).small_pool == 1536
    args = build_parser().parse_args(["lab", "pool", "--index", "3", "--host", "host1", "--size", "16384"])
    assert (args.index, args.host, args.size) == (3, "host1", "16384")
    assert build_parser().parse_args(["lab", "pool", "--size", "none"]).size == "none"


def test_no_dhcp_flag():
    assert build_parser().parse_args(["lab", "up", "--no-dhcp"]).no_dhcp
    assert not build_parser().parse_args(["lab", "up"]).no_dhcp


def test_lab_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lab"])
    assert "up|down|status|pool" in capsys.readouterr().err


def test_simulated_flags():
    argv = ["lab", "up", "--simulated", "--hosts", "10", "--knobs", '{"boot_delay_s": 5}']
    args = build_parser().parse_args(argv)
    assert (args.simulated, args.hosts, args.knobs) == (True, 10, '{"boot_delay_s": 5}')
    assert build_parser().parse_args(["lab", "down", "--simulated"]).simulated
    assert not build_parser().parse_args(["lab", "status"]).simulated


@pytest.mark.parametrize(("argv", "message"), [
    (["lab", "up", "--knobs", '{"boot_delay_s": 5}'], "--knobs: only a --simulated lab has knobs"),
    (["lab", "up", "--simulated", "--knobs", "[1]"], "--knobs: not a JSON object"),
    (["lab", "up", "--simulated", "--knobs", "{"], "--knobs: not a JSON object"),
    (["lab", "up", "--simulated", "--small-pool", "64"], "--small-pool: a simulated host has no pool"),
])
def test_bad_knobs_are_refused_naming_the_flag_before_anything_runs(argv, message, capsys):
    args = build_parser().parse_args(argv)
    assert args.func(args) == 1
    assert message in capsys.readouterr().err
