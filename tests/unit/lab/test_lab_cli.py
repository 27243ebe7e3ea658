"""`egress-kvm lab` argument handling: bad values are refused naming the flag, before anything runs."""

import pytest

from egress_kvm.cli import build_parser


@pytest.mark.parametrize(("argv", "flag"), [
    (["lab", "up", "--index", "8"], "--index"),
    (["lab", "up", "--index", "x"], "--index"),
    (["lab", "up", "--hosts", "0"], "--hosts"),
    (["lab", "down", "--index", "-1"], "--index"),
])
def test_bad_flag_values_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert flag in capsys.readouterr().err


def test_up_defaults():
    args = build_parser().parse_args(["lab", "up"])
    assert (args.index, args.hosts, args.no_image, args.state_dir) == (0, 1, False, None)


def test_lab_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lab"])
    assert "up|down|status" in capsys.readouterr().err
