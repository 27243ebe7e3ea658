"""rpcgen's XDR parser on small inputs: each construct the .x files use, and clear errors on bad input."""

from __future__ import annotations

import pytest

from rpcgen import emit
from rpcgen.xparse import Arm, Decl, Enum, Spec, Struct, Typedef, Union, XParseError, parse, resolve

SOURCE = """
%#include "internal.h"
/* a comment */
const SMALL = 0x10;
const BIG = SMALL;
typedef string name_t<BIG>;
typedef name_t *opt_name;
enum colour { RED = 1, GREEN = 2 };
struct pair {
    unsigned hyper a;
    unsigned b;
    opt_name n;
    char model[32];
    opaque blob<SMALL>;
    int xs<>;
    colour c;
    pair *next;
};
union value switch (int kind) {
 case 1:
 case 2:
     int i;
 case RED:
     void;
 default:
     double d;
};
enum proc {
    /**
     * @generate: both
     * @acl: domain:read
     * @acl: domain:write
     */
    PROC_ONE = 1,

    /** @generate: none */
    PROC_TWO = 2
};
"""


def test_each_construct_parses_to_its_model() -> None:
    spec = parse(SOURCE)
    assert spec.consts == {"SMALL": "0x10", "BIG": "SMALL"}
    assert resolve(spec, "BIG", {}) == 16
    assert resolve(spec, "GREEN", {}) == 2
    assert spec.types["name_t"] == Typedef(Decl("name_t", "string", "var", "BIG"))
    assert spec.types["opt_name"] == Typedef(Decl("opt_name", "name_t", "optional"))
    pair = spec.types["pair"]
    assert isinstance(pair, Struct)
    assert pair.fields == (
        Decl("a", "unsigned hyper"),
        Decl("b", "unsigned int"),
        Decl("n", "opt_name"),
        Decl("model", "char", "fixed", "32"),
        Decl("blob", "opaque", "var", "SMALL"),
        Decl("xs", "int", "var", None),
        Decl("c", "colour"),
        Decl("next", "pair", "optional"),
    )
    assert spec.types["value"] == Union(
        "value",
        Decl("kind", "int"),
        (Arm(("1", "2"), Decl("i", "int")), Arm(("RED",), None), Arm((), Decl("d", "double"))),
    )
    proc = spec.types["proc"]
    assert isinstance(proc, Enum)
    assert proc.members[0].annotations == (
        ("generate", "both"),
        ("acl", "domain:read"),
        ("acl", "domain:write"),
    )
    assert proc.members[1].annotations == (("generate", "none"),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("struct s { int a; }; struct s { int b; };", "s declared twice"),
        ("struct s { string a; };", "a: string needs a size"),
        ("struct s { int a }", "expected ';'"),
        ("program P { };", "unexpected 'program' at top level"),
        ("union u switch (int k) { int a; };", "expected case or default"),
        ("const A = 1; const A = 2;", "const A declared twice"),
        ("struct s { int a; } $", "unexpected '\\$"),
    ],
)
def test_bad_input_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(XParseError, match=message):
        parse(text)


def test_unknown_constant_is_named() -> None:
    with pytest.raises(XParseError, match="unknown constant NOPE"):
        resolve(Spec(), "NOPE", {})


@pytest.mark.parametrize(
    ("protocol", "python"),
    [
        ("callbackID", "callback_id"),
        ("freeMem", "free_mem"),
        ("type", "type_"),
        ("from", "from_"),
        ("timeout", "timeout_"),
        ("need_results", "need_results"),
        ("nrVirtCpu", "nr_virt_cpu"),
        ("cpuNum", "cpu_num"),
        ("usageID", "usage_id"),
        ("hv_ver", "hv_ver"),
    ],
)
def test_protocol_names_become_python_names(protocol: str, python: str) -> None:
    assert emit.field_name(protocol) == python


@pytest.mark.parametrize(
    ("struct", "cls"),
    [
        ("remote_nonnull_domain", "Domain"),
        ("remote_domain_get_state_ret", "DomainGetStateRet"),
        ("remote_nonnull_domain_snapshot", "DomainSnapshot"),
        ("virNetStreamHole", "NetStreamHole"),
        ("remote_domain_ip_addr", "DomainIPAddr"),
        ("remote_storage_vol_get_info_flags_ret", "StorageVolGetInfoRet"),
    ],
)
def test_struct_names_become_class_names(struct: str, cls: str) -> None:
    assert emit.class_name(struct) == cls


def test_unbounded_and_unknown_types_are_unsupported_not_guessed() -> None:
    model = emit.Model(parse("struct s { int xs<>; }; struct t { mystery m; };"))
    with pytest.raises(emit.Unsupported, match="unbounded"):
        model.fields(model.spec.types["s"])  # type: ignore[arg-type]
    with pytest.raises(emit.Unsupported, match="unknown type mystery"):
        model.fields(model.spec.types["t"])  # type: ignore[arg-type]
