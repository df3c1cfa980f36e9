"""Generates src/agent_rewind/api/v1 from protos/ and copies protos/ into the Node client
(clients/node/protos) (run by `make proto`).

Generator versions are pinned in pyproject.toml (grpcio-tools, mypy-protobuf) so the
output is reproducible; tests/unit/api/test_generated_code.py fails when the committed
code, or the Node client's copy, differs from what this script produces.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "src" / "agent_rewind" / "api" / "v1"
# The Node client loads .proto files at run time (@grpc/proto-loader); a committed copy in its
# package means npm installs it as it is, with no install script to make the copy.
NODE_PROTOS = ROOT / "clients" / "node" / "protos"
_IMPORT = re.compile(r"^from agent_rewind\.v1 import", re.MULTILINE)


def generate(out: Path) -> None:
    """Writes the generated modules for every proto under protos/ into `out`."""
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        bindir = Path(sys.executable).parent
        args = [
            "protoc",
            f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *sources,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*_pb2*"):
            old.unlink()
        for path in sorted((Path(tmp) / "agent_rewind" / "v1").iterdir()):
            text = _IMPORT.sub("from agent_rewind.api.v1 import", path.read_text())
            (out / path.name).write_text(text)
    (out / "__init__.py").write_text(
        '"""Generated from protos/agent_rewind/v1 by `make proto`. Do not edit."""\n'
    )


def copy_protos(out: Path) -> None:
    """Makes `out` hold exactly the .proto files under protos/, at the same relative paths."""
    shutil.rmtree(out, ignore_errors=True)
    for proto in sorted(PROTOS.rglob("*.proto")):
        target = out / proto.relative_to(PROTOS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto, target)


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    generate(target)
    print(f"generated {sorted(p.name for p in target.iterdir() if p.suffix in ('.py', '.pyi'))}")
    if target == OUT:
        copy_protos(NODE_PROTOS)
        print(f"copied protos/ to {NODE_PROTOS.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
    shutil.rmtree(OUT / "__pycache__", ignore_errors=True)
