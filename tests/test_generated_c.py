"""Properties of the generated C that the README promises, checked on the C itself.

For the demo model and each MLPerf Tiny int8 model, the model's .c (with its .h and
mcuforge_rt.h, through #include) is preprocessed with gcc and parsed with pycparser; walking the
AST proves: no heap (no malloc/calloc/realloc/free/alloca, not even mentioned), no recursion
(the call graph of the functions defined in the project is acyclic; no calls through pointers),
no variable-length arrays (every array dimension is a constant expression). The raw text
includes only <stdint.h>, <stddef.h>, <string.h> and the project's own headers. Compiling
twice gives byte-identical files, and every project builds with gcc -std=c99 -Wall -Wextra
-Werror -pedantic. Each detector is shown to fire on a small synthetic C file."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pycparser import c_ast, c_parser

from conftest import MLPERF_INT8, mlperf_model
from mcuforge.api import RUNTIME_FILES, compile as compile_model
from mcuforge.tools.demo import demo_tflite_bytes

ALLOWED_SYSTEM_HEADERS = {"stdint.h", "stddef.h", "string.h"}
HEAP_FUNCTIONS = {"malloc", "calloc", "realloc", "free", "alloca", "__builtin_alloca",
                  "__builtin_alloca_with_align", "aligned_alloc", "posix_memalign", "memalign",
                  "valloc", "pvalloc", "reallocarray", "strdup", "strndup"}
WARNING_FLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic")
# gcc -E with the real system headers; the defines strip the GNU extensions pycparser lacks
CPP = ["gcc", "-E", "-std=c99", "-D__attribute__(x)=", "-D__extension__=",
       "-D__restrict=restrict", "-D__restrict__=restrict", "-D__inline=inline",
       "-D__inline__=inline", "-D__asm__(x)=", "-D__asm(x)=", "-D__volatile__=volatile"]
MODELS = ("demo",) + MLPERF_INT8


def build_env():
    """The environment for make: no CFLAGS/CC from outside, so the Makefile's own flags count."""
    return {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "CC", "CPPFLAGS")}


# ---------------------------------------------------------------------------------------------
# The checker


NUMBER = r"[-+]?\s*(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][-+]?\d+)?)[uUlLfF]*"
# an initializer list of number literals only (the weights): nothing in it can call, allocate
# or declare, so it is parsed as {0}; it makes the parse of the largest model 5x faster
NUMBER_LIST = re.compile(r"\{\s*(?:" + NUMBER + r"\s*,\s*)*" + NUMBER + r"\s*,?\s*\}")


def parse(c_file: Path) -> c_ast.FileAST:
    r = subprocess.run(CPP + [str(c_file)], capture_output=True, text=True, cwd=c_file.parent)
    assert r.returncode == 0, f"gcc -E {c_file} failed:\n{r.stderr}"
    return c_parser.CParser().parse(NUMBER_LIST.sub("{0}", r.stdout), str(c_file))


class _Walker(c_ast.NodeVisitor):
    """Collects, within one top-level definition, the identifiers used, the direct and
    indirect calls, and the array declarators."""

    def __init__(self):
        self.ids, self.indirect_calls, self.arrays = [], [], []

    def visit_ID(self, n):
        self.ids.append(n.name)

    def visit_FuncCall(self, n):
        if not isinstance(n.name, c_ast.ID):
            self.indirect_calls.append(str(n.coord))
        self.generic_visit(n)

    def visit_ArrayDecl(self, n):
        self.arrays.append(n)
        self.generic_visit(n)


def is_constant(e, enumerators) -> bool:
    """Is `e` an integer constant expression (so an array with it as dimension is no VLA)?"""
    if isinstance(e, c_ast.Constant):
        return True
    if isinstance(e, c_ast.ID):
        return e.name in enumerators  # a const variable is no constant expression in C
    if isinstance(e, c_ast.UnaryOp):
        if e.op == "sizeof":
            return True
        return e.op in ("-", "+", "~", "!") and is_constant(e.expr, enumerators)
    if isinstance(e, c_ast.BinaryOp):
        return is_constant(e.left, enumerators) and is_constant(e.right, enumerators)
    if isinstance(e, c_ast.TernaryOp):
        return all(is_constant(x, enumerators) for x in (e.cond, e.iftrue, e.iffalse))
    if isinstance(e, c_ast.Cast):
        return is_constant(e.expr, enumerators)
    return False


def find_cycle(graph: dict):
    """A cycle [f, g, ..., f] in the directed graph {node: set of successors}, or None."""
    state, stack = {}, []

    def visit(f):
        state[f] = "open"
        stack.append(f)
        for g in sorted(graph.get(f, ())):
            if state.get(g) == "open":
                return stack[stack.index(g):] + [g]
            if g not in state:
                cycle = visit(g)
                if cycle:
                    return cycle
        stack.pop()
        state[f] = "done"
        return None

    for f in sorted(graph):
        if f not in state:
            cycle = visit(f)
            if cycle:
                return cycle
    return None


def analyze(c_file: Path, own_files) -> dict:
    """Heap functions used, a call cycle, calls through pointers and variable-length arrays in
    the top-level definitions that come from `own_files` (the system headers are not ours)."""
    ast = parse(c_file)
    own = {Path(f).resolve() for f in own_files}
    enumerators = set()

    class Enums(c_ast.NodeVisitor):
        def visit_Enumerator(self, n):
            enumerators.add(n.name)

    Enums().visit(ast)
    ext = [e for e in ast.ext if e.coord and Path(e.coord.file).resolve() in own]
    assert ext, f"nothing of {sorted(map(str, own))} found in the parse of {c_file}"
    defined = {e.decl.name for e in ext if isinstance(e, c_ast.FuncDef)}
    calls, heap, indirect, vlas = {}, set(), [], []
    for e in ext:
        w = _Walker()
        w.visit(e)
        heap |= HEAP_FUNCTIONS & set(w.ids)
        indirect += w.indirect_calls
        vlas += [f"{a.coord}" for a in w.arrays
                 if a.dim is not None and not is_constant(a.dim, enumerators)]
        if isinstance(e, c_ast.FuncDef):
            # every mention of a defined function counts as a call: conservative, so taking a
            # function's address cannot hide a cycle
            calls.setdefault(e.decl.name, set()).update(defined & set(w.ids))
    return dict(functions=defined, calls=calls, cycle=find_cycle(calls), heap=sorted(heap),
                indirect_calls=indirect, vlas=vlas)


INCLUDE = re.compile(r'^\s*#\s*include\b\s*(.*)$', re.M)


def includes(text: str) -> list:
    """Every #include of `text` as "<h>" or '"h"' (a computed #include is returned as is)."""
    return [m.group(1).split("//")[0].split("/*")[0].strip() for m in INCLUDE.finditer(text)]


def bad_includes(files: dict, local: set) -> list:
    """Includes other than the allowed system headers and the project's own `local` headers."""
    allowed = {f"<{h}>" for h in ALLOWED_SYSTEM_HEADERS} | {f'"{h}"' for h in local}
    return [(name, inc) for name, text in files.items() for inc in includes(text)
            if inc not in allowed]


# ---------------------------------------------------------------------------------------------
# The checker on synthetic C: each detector fires


def write(tmp_path, text, name="t.c"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_detects_heap_use(tmp_path):
    c = write(tmp_path, "#include <stdlib.h>\n#include <stdint.h>\n"
                        "void f(void) { int8_t *p = malloc(4); free(p); }\n"
                        "void *(*g)(size_t, size_t) = calloc;\n")
    assert analyze(c, [c])["heap"] == ["calloc", "free", "malloc"]
    c = write(tmp_path, "#include <alloca.h>\nvoid f(int n) { char *p = alloca(n); p[0] = 0; }\n")
    assert analyze(c, [c])["heap"] in (["alloca"], ["__builtin_alloca"])  # glibc's macro
    ok = write(tmp_path, "#include <string.h>\nvoid f(char *p) { memset(p, 0, 4); }\n")
    assert analyze(ok, [ok])["heap"] == []


def test_detects_recursion(tmp_path):
    direct = write(tmp_path, "int f(int n) { return n ? f(n - 1) : 0; }\n")
    assert analyze(direct, [direct])["cycle"] == ["f", "f"]
    indirect = write(tmp_path, """
static int c(int n);
static int a(int n) { return n + 1; }
static int b(int n) { return a(n) ? c(n - 1) : 0; }
static int c(int n) { return n > 0 ? b(n) : a(n); }
int top(void) { return c(3); }
""")
    r = analyze(indirect, [indirect])
    assert r["cycle"] in (["b", "c", "b"], ["c", "b", "c"]) and r["functions"] == {
        "a", "b", "c", "top"}
    through_pointer = write(tmp_path, """
static int g(int n);
static int (*const table[1])(int) = { g };
static int g(int n) { return n ? table[0](n - 1) : 0; }
""")
    assert analyze(through_pointer, [through_pointer])["indirect_calls"]
    acyclic = write(tmp_path, "static int a(void) { return 1; }\n"
                              "static int b(void) { return a() + a(); }\n"
                              "int c(void) { return a() + b(); }\n")
    r = analyze(acyclic, [acyclic])
    assert r["cycle"] is None and r["calls"] == {"a": set(), "b": {"a"}, "c": {"a", "b"}}


def test_detects_variable_length_arrays(tmp_path):
    c = write(tmp_path, """
#include <stdint.h>
enum { N = 4 };
static const int M = 4;
void f(int n) {
    int8_t ok1[16]; int8_t ok2[N * 2 + sizeof(int32_t)]; int8_t ok3[(int)4u];
    int8_t vla1[n]; int8_t vla2[M];
    (void)ok1; (void)ok2; (void)ok3; (void)vla1; (void)vla2;
}
void g(int n, int8_t x[n]) { (void)x; }
static const int8_t table[] = {1, 2};
""")
    assert [v.split(":")[1] for v in analyze(c, [c])["vlas"]] == ["7", "7", "10"]


def test_detects_includes():
    files = {"m.c": '#include "m.h"\n#include "mcuforge_rt.h"\n',
             "m.h": "#include <stdint.h>\n  #  include <stddef.h> /* size_t */\n",
             "rt.h": "#include <string.h>\n#include <math.h>\n#include \"other.h\"\n"
                     "#include HEADER\n"}
    assert bad_includes(files, {"m.h", "mcuforge_rt.h"}) == [
        ("rt.h", "<math.h>"), ("rt.h", '"other.h"'), ("rt.h", "HEADER")]


def test_detectors_pass_on_system_headers_alone(tmp_path):
    """What the system headers declare is not held against the project."""
    c = write(tmp_path, "#include <stdint.h>\n#include <stddef.h>\n#include <string.h>\n"
                        "int32_t f(void) { return 0; }\n")
    r = analyze(c, [c])
    assert (r["heap"], r["cycle"], r["vlas"], r["indirect_calls"]) == ([], None, [], [])


# ---------------------------------------------------------------------------------------------
# The generated projects


def model_source(model: str):
    return demo_tflite_bytes() if model == "demo" else mlperf_model(model)


@pytest.fixture(scope="module", params=MODELS)
def project(request, tmp_path_factory):
    """(model, the compile result) in a directory of its own."""
    model = model_source(request.param)
    result = compile_model(model, tmp_path_factory.mktemp(request.param) / "a")
    return model, result


def read_all(d: Path) -> dict:
    """The generated files (not what `make` adds) of the project in `d`."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())
            if p.suffix in (".c", ".h") or p.name == "Makefile"}


def test_no_heap_no_recursion_no_vla(project):
    _, r = project
    d, name = r.out_dir, r.name
    own = [d / f"{name}.c", d / f"{name}.h", d / "mcuforge_rt.h"]
    a = analyze(d / f"{name}.c", own)
    assert a["heap"] == [], f"heap functions used: {a['heap']}"
    assert a["cycle"] is None, f"recursion: {' -> '.join(a['cycle'])}"
    assert a["indirect_calls"] == [], f"calls through pointers at {a['indirect_calls']}"
    assert a["vlas"] == [], f"variable-length arrays at {a['vlas']}"
    # the walk saw the model's API and the runtime's helpers
    assert {f"{name}_init", f"{name}_invoke"} <= a["functions"]
    assert any(f.startswith("mf_") for f in a["functions"])
    assert a["calls"][f"{name}_invoke"], "invoke calls the layers"


def test_only_allowed_includes(project):
    _, r = project
    runtime = [f for f in RUNTIME_FILES if (r.out_dir / f).exists()]
    files = {f: (r.out_dir / f).read_text() for f in (f"{r.name}.c", f"{r.name}.h", *runtime)}
    # the micro-kernels' DSP path takes its intrinsics from <arm_acle.h>, the compiler's own
    # header (freestanding, no C library), only when building for an Arm core with DSP
    nn = files.get("mcuforge_nn.h", "")
    assert "#include <arm_acle.h>" not in nn or "#if MF_USE_DSP\n#include <arm_acle.h>" in nn
    files["mcuforge_nn.h"] = nn.replace("#include <arm_acle.h>", "")
    assert bad_includes(files, {f"{r.name}.h", *runtime}) == []
    assert '"mcuforge_rt.h"' in includes(files[f"{r.name}.c"])


def test_deterministic(project, tmp_path):
    """The same model gives the same bytes: twice in this process, and in a fresh process with
    another string hash seed (set and dict orders of strings differ between processes)."""
    model, r = project
    first = read_all(r.out_dir)
    assert sorted(first) == r.files
    again = compile_model(model, tmp_path / "b")
    assert again.name == r.name and read_all(tmp_path / "b") == first
    src = model if isinstance(model, Path) else tmp_path / "model.tflite"
    if src != model:
        src.write_bytes(model)
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    code = ("import sys; from mcuforge.api import compile; "
            "compile(sys.argv[1], sys.argv[2], name=sys.argv[3])")
    p = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "c"), r.name],
                       capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
    assert p.returncode == 0, p.stderr
    third = read_all(tmp_path / "c")
    assert sorted(third) == sorted(first)
    for f in first:
        assert third[f] == first[f], f"{f} differs between processes"


def test_builds_without_warnings(project, tmp_path):
    _, r = project
    make = subprocess.run(["make", "-C", str(r.out_dir)], capture_output=True, text=True,
                          env=build_env())
    assert make.returncode == 0, make.stdout + make.stderr
    cc_lines = [ln for ln in make.stdout.splitlines() if f"{r.name}.c" in ln and "-o" in ln]
    assert cc_lines and all(f in cc_lines[0].split() for f in WARNING_FLAGS), make.stdout
    assert "warning" not in make.stderr.lower(), make.stderr
    assert (r.out_dir / r.name).is_file()
    # the model alone, as a user adds it to a firmware project, and its header on its own
    for src, extra in ((f"{r.name}.c", []), (f"{r.name}.h", ["-x", "c"])):
        cc = subprocess.run(["gcc", *WARNING_FLAGS, "-O2", *extra, "-c", src, "-o",
                             str(tmp_path / "x.o")], cwd=r.out_dir, capture_output=True,
                            text=True)
        assert cc.returncode == 0 and cc.stderr == "", f"{src}:\n{cc.stderr}"
