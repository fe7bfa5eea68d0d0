"""The communicator's methods and ``OpName`` are written from the operation table.

``scripts/gen_face.py`` writes ``comm/face.py`` and ``operations/names.py``; this test fails
when the table changed and they were not rewritten, and checks that what it wrote is what
users get: one method per row that names a form, with the row's parameters and docstring.
"""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from torchcomms_core import OpName, TorchComm
from torchcomms_core.comm import forms
from torchcomms_core.operations.table import OPS

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_face.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("op", [op for op in OPS if op.form], ids=lambda op: op.name)
def test_each_row_with_a_form_is_a_method_with_its_parameters_and_doc(op) -> None:
    method = getattr(TorchComm, op.name)
    params = list(inspect.signature(method).parameters)
    assert params == ["self", *op.fields, "async_op", "hints", "timeout"]
    doc = inspect.getdoc(method) or ""
    assert doc.split("\n\n") and [" ".join(p.split()) for p in doc.split("\n\n")] == [
        " ".join(p.split()) for p in op.doc.split("\n\n")
    ]
    assert callable(getattr(forms, op.form)), f"{op.name}: form {op.form} is not in comm.forms"


def test_opname_numbers_every_row() -> None:
    assert {m.name: m.value for m in OpName} == {op.name: op.number for op in OPS}


def test_the_generator_sees_a_new_row(tmp_path: Path) -> None:
    """A row added to the table becomes a method: the generator reads the table, not a list."""
    spec = importlib.util.spec_from_file_location("gen_face_copy", ROOT / "scripts" / "gen_face.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen
    spec.loader.exec_module(gen)
    table = gen._table()
    row = table.Op(
        "all_nothing",
        99,
        (table.Param("tensor", table.TENSOR, table.INOUT),),
        form="reduce_in_place",
        doc="A made-up row.",
    )
    table.OPS = (*table.OPS, row)
    gen._table = lambda: table
    text = gen.face()
    assert "    def all_nothing(\n        self,\n        tensor: torch.Tensor," in text
    assert "forms.reduce_in_place(self, call, tensor)" in text
    assert "    all_nothing = 99" in gen.names()
