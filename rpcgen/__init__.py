"""The generator of rpc/'s protocol modules from libvirt's .x files: `python -m rpcgen`.

xparse reads the XDR language, config holds the facts the .x files do not state, emit writes Python.
"""

from __future__ import annotations

from pathlib import Path

from . import config, emit, xparse


def generate(protocol_dir: Path) -> dict[str, str]:
    """Every generated file, by path relative to the repository root."""
    spec = xparse.Spec()
    for name in emit.SOURCES:
        xparse.parse((protocol_dir / name).read_text(), spec)
    model = emit.Model(spec)
    emit.check_hand_written(model)
    procs = emit.procedures(model)
    types = emit.emit_types(model)
    procedures = emit.emit_procedures(model, procs)
    return {
        "rpc/protocol_constants.py": emit.emit_constants(model),
        "rpc/types.py": types,
        "rpc/procedures.py": procedures,
        "rpc/methods.py": emit.emit_methods(model, procs),
        "docs/rpc-procedures.md": emit.emit_docs(model, procs, config.LIBVIRT_RELEASE),
    }
