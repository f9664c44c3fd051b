"""The loop IR: the printer's C and the Python evaluator agree, and the evaluator flags UB."""
import subprocess

import numpy as np
import pytest

from mcuforge.codegen_c import loop_ir as ir
from mcuforge.codegen_c.evaluate import UndefinedBehaviour, run_kernel
from mcuforge.codegen_c.printer import c_float, print_array, print_kernel
from mcuforge.codegen_c.resources import data_dir


def _kernel():
    """y[i, j] = clamp(mf_mbqm(sum_k (x[i, k] - 3) * w[k, j], mult[j], shift[j]) - 5, -128, 127)"""
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, size=(6, 4)).astype(np.int8)
    mult = np.array([1 << 30, 1518500250, 2 ** 31 - 1, 1 << 30], dtype=np.int32)
    shift = np.array([-3, -7, 1, 0], dtype=np.int32)

    def body(i, j):
        acc = ir.Var("acc")
        mac = lambda k: [ir.Assign("acc", acc + (ir.cast(ir.Load("x", i * 6 + k, "int8"), "int32") - 3)
                                  * ir.cast(ir.Load("w", k * 4 + j, "int8"), "int32"))]
        v = ir.call("mf_mbqm", acc, ir.Load("mult", j, "int32"), ir.Load("shift", j, "int32")) - 5
        return [ir.Decl("acc", "int32", ir.Const(0)), *ir.loops([("k", 6)], mac),
                ir.If(acc.gt(1000), (ir.Assign("acc", acc >> 1),)),
                ir.Store("y", i * 4 + j, ir.cast(ir.clamp(v, -128, 127), "int8"))]

    bufs = (ir.Buffer("x", "int8", 18, "in"), ir.Buffer("y", "int8", 12, "out"),
            ir.Buffer("w", "int8", 24, "const", w), ir.Buffer("mult", "int32", 4, "const", mult),
            ir.Buffer("shift", "int32", 4, "const", shift))
    return ir.Kernel("k", bufs, ir.loops([("i", 3), ("j", 4)], body), "test kernel")


def test_printed_c_matches_evaluator(tmp_path):
    k = _kernel()
    x = np.random.default_rng(1).integers(-128, 128, size=18).astype(np.int8)
    y = np.zeros(12, np.int8)
    run_kernel(k, {"x": x, "y": y})
    names = {b.name: f"k_{b.name}" for b in k.consts}
    consts = "\n".join(print_array(names[b.name], b.dtype, b.data) for b in k.consts)
    src = f"""#include <stdio.h>
#include "mcuforge_rt.h"
{consts}
{print_kernel(k, names)}
int main(void) {{
    static const int8_t x[18] = {{{", ".join(map(str, x.tolist()))}}};
    int8_t y[12];
    k(x, y);
    for (int i = 0; i < 12; ++i) printf("%d\\n", y[i]);
    return 0;
}}
"""
    (tmp_path / "t.c").write_text(src)
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-I", str(data_dir("runtime_c")), "-o", str(tmp_path / "t"), str(tmp_path / "t.c")],
                   check=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout
    assert [int(v) for v in out.split()] == y.tolist()
    assert len(set(y.tolist())) > 3  # not degenerate


def test_evaluator_flags_signed_overflow():
    body = (ir.Decl("a", "int32", ir.Const(2 ** 30)), ir.Assign("a", ir.Var("a") * 4),
            ir.Store("y", ir.Const(0), ir.Var("a")))
    k = ir.Kernel("k", (ir.Buffer("y", "int32", 1, "out"),), body)
    with pytest.raises(UndefinedBehaviour):
        run_kernel(k, {"y": np.zeros(1, np.int32)})


def test_builders_fold_index_arithmetic():
    i = ir.Var("i")
    assert ir.flat_index([0, i, 2], [1, 5, 3]) == ir.Bin("+", ir.Bin("*", i, ir.Const(3), "int32"),
                                                         ir.Const(2), "int32")
    assert (i + 2) + 3 == i + 5
    assert i * 1 + 0 == i


@pytest.mark.parametrize("v", [0.1, -3.5, 1e-38, 3.4028235e38, 1.0, 16777217.0, 2 ** -149])
def test_float_literals_round_trip(v):
    text = c_float(v)
    assert text.endswith("f")
    assert np.float32(float.fromhex(text[:-1]) if "0x" in text else float(text[:-1])) == np.float32(v)


def test_printer_keeps_right_operand_grouping():
    from mcuforge.codegen_c.printer import Printer
    oy = ir.Var("oy")
    assert Printer().text(8 - (oy - 1)) == "8 - (oy - 1)"
    k = ir.Var("k")
    assert Printer().text((oy - k) - 8) == "oy - k - 8"
    assert Printer().text(oy - (k - 8)) == "oy - (k - 8)"
    assert Printer().text(oy + (k - 8)) == "oy + (k - 8)"  # k may be a local: could overflow
    loop = ir.Loop("k", 4, (ir.Store("y", oy + (k - 8), ir.Const(0)),))
    assert "y[oy + k - 8]" in Printer().stmts((ir.Loop("oy", 2, (loop,)),), 0)[2]
    assert Printer().text(ir.binop("/", 12, ir.binop("*", oy, 2))) == "12 / (oy * 2)"
