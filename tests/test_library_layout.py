"""`mcuforge compile --layout library` in the build systems users bring it into, and the
placement options of the generated C (issue 12, items 1 and 2).

Two models exported by PyTorch and Keras (tests/models/) are compiled as libraries; user
programs written here link them through a real CMake run (host gcc; arm-none-eabi-gcc with the
board's start-up code, run under QEMU), through a Zephyr-style CMake tree (Zephyr's library
functions stubbed), from C++ with one arena buffer shared by both models, and with the arena
and weights in named sections (checked in the objects' section tables). Outputs are compared
with onnxruntime and with the default project layout's outputs."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, require, require_tools

from mcuforge.cli import main

MODELS = REPO / "tests" / "models"
A, B = MODELS / "torch_lenet.onnx", MODELS / "keras_small_cnn.onnx"
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2"]

# a user program: runs model a on a.in, then model b on b.in; writes a.out and b.out
APP_C = r"""
#include <stdio.h>
#include "a.h"
#include "b.h"

static int io(const char *path, void *buf, size_t n, int write) {
    FILE *f = fopen(path, write ? "wb" : "rb");
    size_t got;
    if (!f) return 1;
    got = write ? fwrite(buf, 1, n, f) : fread(buf, 1, n, f);
    fclose(f);
    return got != n;
}

int main(void) {
    a_init();
    b_init();
    if (io("a.in", a_input(0), a_input_bytes(0), 0) || a_invoke() != 0 ||
        io("a.out", a_output(0), a_output_bytes(0), 1)) return 1;
    if (io("b.in", b_input(0), b_input_bytes(0), 0) || b_invoke() != 0 ||
        io("b.out", b_output(0), b_output_bytes(0), 1)) return 2;
    return 0;
}
"""


def _run(args, cwd=None):
    r = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, args))}:\n{r.stdout}{r.stderr}"
    return r


def _library(tmp_path, model, name, board="host", layout="library"):
    out = tmp_path / name
    assert main(["compile", str(model), "-o", str(out), "--name", name, "--board", board,
                 "--layout", layout]) == 0
    return out


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((1, 3, 32, 32)).astype(np.float32),
            "b": rng.standard_normal((1, 32, 32, 3)).astype(np.float32)}


def _reference(model, x):
    ort = require("onnxruntime")
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def expected():
    """onnxruntime's outputs, and the default project layout's (mcuforge run on the host)."""
    from mcuforge.runner import run
    x = _inputs()
    return {k: (_reference(m, x[k]), run(str(m), x[k])) for k, m in (("a", A), ("b", B))}


def _check(got: dict, expected):
    for k, (ref, default_layout) in expected.items():
        y = np.frombuffer(got[k], np.float32).reshape(ref.shape)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(y, default_layout.reshape(ref.shape))


def _write_inputs(folder: Path):
    for k, x in _inputs().items():
        (folder / f"{k}.in").write_bytes(x.tobytes())


def test_library_files(tmp_path):
    """The library holds the model and its integration files only: no harness, no Makefile;
    the runtime headers NAME.c includes are all there."""
    out = _library(tmp_path, A, "a")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert [f for f in files if not f.startswith(("src/", "zephyr/"))] == [
        ".mcuforge-manifest", "CMakeLists.txt", "library.json", "library.properties"]
    assert not {"main.c", "Makefile", "link.ld"} & {Path(f).name for f in files}
    code = (out / "src" / "a.c").read_text()
    for h in re.findall(r'#include "([^"]+)"', code):
        assert (out / "src" / h).is_file(), h


def test_cmake_host_two_models(tmp_path, expected):
    """add_subdirectory of two model libraries, one user program linking both: built by
    cmake with gcc, run, each model's output equals onnxruntime's and the default layout's."""
    require_tools("cmake", "gcc")
    _library(tmp_path, A, "a")
    _library(tmp_path, B, "b")
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.c").write_text(APP_C)
    (app / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(app C)\n"
        "add_subdirectory(../a a)\nadd_subdirectory(../b b)\n"
        "add_executable(app main.c)\n"
        "target_link_libraries(app PRIVATE mcuforge::a mcuforge::b)\n")
    build = tmp_path / "build"
    _run(["cmake", "-S", app, "-B", build, "-DCMAKE_C_COMPILER=gcc",
          "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", build])
    _write_inputs(build)
    _run([build / "app"], cwd=build)
    _check({k: (build / f"{k}.out").read_bytes() for k in "ab"}, expected)


def _cmake_firmware(tmp_path, model, x, definitions: str, main_patch=None):
    """The library of `model` compiled for mps2-an386 (Cortex-M4) and built by cmake with
    arm-none-eabi-gcc (toolchain settings on the command line, try-compile as a static
    library) with the library's compile `definitions`, linked with the start-up code, harness
    (`main_patch`: (old, new) text in it) and linker script of the default project layout, run
    under QEMU on input `x`. (outputs, cmake build dir, library dir, graph, board)."""
    require_tools("cmake", "arm-none-eabi-gcc", "qemu-system-arm")
    from mcuforge.board import load_board
    from mcuforge.target import parse_output, run_elf
    from mcuforge.api import compile as compile_model
    board = load_board("mps2-an386")
    lib = _library(tmp_path, model, "m", board=board.name)
    proj = tmp_path / "proj"
    r = compile_model(str(model), proj, board=board.name, name="m", vectors=[[x]])
    app = tmp_path / "app"
    app.mkdir()
    for f in ("main.c", "startup.c", "mf_board.c", "mf_board.h", "inputs.h", "link.ld"):
        shutil.copy(proj / f, app / f)
    if main_patch:
        text = (app / "main.c").read_text()
        assert main_patch[0] in text
        (app / "main.c").write_text(text.replace(*main_patch))
    (app / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(fw C)\n"
        f"add_subdirectory({lib} lib)\n"
        "add_executable(fw.elf main.c startup.c mf_board.c)\n"
        "target_compile_definitions(fw.elf PRIVATE MF_SEMIHOSTING=1)\n"
        "target_link_libraries(fw.elf PRIVATE mcuforge::m m)\n"
        f"target_compile_definitions(mcuforge_m PRIVATE {definitions})\n"
        f"target_link_options(fw.elf PRIVATE {' '.join(board.ldflags)} -Wl,--gc-sections "
        "-T ${CMAKE_CURRENT_SOURCE_DIR}/link.ld)\n")
    build = tmp_path / "build"
    _run(["cmake", "-S", app, "-B", build, "-DCMAKE_SYSTEM_NAME=Generic",
          "-DCMAKE_C_COMPILER=arm-none-eabi-gcc", "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY",
          f"-DCMAKE_C_FLAGS={' '.join(board.cflags)}", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", build])
    outs, ticks, _ = parse_output(run_elf(board, build / "fw.elf"), r.graph, board)
    assert len(ticks) == 1
    return outs, build, lib, board


def test_cmake_arm_firmware_under_qemu(tmp_path):
    """The float model as a CMake-built Cortex-M4 firmware, its arena and weights placed in
    sections of the user's choosing (ones the board's linker script gathers by pattern): in
    the ELF they sit in RAM and flash, aligned as asked, and under QEMU the outputs equal the
    default layout's firmware's and onnxruntime's."""
    from mcuforge.target import run_on_board
    x = _inputs()["a"]
    outs, build, lib, board = _cmake_firmware(
        tmp_path, A, x, 'MCUFORGE_ARENA_SECTION=".bss.mf_arena" '
        'MCUFORGE_WEIGHTS_SECTION=".rodata.mf_weights" MCUFORGE_ARENA_ALIGN=32')
    secs, syms = _sections(build / "lib" / "libmcuforge_m.a", "arm-none-eabi-readelf")
    assert secs[syms["arena"][0]] == (".bss.mf_arena", 32)
    weights = re.findall(r"static const \w+ (\w+)\[\d+\] MF_TABLE",
                         (lib / "src" / "m.c").read_text())
    assert weights and all(secs[syms[w][0]][0] == ".rodata.mf_weights" for w in weights)
    addr = {ln.split()[-1]: int(ln.split()[0], 16)
            for ln in _run(["arm-none-eabi-nm", build / "fw.elf"]).stdout.splitlines()}
    assert addr["arena"] % 32 == 0
    assert board.ram_origin <= addr["arena"] < board.ram_origin + board.ram_size
    assert all(board.flash_origin <= addr[w] < board.flash_origin + board.flash_size
               for w in weights)
    default = run_on_board(str(A), [x[None]], board.name).outputs
    np.testing.assert_array_equal(outs[0], default[0])
    np.testing.assert_allclose(outs[0][0], _reference(A, x), rtol=1e-4, atol=1e-5)


def test_cmake_arm_int8_user_arena_under_qemu(tmp_path):
    """MLPerf Tiny's int8 KWS with its DSP micro-kernels, built with M_USER_ARENA: the harness
    hands it a buffer of its own (init_with_arena instead of init) and the outputs under QEMU
    equal the default layout's firmware's byte for byte."""
    from conftest import mlperf_model
    from mcuforge.target import run_on_board
    model = mlperf_model("kws_ref_model")
    x = np.random.default_rng(1).integers(-128, 128, (1, 49, 10, 1), dtype=np.int8)
    call = "    m_init();\n"
    outs, build, *_ = _cmake_firmware(tmp_path, model, x, "M_USER_ARENA", (
        call, "    static uint64_t buffer[(M_ARENA_SIZE + 7) / 8];\n"
              "    if (m_init_with_arena(buffer, sizeof buffer) != 0) return 1;\n"))
    syms = _run(["arm-none-eabi-nm", "-S", build / "fw.elf"]).stdout
    assert re.search(r" \w+ [bB] buffer\.\d+\n|[bB] buffer\n", syms), "the harness's buffer"
    arena = [ln.split() for ln in syms.splitlines() if ln.endswith(" arena")]
    assert arena and all(int(a[1], 16) <= 8 for a in arena), arena  # a pointer, no array
    default = run_on_board(str(model), [x[None]], "mps2-an386").outputs
    np.testing.assert_array_equal(outs[0], default[0])


CPP_APP = r"""
#include <cstdint>
#include <cstdio>
#include "a.h"
#include "b.h"

#define MAX(x, y) ((x) > (y) ? (x) : (y))
static std::uint64_t shared[(MAX(A_ARENA_SIZE, B_ARENA_SIZE) + 7) / 8];

static int io(const char *path, void *buf, std::size_t n, bool write) {
    std::FILE *f = std::fopen(path, write ? "wb" : "rb");
    if (!f) return 1;
    std::size_t got = write ? std::fwrite(buf, 1, n, f) : std::fread(buf, 1, n, f);
    std::fclose(f);
    return got != n;
}

int main() {
    unsigned char *bytes = reinterpret_cast<unsigned char *>(shared);
    /* the checks: no buffer, too small, misaligned, no arena given yet */
    if (a_invoke() != A_ERROR_NO_ARENA) return 10;
    if (a_init_with_arena(nullptr, sizeof shared) != A_ERROR_NO_ARENA) return 11;
    if (a_init_with_arena(shared, A_ARENA_SIZE - 1) != A_ERROR_ARENA_TOO_SMALL) return 12;
    if (a_init_with_arena(bytes + 4, A_ARENA_SIZE) != A_ERROR_ARENA_MISALIGNED) return 13;
    /* both models in one buffer, one after the other, a first again after b */
    if (a_init_with_arena(shared, sizeof shared) != 0) return 14;
    if (b_init_with_arena(shared, sizeof shared) != 0) return 15;
    /* both models' buffers lie in the shared one */
    unsigned char *ia = static_cast<unsigned char *>(a_input(0));
    unsigned char *ib = static_cast<unsigned char *>(b_input(0));
    if (ia < bytes || ia + a_input_bytes(0) > bytes + sizeof shared ||
        ib < bytes || ib + b_input_bytes(0) > bytes + sizeof shared) return 16;
    if (io("b.in", b_input(0), b_input_bytes(0), false) || b_invoke() != 0 ||
        io("b.first", b_output(0), b_output_bytes(0), true)) return 17;
    if (io("a.in", a_input(0), a_input_bytes(0), false) || a_invoke() != 0 ||
        io("a.out", a_output(0), a_output_bytes(0), true)) return 18;
    if (io("b.in", b_input(0), b_input_bytes(0), false) || b_invoke() != 0 ||
        io("b.out", b_output(0), b_output_bytes(0), true)) return 19;
    return 0;
}
"""


def test_cpp_program_two_models_share_one_arena(tmp_path, expected):
    """A C++ program (g++ -Wall -Wextra -Werror -pedantic) includes both headers and gives
    both models one buffer (NAME_USER_ARENA): the checks return their error codes, and each
    model's output is right though the other ran in the same memory in between."""
    require_tools("gcc", "g++")
    objs = []
    for name, model in (("a", A), ("b", B)):
        src = _library(tmp_path, model, name) / "src"
        objs.append(tmp_path / f"{name}.o")
        _run(["gcc", *CFLAGS, f"-D{name.upper()}_USER_ARENA", "-c", src / f"{name}.c",
              "-o", objs[-1]])
        # no static arena left in the object: the buffer is the caller's
        syms = _run(["nm", "-S", objs[-1]]).stdout
        assert not [ln for ln in syms.splitlines() if ln.endswith(" arena")
                    and int(ln.split()[1], 16) > 8], syms
    (tmp_path / "main.cpp").write_text(CPP_APP)
    _run(["g++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2",
          f"-I{tmp_path / 'a' / 'src'}", f"-I{tmp_path / 'b' / 'src'}", "-c",
          tmp_path / "main.cpp", "-o", tmp_path / "main.o"])
    _run(["g++", tmp_path / "main.o", *objs, "-o", tmp_path / "app", "-lm"])
    _write_inputs(tmp_path)
    _run([tmp_path / "app"], cwd=tmp_path)
    got = {k: (tmp_path / f"{k}.out").read_bytes() for k in "ab"}
    _check(got, expected)
    assert (tmp_path / "b.first").read_bytes() == got["b"]


def test_init_with_arena_needs_user_arena_build(tmp_path):
    """Built without NAME_USER_ARENA, the model keeps its static arena and init_with_arena
    says so instead of pretending to use the buffer."""
    src = _library(tmp_path, A, "a") / "src"
    (tmp_path / "t.c").write_text(
        '#include "a.h"\nstatic unsigned long long buf[(A_ARENA_SIZE + 7) / 8];\n'
        "int main(void) { return a_init_with_arena(buf, sizeof buf) == A_ERROR_NOT_USER_ARENA"
        " ? 0 : 1; }\n")
    _run(["gcc", *CFLAGS, f"-I{src}", tmp_path / "t.c", src / "a.c", "-o", tmp_path / "t",
          "-lm"])
    _run([tmp_path / "t"])


def _sections(obj: Path, readelf="readelf") -> tuple:
    """({section index: (name, alignment)}, {symbol: (section index, value)})."""
    secs = {}
    for m in re.finditer(r"^\s*\[\s*(\d+)\]\s+(\S+)\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+\S*\s+\S+"
                         r"\s+\S+\s+(\d+)\s*$", _run([readelf, "-SW", obj]).stdout, re.M):
        secs[int(m[1])] = (m[2], int(m[3]))
    syms = {}
    for ln in _run([readelf, "-sW", obj]).stdout.splitlines():
        f = ln.split()
        if len(f) == 8 and f[6].isdigit():
            syms[f[7]] = (int(f[6]), int(f[1], 16))
    return secs, syms


@pytest.mark.parametrize("cc,readelf", [("gcc", "readelf"),
                                        ("arm-none-eabi-gcc", "arm-none-eabi-readelf")])
def test_sections_and_alignment(tmp_path, cc, readelf):
    """MCUFORGE_ARENA_SECTION / MCUFORGE_WEIGHTS_SECTION / MCUFORGE_ARENA_ALIGN put the arena
    and every weight table where asked (the object's section table says so); a per-model
    name wins over the generic one; a bad alignment is a compile error."""
    require_tools(cc, readelf)
    src = _library(tmp_path, A, "a", board="mps2-an386") / "src"
    cpu = ["-mcpu=cortex-m4", "-mthumb"] if cc.startswith("arm") else []
    obj = tmp_path / "a.o"
    base = [cc, *CFLAGS, *cpu, "-c", src / "a.c", "-o", obj]
    _run(base)
    secs, syms = _sections(obj, readelf)
    assert not {n for n, _ in secs.values()} & {".mf_arena", ".mf_weights", ".a_arena"}
    _run(base + ['-DMCUFORGE_ARENA_SECTION=".mf_arena"', '-DMCUFORGE_WEIGHTS_SECTION=".mf_weights"',
                 "-DMCUFORGE_ARENA_ALIGN=64"])
    secs, syms = _sections(obj, readelf)
    tables = re.findall(r"static const \w+ (\w+)\[\d+\] MF_TABLE", (src / "a.c").read_text())
    assert len(tables) >= 8
    for t in tables:
        assert secs[syms[t][0]][0] == ".mf_weights", t
    sec, value = syms["arena"]
    assert secs[sec] == (".mf_arena", 64) and value % 64 == 0
    # the model's own name takes precedence over the generic one
    _run(base + ['-DMCUFORGE_ARENA_SECTION=".mf_arena"', '-DA_ARENA_SECTION=".a_arena"'])
    secs, syms = _sections(obj, readelf)
    assert secs[syms["arena"][0]][0] == ".a_arena"
    r = subprocess.run([str(a) for a in base + ["-DA_ARENA_ALIGN=4"]], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "A_ARENA_ALIGN must be a power of two" in r.stderr


ZEPHYR_STUBS = """
# Zephyr's library functions as cmake/modules/extensions.cmake defines them, reduced to what
# a module's CMakeLists.txt calls: enough to build the module outside a Zephyr tree.
macro(zephyr_library_named name)
  set(ZEPHYR_CURRENT_LIBRARY ${name})
  add_library(${name} STATIC "")
endmacro()
macro(zephyr_library_sources)
  target_sources(${ZEPHYR_CURRENT_LIBRARY} PRIVATE ${ARGN})
endmacro()
function(zephyr_include_directories)
  foreach(d ${ARGN})
    set_property(GLOBAL APPEND PROPERTY ZEPHYR_INCLUDES ${d})
  endforeach()
endfunction()
"""


def test_zephyr_module(tmp_path, expected):
    """zephyr/module.yml parses and holds only keys of Zephyr's module schema, naming files
    that exist; its Kconfig defines the symbol its CMake tests; the CMake, run with Zephyr's
    library functions stubbed and the symbol set, builds a library a program links and runs."""
    require_tools("cmake", "gcc")
    yaml = require("yaml")
    out = _library(tmp_path, A, "a")
    _library(tmp_path, B, "b")
    meta = yaml.safe_load((out / "zephyr" / "module.yml").read_text())
    assert set(meta) <= {"name", "build", "samples", "tests", "boards", "blobs", "security"}
    assert set(meta["build"]) <= {"cmake", "kconfig", "cmake-ext", "kconfig-ext", "depends",
                                  "settings", "sysbuild-cmake", "sysbuild-kconfig"}
    # the types of Zephyr's schema (scripts/zephyr_module.py, METADATA_SCHEMA)
    assert isinstance(meta["name"], str) and re.fullmatch(r"[A-Za-z0-9_-]+", meta["name"])
    assert all(isinstance(meta["build"][k], str) for k in ("cmake", "kconfig"))
    assert (out / meta["build"]["cmake"] / "CMakeLists.txt").is_file()
    kconfig = (out / meta["build"]["kconfig"]).read_text()
    symbol = re.search(r"^config (\w+)\n\tbool ", kconfig, re.M)[1]
    assert f"if(CONFIG_{symbol})" in (out / "zephyr" / "CMakeLists.txt").read_text()
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.c").write_text(APP_C)
    (app / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(app C)\n" + ZEPHYR_STUBS
        + f"set(CONFIG_{symbol} y)\nset(CONFIG_MCUFORGE_B y)\n"
        "add_subdirectory(../a/zephyr a)\nadd_subdirectory(../b/zephyr b)\n"
        "get_property(incs GLOBAL PROPERTY ZEPHYR_INCLUDES)\n"
        "add_executable(app main.c)\ntarget_include_directories(app PRIVATE ${incs})\n"
        "target_link_libraries(app PRIVATE mcuforge_a mcuforge_b m)\n")
    build = tmp_path / "build"
    _run(["cmake", "-S", app, "-B", build, "-DCMAKE_C_COMPILER=gcc",
          "-DCMAKE_C_FLAGS=-std=c99 -Wall -Wextra -Werror"])
    _run(["cmake", "--build", build])
    _write_inputs(build)
    _run([build / "app"], cwd=build)
    _check({k: (build / f"{k}.out").read_bytes() for k in "ab"}, expected)


ARDUINO_CATEGORIES = {"Display", "Communication", "Signal Input/Output", "Sensors",
                      "Device Control", "Timing", "Data Storage", "Data Processing", "Other"}


def test_arduino_and_platformio_manifests(tmp_path):
    """library.properties has the fields of the Arduino library specification (1.5) with
    valid values, src/ holds the sources and the header it names; library.json is valid
    JSON with PlatformIO's fields, its name a slug, and its folders and header exist."""
    out = _library(tmp_path, A, "a")
    props = dict(ln.split("=", 1) for ln in (out / "library.properties").read_text().splitlines()
                 if ln and not ln.startswith("#"))
    for key in ("name", "version", "author", "maintainer", "sentence", "paragraph", "category",
                "architectures"):
        assert props.get(key), key
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _.-]*", props["name"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", props["version"])
    assert props["category"] in ARDUINO_CATEGORIES
    for h in props["includes"].split(","):
        assert (out / "src" / h.strip()).is_file()
    assert (out / "src" / "a.c").is_file()
    pio = json.loads((out / "library.json").read_text())
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", pio["name"]) and len(pio["name"]) <= 50
    assert re.fullmatch(r"\d+\.\d+\.\d+", pio["version"])
    assert 0 < len(pio["description"]) <= 255
    assert (out / pio["build"]["srcDir"] / "a.c").is_file()
    assert (out / pio["build"]["includeDir"] / pio["headers"]).is_file()


def test_switching_layouts_in_one_folder(tmp_path):
    """Compiling a library where a project was (and back) replaces mcuforge's own files and
    removes the ones no longer written, src/ and zephyr/ included."""
    out = _library(tmp_path, A, "a", layout="project")
    assert (out / "Makefile").is_file()
    _library(tmp_path, A, "a")
    assert not (out / "Makefile").exists() and not (out / "a.c").exists()
    assert (out / "src" / "a.c").is_file()
    _library(tmp_path, A, "a", layout="project")
    assert not (out / "src").exists() and not (out / "zephyr").exists()
    assert (out / "a.c").is_file()
