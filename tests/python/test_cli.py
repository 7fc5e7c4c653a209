"""End-to-end tests of the `gcz` command line (docs/CLI.md).

- Every file of the hostile corpus (tests/corrupt/, made by tests/corrupt/make_corpus.py) through
  `gcz verify`, `gcz info` and `gcz decode`, and every hostile input through `gcz encode` and
  `gcz eval`: the exit code that tests/corrupt/README.md documents, one `gcz: error: ...` line on
  stderr naming the file and the FORMAT.md §6 rule, and no output file (nor temporary) left behind.
- Usage errors, missing files, unknown extensions, `--device cuda` without a GPU.
- Reports: `--json` totals, `--csv` rows, `--rule`, `--min-numel`, non-finite inputs.
- Decoding to .npy / .npz / .safetensors / .h5 and back, `--widen`, `--help`.
- Outputs gcz must not clobber (an input, the state, a link or directory), interrupted runs,
  error feedback across steps (a seed per step, NaN residuals), command-line mistakes as one line,
  names with control characters, and files that claim more than the machine can decode.

Needs numpy, pytest and the gcz binary: $GCZ_BIN, default <repo>/build/gcz (the module is skipped
without it). h5py is optional (without it the .h5 output is checked by reading it back with gcz).
Run: GCZ_BIN=build/gcz python3 -m pytest -q tests/python/test_cli.py
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GCZ = Path(os.environ.get("GCZ_BIN", str(REPO / "build" / "gcz")))
CORRUPT = REPO / "tests" / "corrupt"
SAMPLES = REPO / "samples" / "grads"
SAMPLE = SAMPLES / "step_0000.safetensors"
SAMPLE_BF16 = SAMPLES / "step_0000_bf16.safetensors"

pytestmark = pytest.mark.skipif(
    not (GCZ.is_file() and os.access(GCZ, os.X_OK)),
    reason=f"gcz binary not found at {GCZ}: build it (cmake, target gcz_cli) or set GCZ_BIN",
)

needs_samples = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} missing (samples/make_samples.py)")

EXIT_USAGE, EXIT_IO, EXIT_BAD_INPUT, EXIT_UNSUPPORTED, EXIT_CHECKSUM, EXIT_DEVICE = 2, 3, 4, 5, 6, 7


# ------------------------------------------------------------------------------------------------
# helpers


def gcz(*args, cwd=None, check: bool = False) -> subprocess.CompletedProcess:
    r = subprocess.run([str(GCZ), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"gcz {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


def error_line(r: subprocess.CompletedProcess) -> str:
    """The single 'gcz: error: ...' line of a failed command."""
    lines = r.stderr.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{r.stderr}"
    assert lines[0].startswith("gcz: error: "), lines[0]
    return lines[0]


def spec_rules() -> List[str]:
    """The rule names of FORMAT.md §6, from the spec's table."""
    text = (REPO / "docs" / "FORMAT.md").read_text()
    section = text.split("## 6.", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z0-9-]+)`", section, flags=re.M)


RULES = spec_rules()


def rule_of(stem: str) -> str:
    fits = [r for r in RULES if stem == r or stem.startswith(r + "-")]
    return max(fits, key=len) if fits else ""


def readme_tables():
    """{gcz file: (rule, verify, info, decode)} and {input file: code} from tests/corrupt/README.md."""
    gczs: Dict[str, tuple] = {}
    inputs: Dict[str, int] = {}
    for line in (CORRUPT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(gcz|inputs)/(.+)`", cells[0]) if cells else None
        if not m:
            continue
        if m.group(1) == "gcz":
            rule = cells[1].strip("`") if cells[1].startswith("`") else ""
            gczs[m.group(2)] = (rule, int(cells[-3]), int(cells[-2]), int(cells[-1]))
        else:
            inputs[m.group(2)] = int(cells[-1])
    return gczs, inputs


GCZ_TABLE, INPUT_TABLE = readme_tables()
GCZ_FILES = sorted(p.name for p in (CORRUPT / "gcz").glob("*.gcz"))
INPUT_FILES = sorted(p.name for p in (CORRUPT / "inputs").iterdir()) if (CORRUPT / "inputs").is_dir() else []
RAW_ARGS = ["--dtype", "f32", "--shape", "3,3"]


def listing(d: Path) -> List[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def read_safetensors(path: Path) -> Dict[str, tuple]:
    """{name: (dtype, shape, bytes)}."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], list(t["shape"]), data[8 + n + a:8 + n + b])
    return out


def sample_arrays(path: Path) -> Dict[str, np.ndarray]:
    np_dtype = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}
    out = {}
    for name, (dt, shape, raw) in read_safetensors(path).items():
        if dt == "BF16":  # widen exactly: bfloat16 is the top half of a float32
            out[name] = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            out[name] = np.frombuffer(raw, np_dtype[dt]).reshape(shape)
    return out


def encode_json(tmp: Path, *args) -> dict:
    r = gcz("encode", *args, "-o", tmp / "out.gcz", "--json", check=True)
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------------------------
# 1. the corpus


def test_readme_documents_every_corpus_file():
    assert len(RULES) == 22, RULES
    assert GCZ_FILES, "no corpus: run tests/corrupt/make_corpus.py"
    assert sorted(GCZ_TABLE) == GCZ_FILES
    assert sorted(INPUT_TABLE) == INPUT_FILES
    for f, (rule, *_codes) in GCZ_TABLE.items():
        assert rule == ("" if f.startswith("valid") else rule_of(f[:-4])), f
    for r in RULES:
        assert f"{r}.gcz" in GCZ_FILES, f"no corpus file for rule {r}"


def check_rejection(r: subprocess.CompletedProcess, code: int, path: Path, rule: str) -> None:
    assert r.returncode == code, f"exit {r.returncode}, expected {code}:\n{r.stderr}"
    line = error_line(r)
    assert str(path) in line, line
    if rule:
        assert f": {rule}: " in line, f"rule {rule} not named: {line}"


@pytest.fixture(scope="module")
def corpus_listing():
    before = listing(CORRUPT)
    yield
    assert listing(CORRUPT) == before, "a command wrote into tests/corrupt/"


@pytest.mark.parametrize("name", GCZ_FILES)
def test_corpus_verify(name, corpus_listing):
    rule, code, _, _ = GCZ_TABLE[name]
    path = CORRUPT / "gcz" / name
    r = gcz("verify", path)
    if code == 0:
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{path}: ok"), r.stdout
        return
    check_rejection(r, code, path, rule)
    assert r.stdout == ""
    # --json: the same verdict, exit code and stderr line, and the error in the document.
    rj = gcz("verify", path, "--json")
    assert (rj.returncode, rj.stderr) == (r.returncode, r.stderr)
    doc = json.loads(rj.stdout)
    assert doc == {"ok": False, "files": [{"path": str(path), "ok": False, "exit_code": code,
                                            "error": error_line(r)[len("gcz: error: "):]}]}, doc


@pytest.mark.parametrize("name", GCZ_FILES)
def test_corpus_info(name, corpus_listing):
    rule, _, code, _ = GCZ_TABLE[name]
    path = CORRUPT / "gcz" / name
    for args in ([], ["--json"]):
        r = gcz("info", path, *args)
        if code == 0:
            assert r.returncode == 0, r.stderr
            if args:
                j = json.loads(r.stdout)
                assert j["format"] == "gcz" and isinstance(j["tensors"], list)
            continue
        check_rejection(r, code, path, rule)
        assert r.stdout == ""


@pytest.mark.parametrize("name", GCZ_FILES)
def test_corpus_decode_leaves_nothing(name, tmp_path, corpus_listing):
    rule, _, _, code = GCZ_TABLE[name]
    path = CORRUPT / "gcz" / name
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for out in ("restored.safetensors", "restored.npz"):
        r = gcz("decode", path, "-o", out_dir / out, "--device", "cpu")
        if code == 0:
            assert r.returncode == 0, r.stderr
            assert (out_dir / out).is_file()
            continue
        check_rejection(r, code, path, rule)
        assert listing(out_dir) == [], f"decode left files behind: {listing(out_dir)}"
    # A directory output: nothing may be created in it, nor the directory itself.
    r = gcz("decode", path, "-o", str(tmp_path / "dir") + "/", "--device", "cpu")
    if code != 0:
        check_rejection(r, code, path, rule)
        assert not (tmp_path / "dir").exists() or listing(tmp_path / "dir") == []
        assert sorted(os.listdir(tmp_path)) == ["out"], os.listdir(tmp_path)


@pytest.mark.parametrize("name", INPUT_FILES)
@pytest.mark.parametrize("command", ["encode", "eval"])
def test_hostile_inputs(name, command, tmp_path):
    code = INPUT_TABLE[name]
    path = CORRUPT / "inputs" / name
    extra = RAW_ARGS if path.suffix == ".bin" else []
    out = ["-o", tmp_path / "out.gcz"] if command == "encode" else []
    r = gcz(command, path, *extra, *out, cwd=tmp_path)
    assert r.returncode == code, f"exit {r.returncode}, expected {code}:\n{r.stderr}"
    line = error_line(r)
    assert str(path) in line, line
    assert os.listdir(tmp_path) == [], f"{command} left files: {os.listdir(tmp_path)}"


# ------------------------------------------------------------------------------------------------
# 2. usage, I/O and device errors


@pytest.mark.parametrize("command", ["verify", "info", "decode", "encode", "eval"])
def test_missing_input_is_an_io_error(command, tmp_path):
    missing = tmp_path / "no-such-file.gcz" if command in ("verify", "info", "decode") else tmp_path / "nope.npy"
    out = {"decode": ["-o", tmp_path / "x.npz"], "encode": ["-o", tmp_path / "x.gcz"]}.get(command, [])
    r = gcz(command, missing, *out)
    assert r.returncode == EXIT_IO, r.stderr
    assert str(missing) in error_line(r)
    assert sorted(os.listdir(tmp_path)) == []


def test_unknown_extension_is_unsupported(tmp_path):
    txt = tmp_path / "grads.txt"
    txt.write_bytes(b"\0" * 16)
    for command in ("encode", "eval"):
        out = ["-o", tmp_path / "x.gcz"] if command == "encode" else []
        r = gcz(command, txt, *out)
        assert r.returncode == EXIT_UNSUPPORTED, r.stderr
        assert str(txt) in error_line(r) and ".txt" in error_line(r)
    r = gcz("decode", CORRUPT / "gcz" / "valid.gcz", "-o", tmp_path / "out.xyz")
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    assert ".xyz" in error_line(r)
    assert sorted(os.listdir(tmp_path)) == ["grads.txt"]


@needs_samples
@pytest.mark.parametrize("spec", ["fp17", "fp16:level=3", "zstd"])
@pytest.mark.parametrize("command", ["encode", "eval"])
def test_bad_codec_spec_is_a_usage_error(spec, command, tmp_path):
    out = ["-o", tmp_path / "x.gcz"] if command == "encode" else []
    r = gcz(command, SAMPLE, "-c", spec, *out)
    assert r.returncode == EXIT_USAGE, f"-c {spec}: exit {r.returncode}, expected {EXIT_USAGE}: {r.stderr}"
    assert spec in error_line(r), f"the message does not name the spec {spec!r}: {r.stderr}"
    assert os.listdir(tmp_path) == []


@needs_samples
@pytest.mark.parametrize("rule", ["*.bias", "=none", "*.bias=fp16:level=3", "*.bias=fp17"])
def test_bad_rule_is_a_usage_error(rule):
    r = gcz("eval", SAMPLE, "--rule", rule)
    assert r.returncode == EXIT_USAGE, f"--rule {rule}: exit {r.returncode}, expected {EXIT_USAGE}: {r.stderr}"
    assert rule in error_line(r)


def _cuda_usable() -> bool:
    """A CUDA build on a machine with NVIDIA device nodes, where gcz also finds the device usable (a
    driver too old for the toolkit leaves the nodes but not the device: then exit 7 is still tested)."""
    v = gcz("--version").stdout
    if "CUDA backend built in" not in v or not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
        return False
    return gcz("bench", "--device", "cuda", "--size-mib", "1", "--repeat", "1", "-c", "fp16").returncode == 0


@needs_samples
def test_device_cuda_without_gpu(tmp_path):
    if _cuda_usable():
        pytest.skip("a GPU and a CUDA build are present: --device cuda is expected to work here")
    for args in (["eval", SAMPLE], ["encode", SAMPLE, "-o", tmp_path / "x.gcz"],
                 ["decode", CORRUPT / "gcz" / "valid.gcz", "-o", tmp_path / "x.npz"],
                 ["bench", "--size-mib", "1", "--repeat", "1"]):
        r = gcz(*args, "--device", "cuda")
        assert r.returncode == EXIT_DEVICE, r.stderr
        line = error_line(r)
        assert "cuda" in line.lower(), line
        assert r.stdout == "", (args, r.stdout)
    assert os.listdir(tmp_path) == []
    # auto falls back to the CPU
    r = gcz("eval", SAMPLE, "--device", "auto", "--json", check=True)
    assert json.loads(r.stdout)["backend"] == "cpu"


# ------------------------------------------------------------------------------------------------
# 3. reports


@needs_samples
def test_json_report_totals_are_consistent(tmp_path):
    rep = encode_json(tmp_path, SAMPLE)
    tensors, total = rep["tensors"], rep["total"]
    originals = sample_arrays(SAMPLE)
    assert [t["name"] for t in tensors] == list(originals)
    for t in tensors:
        m = t["metrics"]
        assert m["numel"] == originals[t["name"]].size
        assert m["bytes_in"] == originals[t["name"]].nbytes
        assert m["ratio"] == pytest.approx(m["bytes_in"] / m["bytes_out"], rel=1e-9)
        assert t["codec"] == "fp16" and t["dtype"] == "float32"
    assert total["bytes_in"] == sum(t["metrics"]["bytes_in"] for t in tensors)
    assert total["numel"] == sum(t["metrics"]["numel"] for t in tensors)
    assert total["bytes_out"] == (tmp_path / "out.gcz").stat().st_size
    assert total["ratio"] == pytest.approx(total["bytes_in"] / total["bytes_out"], rel=1e-9)
    assert total["bits_per_element"] == pytest.approx(8 * total["bytes_out"] / total["numel"], rel=1e-9)
    assert rep["skipped"] == []


@pytest.mark.parametrize("flags, shown", [
    (["--csv", "--json"], "json"), (["--json", "--csv"], "csv"), (["--csv", "--report", "table"], "table"),
    (["--report", "table", "--csv"], "csv"), (["--report", "json", "--report", "table"], "table"),
    (["--report=csv", "--json", "--json"], "json"), ([], "table")])
def test_the_last_report_flag_wins(flags, shown, tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    out = gcz("eval", tmp_path / "x.npy", *flags, check=True).stdout
    assert {"{": "json", "tensor,": "csv", "tensor ": "table"}[next(
        p for p in ("{", "tensor,", "tensor ") if out.startswith(p))] == shown, out


@needs_samples
def test_csv_report_has_a_header_and_a_row_per_tensor_and_total(tmp_path):
    r = gcz("encode", SAMPLE, "-o", tmp_path / "out.gcz", "--csv", check=True)
    rows = list(csv.reader(io.StringIO(r.stdout)))
    header, body = rows[0], rows[1:]
    for key in ("tensor", "numel", "bytes_in", "bytes_out", "ratio", "bits_per_element", "rel_l2", "cosine",
                "max_abs_error", "snr_db", "norm_ratio", "mean_error", "nonfinite", "decoded_nonfinite"):
        assert key in header, header
    names = list(sample_arrays(SAMPLE))
    assert [row[0] for row in body] == names + ["TOTAL"]
    assert all(len(row) == len(header) for row in body)
    col = {k: header.index(k) for k in header}
    total = body[-1]
    assert int(total[col["bytes_in"]]) == sum(int(row[col["bytes_in"]]) for row in body[:-1])
    assert int(total[col["bytes_out"]]) == (tmp_path / "out.gcz").stat().st_size


@needs_samples
def test_eval_writes_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    inp = tmp_path / "in"
    inp.mkdir()
    shutil.copy(SAMPLE, inp / SAMPLE.name)
    before = listing(tmp_path)
    r = gcz("eval", inp / SAMPLE.name, "-c", "bf16+zstd", "--json", cwd=work, check=True)
    assert listing(tmp_path) == before
    rep = json.loads(r.stdout)
    # its byte counts are those the file would have
    enc = encode_json(work, inp / SAMPLE.name, "-c", "bf16+zstd")
    assert rep["total"]["bytes_out"] == enc["total"]["bytes_out"]


@needs_samples
def test_rule_makes_bias_tensors_lossless(tmp_path):
    rep = encode_json(tmp_path, SAMPLE, "--rule", "*.bias=none")
    biases = [t for t in rep["tensors"] if t["name"].endswith(".bias")]
    assert biases
    for t in rep["tensors"]:
        if t["name"].endswith(".bias"):
            assert t["codec"] == "none"
            assert t["metrics"]["rel_l2"] == 0
            assert t["metrics"]["max_abs_error"] == 0
        else:
            assert t["codec"] == "fp16"
    assert any(t["metrics"]["rel_l2"] > 0 for t in rep["tensors"] if not t["name"].endswith(".bias"))


@needs_samples
def test_min_numel_makes_small_tensors_lossless(tmp_path):
    limit = 300
    rep = encode_json(tmp_path, SAMPLE, "--min-numel", limit)
    small = [t for t in rep["tensors"] if t["metrics"]["numel"] < limit]
    large = [t for t in rep["tensors"] if t["metrics"]["numel"] >= limit]
    assert small and large
    for t in small:
        assert t["codec"] == "none" and t["metrics"]["rel_l2"] == 0, t
    for t in large:
        assert t["codec"] == "fp16", t
    assert any(t["metrics"]["rel_l2"] > 0 for t in large)


def test_finite_input_decoded_to_inf_is_counted_and_warned_of(tmp_path):
    # The l2 scale of [50000, 50000] is 70711, beyond float16: nearest rounding decodes both to Inf.
    np.save(tmp_path / "h.npy", np.array([50000, 50000, 1, 2], np.float16))
    r = gcz("eval", tmp_path / "h.npy", "-c", "qsgd:bits=2,scale=l2,rounding=nearest", "--json", check=True)
    assert json.loads(r.stdout)["tensors"][0]["metrics"]["decoded_nonfinite"] == 2
    assert "2 decoded values are infinite or NaN where the input is finite" in r.stderr
    assert re.search(r"finite: qsgd:\S*scale=l2\S* overflowed a type it stores or decodes to", r.stderr), r.stderr
    r = gcz("eval", tmp_path / "h.npy", "-c", "qsgd:bits=2,rounding=nearest", "--json", check=True)  # scale=max
    assert json.loads(r.stdout)["tensors"][0]["metrics"]["decoded_nonfinite"] == 0 and "warning" not in r.stderr
    # A float32 input beyond float16, cast to fp16: the cast overflows, and the metrics say so.
    np.save(tmp_path / "f.npy", np.array([1e5, 1], np.float32))
    r = gcz("eval", tmp_path / "f.npy", "-c", "fp16", "--json", check=True)
    m = json.loads(r.stdout)["tensors"][0]["metrics"]
    assert m["decoded_nonfinite"] == 1 and m["rel_l2"] is None and m["snr_db"] is None, m
    assert "fp16 overflowed a type it stores or decodes to (float16 ends at 65504)" in r.stderr
    np.save(tmp_path / "b.npy", np.array([3.4e38, 1], np.float32))  # beyond bfloat16's largest, 3.39e38
    r = gcz("eval", tmp_path / "b.npy", "-c", "bf16", check=True)
    assert "bf16 overflowed a type it stores or decodes to; they are in the error metrics" in r.stderr, r.stderr


def test_nonfinite_input_warns_and_counts(tmp_path):
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    x[[3, 10, 20, 40]] = [np.nan, np.inf, -np.inf, np.nan]
    np.save(tmp_path / "grad_nan.npy", x)
    r = gcz("encode", tmp_path / "grad_nan.npy", "-o", tmp_path / "g.gcz", "--json")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert warnings and any("grad_nan" in ln for ln in warnings), r.stderr
    rep = json.loads(r.stdout)
    assert rep["tensors"][0]["metrics"]["nonfinite"] == 4
    assert rep["total"]["nonfinite"] == 4
    m = rep["tensors"][0]["metrics"]
    assert m["rel_l2"] is not None and math.isfinite(m["rel_l2"])  # finite values only
    gcz("decode", tmp_path / "g.gcz", "-o", tmp_path / "back.npy", check=True)
    y = np.load(tmp_path / "back.npy")
    assert np.array_equal(np.isnan(y), np.isnan(x))
    assert y[10] == np.inf and y[20] == -np.inf


def bench_tables(stdout: str) -> Dict[str, List[List[str]]]:
    """gcz bench's tables, by the first word of their header: rows split on whitespace."""
    tables: Dict[str, List[List[str]]] = {}
    for block in stdout.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if lines and lines[0].split()[0] in ("yardstick", "codec"):
            tables[lines[0].split()[0]] = [ln.split() for ln in lines[1:]]
    return tables


def test_bench_prints_yardsticks_and_a_row_per_codec_and_thread_count():
    r = gcz("bench", "--size-mib", "1", "--repeat", "1", "--threads", "1,2", "-c", "fp16", "-c", "terngrad",
            check=True)
    assert "memcpy (1 thread):" in r.stdout, r.stdout
    tables = bench_tables(r.stdout)
    # machine (the same bytes) THREADS MEMCPY SCALING READ SCALING
    assert [row[4] for row in tables["yardstick"]] == ["1", "2"], r.stdout
    for row in tables["yardstick"]:
        # GB/s measured; a scaling may print as 0.00 on a machine busy with other work
        assert float(row[5]) > 0 and float(row[7]) > 0 and float(row[6]) >= 0 and float(row[8]) >= 0, row
    # SPEC THREADS RATIO ENC XMEMCPY SCALING DEC XMEMCPY SCALING
    assert [(row[0], row[1]) for row in tables["codec"]] == [
        ("fp16", "1"), ("fp16", "2"), ("terngrad", "1"), ("terngrad", "2")], r.stdout
    assert [row[2] for row in tables["codec"]] == ["2.00", "2.00", "20.00", "20.00"], r.stdout


def test_bench_json_is_one_document_with_the_same_measurements():
    r = gcz("bench", "--size-mib", "1", "--repeat", "1", "--threads", "2,1", "-c", "qsgd:bits=4", "-c", "bf16",
            "--json", check=True)
    doc = json.loads(r.stdout)  # nothing else on stdout
    assert doc["input_bytes"] == 1 << 20 and doc["tensors"] == 1 and doc["synthetic"] is True
    assert doc["backend"] == "cpu" and doc["repeats"] == 1
    assert [y["threads"] for y in doc["yardsticks"]] == [1, 2]
    assert doc["memcpy_gbps"] == doc["yardsticks"][0]["memcpy_gbps"] > 0
    assert all(y["read_gbps"] > 0 for y in doc["yardsticks"])
    assert doc["device_kernels"] == []  # the GPU's own rates, on the CUDA backend only
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    if {"avx512f", "avx2", "fma", "f16c"} <= set(flags):  # the x86-64 CPUs of the machines this runs on
        assert doc["cpu_code"] == "avx512", doc["cpu_code"]
    elif {"avx2", "fma", "f16c"} <= set(flags):
        assert doc["cpu_code"] == "avx2", doc["cpu_code"]
    else:
        assert doc["cpu_code"] == "portable", doc["cpu_code"]
    assert [(row["codec"], row["threads"]) for row in doc["rows"]] == [
        ("qsgd:bits=4", 2), ("qsgd:bits=4", 1), ("bf16", 2), ("bf16", 1)]
    n = (1 << 20) // 4  # 4 bits per element and a float32 scale per 128
    assert doc["rows"][0]["ratio"] == pytest.approx(4 * n / (n // 2 + n // 128 * 4), rel=1e-12)
    assert doc["rows"][2]["ratio"] == 2.0
    assert all(row["encode_gbps"] > 0 and row["decode_gbps"] > 0 for row in doc["rows"])


def test_bench_inputs_may_follow_codecs_and_thread_counts(tmp_path):
    x = tmp_path / "g.npy"
    np.save(x, np.linspace(-1, 1, 4096, dtype=np.float32))
    for args in (["-c", "fp16", x], ["--threads", "2,1", x, "-c", "fp16"]):
        r = gcz("bench", "--repeat", "1", *args, "--json", check=True)
        doc = json.loads(r.stdout)
        assert doc["synthetic"] is False and doc["input_bytes"] == 4096 * 4, (args, doc)
        assert [row["codec"] for row in doc["rows"]] == ["fp16"] * len(doc["rows"]), (args, doc)


def test_bench_reads_raw_input_as_encode_does_and_says_size_mib_is_unused(tmp_path):
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    x.tofile(tmp_path / "g.bin")
    r = gcz("bench", tmp_path / "g.bin", "--dtype", "f32", "--shape", "64,64", "-c", "fp16", "--repeat", "1",
            "--threads", "1", "--size-mib", "8", "--json", check=True)
    assert json.loads(r.stdout)["input_bytes"] == x.nbytes
    assert r.stderr.splitlines() == [
        "gcz: note: --size-mib sizes the synthetic data, and the input files are measured instead"], r.stderr
    r = gcz("bench", tmp_path / "g.bin", "--dtype", "f32", "-c", "fp16")
    assert r.returncode == EXIT_USAGE and "--shape is missing" in error_line(r), r.stderr


@pytest.mark.parametrize("args, names", [
    (["-c", "fp17"], "fp17"),
    (["-c", "fp16", "-c", "qsgd:bits=9"], "qsgd:bits=9"),
    (["--threads", "1,0"], "--threads"),
    (["--repeat", "0"], "--repeat"),
    (["--size-mib", "0"], "--size-mib"),
    (["--size-mib", str(1 << 40)], "--size-mib"),
])
def test_bench_refuses_bad_arguments_before_measuring(args, names):
    base = [a for k in ("--size-mib", "--repeat") if k not in args for a in (k, "1")]
    r = gcz("bench", *base, *args)
    assert r.returncode == EXIT_USAGE, (args, r.returncode, r.stderr)
    assert names in error_line(r), (names, r.stderr)
    assert r.stdout == "", f"printed before refusing: {r.stdout}"


# ------------------------------------------------------------------------------------------------
# 4. decoding


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    if not SAMPLE.is_file():
        pytest.skip(f"{SAMPLE} missing")
    d = tmp_path_factory.mktemp("lossless")
    gcz("encode", SAMPLE, "-o", d / "none.gcz", "-c", "none+zstd", "-q", check=True)
    return d / "none.gcz", sample_arrays(SAMPLE)


def _same(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].shape == v.shape, k
        assert got[k].dtype == v.dtype, (k, got[k].dtype, v.dtype)
        assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8)), k


def test_decode_to_safetensors(lossless, tmp_path):
    gz, want = lossless
    gcz("decode", gz, "-o", tmp_path / "r.safetensors", check=True)
    got = {k: np.frombuffer(raw, "<f4").reshape(shape) for k, (dt, shape, raw)
           in read_safetensors(tmp_path / "r.safetensors").items() if dt == "F32"}
    _same(got, want)


def test_decode_to_npz(lossless, tmp_path):
    gz, want = lossless
    gcz("decode", gz, "-o", tmp_path / "r.npz", check=True)
    with np.load(tmp_path / "r.npz") as z:
        _same({k: z[k] for k in z.files}, want)


def test_decode_to_npy(lossless, tmp_path):
    gz, want = lossless
    r = gcz("decode", gz, "-o", tmp_path / "all.npy")  # several tensors cannot go to one .npy
    assert r.returncode != 0 and os.listdir(tmp_path) == []
    error_line(r)
    gcz("decode", gz, "-o", tmp_path / "w.npy", "-t", "blocks.0.mix.weight", check=True)
    _same({"blocks.0.mix.weight": np.load(tmp_path / "w.npy")}, {"blocks.0.mix.weight": want["blocks.0.mix.weight"]})
    # A GLOB that matches no tensor says where the names are to be found.
    r = gcz("decode", gz, "-o", tmp_path / "w2.npy", "-t", "mix.weight")
    assert r.returncode == EXIT_USAGE and "no tensor matches 'mix.weight'" in error_line(r)
    assert f"gcz info {gz} lists the names" in error_line(r) and not (tmp_path / "w2.npy").exists()


def test_decode_to_directory(lossless, tmp_path):
    gz, want = lossless
    gcz("decode", gz, "-o", str(tmp_path / "d") + "/", check=True)
    got = {str(p.relative_to(tmp_path / "d"))[:-4]: np.load(p) for p in (tmp_path / "d").rglob("*.npy")}
    _same(got, want)


def test_repeatable_options_take_one_value_each(lossless, tmp_path):
    """An input after -t, --rule or --meta stays an input, not a second GLOB, rule or key."""
    gz, want = lossless
    gcz("decode", "-t", "*.bias", gz, "-o", str(tmp_path / "d") + "/", check=True)
    got = {str(p.relative_to(tmp_path / "d"))[:-4]: np.load(p) for p in (tmp_path / "d").rglob("*.npy")}
    _same(got, {k: v for k, v in want.items() if k.endswith(".bias")})
    rep = json.loads(gcz("eval", "--rule", "*.bias=none", SAMPLE, "--json", check=True).stdout)
    assert {t["codec"] for t in rep["tensors"] if t["name"].endswith(".bias")} == {"none"}, rep
    gcz("encode", "--meta", "run=7", SAMPLE, "-o", tmp_path / "m.gcz", "-q", check=True)
    assert "run=7" in gcz("info", tmp_path / "m.gcz", check=True).stdout


@needs_samples
def test_info_json_shows_the_stored_metrics(tmp_path):
    """`info --json` prints the index with each tensor's stored metrics (FORMAT.md §5.5), the
    numbers encode reported; a metrics object gcz cannot read is left out, not an error."""
    rep = json.loads(gcz("encode", SAMPLE, "-o", tmp_path / "m.gcz", "-c", "qsgd", "--json", check=True).stdout)
    info = json.loads(gcz("info", tmp_path / "m.gcz", "--json", check=True).stdout)
    stored = {t["name"]: t["metrics"] for t in info["tensors"]}
    for t in rep["tensors"]:
        want = {k: v for k, v in t["metrics"].items() if k != "decoded_nonfinite"}
        assert stored[t["name"]] == want, t["name"]

    # Whole but for one field: a string, or a count that is negative or not whole.
    whole = stored[rep["tensors"][0]["name"]]
    for bad in ({"rel_l2": "small"}, {**whole, "rel_l2": "small"}, {**whole, "numel": -1},
                {**whole, "numel": 6.5}, {**whole, "bytes_out": -3}):
        def odd(text: bytes) -> bytes:
            index = json.loads(text)
            index["tensors"][0]["metrics"] = bad
            return json.dumps(index, separators=(",", ":")).encode()
        with_index(tmp_path / "m.gcz", tmp_path / "odd.gcz", odd)
        info = json.loads(gcz("info", tmp_path / "odd.gcz", "--json", check=True).stdout)
        assert "metrics" not in info["tensors"][0] and "metrics" in info["tensors"][1], bad
        gcz("verify", tmp_path / "odd.gcz", check=True)  # informative: no reason to reject a file
    # The whole object itself is kept.
    with_index(tmp_path / "m.gcz", tmp_path / "same.gcz", lambda text: text)
    assert json.loads(gcz("info", tmp_path / "same.gcz", "--json", check=True).stdout)["tensors"][0]["metrics"] == whole


@needs_samples
def test_info_ratio_is_to_the_inputs_bytes_for_bfloat16_encoded_with_error_feedback(tmp_path):
    """Error feedback holds a bfloat16 input as float32: info marks the dtype and keeps the ratio to
    the input's 2 bytes per element, as the report did, not to the 4 it is held in."""
    gcz("encode", SAMPLE_BF16, "-o", tmp_path / "b.gcz", "-c", "topk", "--ef-state", tmp_path / "ef.gcz", "-q",
        check=True)
    info = json.loads(gcz("info", tmp_path / "b.gcz", "--json", check=True).stdout)
    stored = {t["name"]: (sum(s["length"] for s in t["streams"]), t["metrics"]["bytes_in"]) for t in info["tensors"]}
    assert all(t["dtype"] == "float32" and t["metrics"]["bytes_in"] == 2 * t["metrics"]["numel"]
               for t in info["tensors"])
    lines = gcz("info", tmp_path / "b.gcz", check=True).stdout.splitlines()
    rows = {ln.split()[0]: ln.split() for ln in lines if ln.split() and ln.split()[0] in stored}
    for name, (length, bytes_in) in stored.items():
        assert rows[name][1] == "float32*", rows[name]
        assert rows[name][-1] == f"{bytes_in / length:.2f}", (name, rows[name], bytes_in, length)
    assert lines[-1].startswith("* encoded wider than its input"), lines[-1]
    total = [ln.split() for ln in lines if ln.startswith("TOTAL")][0]
    assert total[1:3] == ["22", "tensors"], total
    inputs, stored_all = sum(b for _, b in stored.values()), sum(n for n, _ in stored.values())
    assert total[-1] == f"{inputs / stored_all:.2f}", (total, inputs, stored_all)
    plain = gcz("info", tmp_path / "ef.gcz", check=True).stdout  # the state's residuals are float32 inputs
    assert "*" not in plain


def test_decode_to_h5(lossless, tmp_path):
    gz, want = lossless
    gcz("decode", gz, "-o", tmp_path / "r.h5", check=True)
    try:
        import h5py  # noqa: F401
    except ImportError:
        h5py = None
    if h5py is not None:
        with h5py.File(tmp_path / "r.h5", "r") as f:
            got = {}
            f.visititems(lambda name, obj: got.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        _same(got, want)
    # Read back by gcz itself: the .h5 encodes to the same tensors.
    gcz("encode", tmp_path / "r.h5", "-o", tmp_path / "again.gcz", "-c", "none", "-q", check=True)
    gcz("decode", tmp_path / "again.gcz", "-o", tmp_path / "again.npz", check=True)
    with np.load(tmp_path / "again.npz") as z:
        _same({k: z[k] for k in z.files}, want)


def test_bf16_needs_widen_for_npy(tmp_path):
    if not SAMPLE_BF16.is_file():
        pytest.skip(f"{SAMPLE_BF16} missing")
    gcz("encode", SAMPLE_BF16, "-o", tmp_path / "b.gcz", "-c", "none", "-q", check=True)
    out = tmp_path / "out"
    out.mkdir()
    r = gcz("decode", tmp_path / "b.gcz", "-o", out / "h.npy", "-t", "head.bias")
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    assert "--widen" in error_line(r)
    assert os.listdir(out) == []
    for target in ("h.npy", "all.npz"):
        args = ["-t", "head.bias"] if target.endswith(".npy") else []
        gcz("decode", tmp_path / "b.gcz", "-o", out / target, "--widen", *args, check=True)
    want = sample_arrays(SAMPLE_BF16)
    got = np.load(out / "h.npy")
    assert got.dtype == np.float32
    _same({"head.bias": got}, {"head.bias": want["head.bias"]})
    with np.load(out / "all.npz") as z:
        _same({k: z[k] for k in z.files}, want)
    # .safetensors holds bfloat16 as it is, without --widen.
    gcz("decode", tmp_path / "b.gcz", "-o", out / "b.safetensors", check=True)
    assert {dt for dt, _, _ in read_safetensors(out / "b.safetensors").values()} == {"BF16"}


# ------------------------------------------------------------------------------------------------
# 5. help


def subcommands() -> List[str]:
    """The subcommands `gcz --help` lists."""
    text = gcz("--help").stdout
    section = text.split("Subcommands:", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines() if line.strip()]


def test_help_exits_0_with_an_example():
    commands = subcommands()
    assert {"encode", "eval", "decode", "info", "verify"} <= set(commands), commands
    for command in [[]] + [[c] for c in commands]:
        r = gcz(*command, "--help")
        assert r.returncode == 0, (command, r.stderr)
        assert "Example" in r.stdout, (command, r.stdout)
        assert "gcz " + " ".join(command) in r.stdout.split("Example", 1)[1], (command, r.stdout)


def test_help_gives_each_codecs_defaults_as_files_record_them(tmp_path):
    """encode's and eval's --help end with every codec's parameters, the default first: each default is
    the value a file records for the bare codec (terngrad's group with scale=group, where it applies)."""
    text = gcz("encode", "--help", check=True).stdout
    block = text[text.index("Codec parameters"):]
    assert block in gcz("eval", "--help", check=True).stdout
    listed: Dict[str, str] = {}
    name = None
    for line in block.splitlines()[1:]:
        m = re.match(r"  (\w+)  +(.*)", line)
        if m and m.group(1) != "none,":
            name = m.group(1)
            listed[name] = m.group(2)
        elif line.startswith(" " * 12) and name:
            listed[name] += " " + line.strip()
    assert set(listed) == {"qsgd", "terngrad", "topk", "randomk", "powersgd", "zstd"}, listed
    np.save(tmp_path / "m.npy", np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    for codec, entry in listed.items():
        while True:  # the notes in parentheses are not defaults
            shorter = re.sub(r"\([^()]*\)", "", entry)
            if shorter == entry:
                break
            entry = shorter
        recorded: Dict[str, object] = {}
        for spec in ([codec, "terngrad:scale=group"] if codec == "terngrad" else
                     ["fp16+zstd"] if codec == "zstd" else [codec]):
            gcz("encode", tmp_path / "m.npy", "-o", tmp_path / "m.gcz", "-c", spec, "-q", check=True)
            stages = json.loads(gcz("info", tmp_path / "m.gcz", "--json", check=True).stdout)["tensors"][0]["codec"]
            for key, value in stages[-1]["params"].items():
                recorded.setdefault(key, value)
        defaults = [(k, v) for k, v in re.findall(r"(\w+)=([\w.]+)", entry) if v != "N"]
        assert defaults, (codec, entry)
        for key, value in defaults:
            assert key in recorded, (codec, key, recorded)
            got = recorded[key]
            assert (float(got) == float(value) if isinstance(got, (int, float)) else got == value), (codec, key, got)


# ------------------------------------------------------------------------------------------------
# 6. outputs that must not be clobbered, error feedback across steps, command-line mistakes


def write_safetensors(path: Path, tensors: Dict[str, np.ndarray], metadata: Optional[dict] = None) -> None:
    header, blobs, at = ({} if metadata is None else {"__metadata__": metadata}), [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def popen_interruptible(args, **kwargs) -> subprocess.Popen:
    """Starts gcz with SIGINT at its default action, which a shell gives background jobs as ignored
    (gcz leaves an ignored SIGINT ignored, so a test that interrupts it would wait for its end)."""
    import signal

    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return subprocess.Popen([str(GCZ), *map(str, args)], preexec_fn=default_sigint, **kwargs)


def interrupt_when(args, where: Path, pattern: str, too_late: str) -> None:
    """Runs gcz with `args`, sends it SIGINT once a file matching `pattern` appears in `where`, and
    checks that the signal ended it (skipping, saying `too_late`, if gcz finished first)."""
    import signal
    import time
    p = popen_interruptible(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(where.glob(pattern)) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    if p.poll() is not None:
        pytest.skip(too_late)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGINT, p.stderr.read()


def tensor_seeds(path: Path) -> List[int]:
    return [t["seed"] for t in json.loads(gcz("info", path, "--json", check=True).stdout)["tensors"]]


@needs_samples
@pytest.mark.parametrize("case", ["input", "in-input-dir", "state", "state-spelled", "symlink", "directory", "empty"])
def test_encode_refuses_an_output_it_would_clobber(case, tmp_path):
    src = tmp_path / "g.safetensors"
    shutil.copy(SAMPLE, src)
    out, extra = tmp_path / "out.gcz", []
    if case == "input":  # raw bytes under a name of their own: -o names them as well
        src = out = tmp_path / "g.dat"
        np.ones(8, np.float32).tofile(src)
        extra = ["--dtype", "f32", "--shape", "8"]
    elif case == "in-input-dir":  # a tensor format's extension: the directory's reader would read it too
        src, out = tmp_path, tmp_path / "g.safetensors"
    elif case == "state":
        extra = ["--ef-state", out]
    elif case == "state-spelled":  # the same file, spelled differently, not existing yet
        out, extra = "out.gcz", ["--ef-state", "./out.gcz"]
    elif case == "symlink":
        (tmp_path / "real.gcz").write_bytes(b"keep")
        out.symlink_to(tmp_path / "real.gcz")
    elif case == "directory":
        out.mkdir()
    elif case == "empty":
        out = ""
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    r = gcz("encode", src, "-o", out, "-q", *extra, cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert r.stdout == ""
    line = error_line(r)
    assert {"input": "also an input", "in-input-dir": "the extension of a tensor file format", "state": "same file",
            "state-spelled": "same file", "symlink": "symbolic link", "directory": "a directory",
            "empty": "no output path"}[case] in line, line
    after = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    assert after == before  # nothing written, nothing replaced, no temporary left


@needs_samples
def test_outputs_replaced_keep_their_permissions_and_new_ones_follow_the_umask(tmp_path):
    out, state = tmp_path / "out.gcz", tmp_path / "ef.gcz"
    args = ["encode", SAMPLE, "-o", out, "--ef-state", state, "-c", "topk", "-q"]
    gcz(*args, check=True)
    for path in (out, state):
        path.chmod(0o600)
    gcz(*args, check=True)
    assert [oct(p.stat().st_mode & 0o777) for p in (out, state)] == ["0o600"] * 2
    new = tmp_path / "new.gcz"
    r = subprocess.run([str(GCZ), "encode", str(SAMPLE), "-o", str(new), "-q"], capture_output=True, text=True,
                       timeout=300, preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    assert oct(new.stat().st_mode & 0o777) == "0o640"


@needs_samples
@pytest.mark.parametrize("extra, code, words", [
    (["--ef-codec", "fp17"], EXIT_USAGE, "--ef-codec: codec spec 'fp17'"),
    (["--ef-codec", "topk:values=(powersgd)"], EXIT_USAGE,
     "it fails on every tensor (a 256x256 and a 2048x2048 float32 matrix both fail)"),
    (["--ef-state-dir"], EXIT_IO, "missing: no such directory"),
    (["--ef-state-under-file"], EXIT_IO, "plain.txt is not a directory"),
])
def test_encode_checks_the_state_options_before_encoding(extra, code, words, tmp_path):
    state = tmp_path / "ef.gcz"
    if extra == ["--ef-state-dir"]:
        state, extra = tmp_path / "missing" / "ef.gcz", []
    if extra == ["--ef-state-under-file"]:
        (tmp_path / "plain.txt").write_text("x")
        state, extra = tmp_path / "plain.txt" / "ef.gcz", []
    r = gcz("encode", SAMPLE, "-o", tmp_path / "out.gcz", "--ef-state", state, *extra, "-q")
    assert r.returncode == code, r.stderr
    assert words in error_line(r)
    assert [p for p in listing(tmp_path) if p != "plain.txt"] == []  # OUTPUT was not written first


@needs_samples
def test_ef_resume_needs_the_state_to_exist(tmp_path):
    """--ef-resume: a step that continues a sequence refuses a missing state (a mistyped name) with
    exit 3 and writes nothing, where without it the state would start again from zero; with the
    state there it is step 1 as usual, and the file records it (gcz.ef_step). Without --ef-state it
    is a usage error."""
    state = tmp_path / "ef.gcz"
    r = gcz("encode", SAMPLE, "-o", tmp_path / "o.gcz", "--ef-state", state, "--ef-resume", "-q")
    assert r.returncode == EXIT_IO, r.stderr
    assert error_line(r) == (f"gcz: error: --ef-state {state}: no such file, and --ef-resume continues an existing "
                             "state (without --ef-resume a missing state starts step 0 from zero residuals)")
    assert listing(tmp_path) == []
    gcz("encode", SAMPLE, "-o", tmp_path / "o0.gcz", "-c", "topk", "--ef-state", state, "-q", check=True)
    r = gcz("encode", SAMPLE, "-o", tmp_path / "o1.gcz", "-c", "topk", "--ef-state", state, "--ef-resume", "--json",
            check=True)
    assert json.loads(r.stdout)["step"] == 1 and "note:" not in r.stderr, r.stderr
    # Each file records its step of the sequence.
    for k in range(2):
        meta = json.loads(gcz("info", tmp_path / f"o{k}.gcz", "--json", check=True).stdout)["metadata"]
        assert meta["gcz.ef_step"] == str(k), meta
    r = gcz("encode", SAMPLE, "-o", tmp_path / "o2.gcz", "--ef-resume", "-q")
    assert r.returncode == EXIT_USAGE and "no --ef-state is given" in error_line(r), r.stderr
    assert listing(tmp_path) == ["ef.gcz", "o0.gcz", "o1.gcz"]


def test_ef_prune_drops_the_residuals_no_tensor_of_the_step_took(tmp_path):
    """--ef-prune: the residuals of tensors absent from this step (renamed, or gone from the model)
    leave the state instead of waiting for a later step, and a note counts them; the others, and
    the step's new tensors, stay. Without --ef-state it is a usage error."""
    rng = np.random.default_rng(2)
    state = tmp_path / "ef.gcz"

    def step(k: int, names, *extra):
        np.savez(tmp_path / f"s{k}.npz", **{n: rng.standard_normal(64).astype(np.float32) for n in names})
        return gcz("encode", tmp_path / f"s{k}.npz", "-o", tmp_path / f"o{k}.gcz", "-c", "fp16", "--ef-state",
                   state, "-q", *extra, check=True)

    def held():
        return sorted(t["name"] for t in json.loads(gcz("info", state, "--json", check=True).stdout)["tensors"])

    step(0, ["a", "b"])
    r = step(1, ["a", "c"], "--ef-prune")
    assert r.stderr == ("gcz: note: the error-feedback state holds no residual for 'c', which starts from zero "
                        "(new, or renamed since); it dropped 1 residual no tensor of this step took (--ef-prune)\n"), \
        r.stderr
    assert held() == ["residual/a", "residual/c"]
    r = step(2, ["a"], "--ef-prune")
    assert r.stderr == "gcz: note: the error-feedback state dropped 1 residual no tensor of this step took " \
                       "(--ef-prune)\n", r.stderr
    assert held() == ["residual/a"]
    r = step(3, ["a", "d"])  # without it, a residual not taken stays
    step(4, ["a"])
    assert held() == ["residual/a", "residual/d"]
    r = gcz("encode", tmp_path / "s4.npz", "-o", tmp_path / "x.gcz", "--ef-prune", "-q")
    assert r.returncode == EXIT_USAGE and "--ef-prune acts on an --ef-state" in error_line(r), r.stderr


def test_powersgd_eligibility_counts_the_dtype_the_index_records(tmp_path):
    """With error feedback a float16 tensor is encoded, and recorded, as float32: PowerSGD's size rule
    (powersgd.md, "Fallback") counts 4 bytes per element then, and 2 without feedback."""
    np.save(tmp_path / "h.npy", np.random.default_rng(3).standard_normal((24, 24)).astype(np.float16))

    def chosen(*extra):
        gcz("encode", tmp_path / "h.npy", "-o", tmp_path / "h.gcz", "-c", "powersgd:rank=4", "-q", *extra,
            check=True)
        t = json.loads(gcz("info", tmp_path / "h.gcz", "--json", check=True).stdout)["tensors"][0]
        return t["dtype"], t["codec"][0]["name"]

    # r (n + m) 4 = 768 against n m s / 2: 576 at 2 bytes (fallback), 1152 at 4 (PowerSGD).
    assert chosen() == ("float16", "fp16")
    assert chosen("--ef-state", tmp_path / "ef.gcz") == ("float32", "powersgd")
    # eval --steps chooses as encode would: without --ef each step is encoded as it is, float16.
    for extra, codec in (([], "fp16"), (["--ef"], "powersgd")):
        rep = json.loads(gcz("eval", "--steps", tmp_path / "h.npy", "-c", "powersgd:rank=4", "--json", *extra,
                             check=True).stdout)
        assert rep["steps"][0]["tensors"][0]["codec"].split(":")[0] == codec, (extra, rep)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_steps_without_feedback_encode_each_step_as_encode_does(dtype, tmp_path):
    """eval --steps without --ef: each step's bytes and error are those of gcz encode with seed S + s,
    and sum_rel_l2 is that of the decoded steps' sums, for 16-bit inputs too (no widening to float32)."""
    rng = np.random.default_rng(11)
    steps = [rng.standard_normal((40, 50)).astype(np.float32) for _ in range(2)]
    kind = "F16" if dtype == np.float16 else "BF16"
    for s, x in enumerate(steps):
        raw = (x.astype("<f2") if kind == "F16" else (x.view("<u4") >> 16).astype("<u2")).tobytes()
        header = json.dumps({"w": {"dtype": kind, "shape": [40, 50], "data_offsets": [0, len(raw)]}}).encode()
        (tmp_path / f"s{s}.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    files = [tmp_path / f"s{s}.safetensors" for s in range(2)]

    def values(f: Path) -> np.ndarray:
        raw = np.frombuffer(read_safetensors(f)["w"][2], "<u2")
        x = raw.view("<f2").astype(np.float64) if kind == "F16" else (raw.astype("<u4") << 16).view("<f4")
        return x.astype(np.float64).reshape(40, 50)

    spec = "qsgd:bits=3"
    rep = json.loads(gcz("eval", "--steps", *files, "-c", spec, "--seed", "5", "--json", check=True).stdout)
    true_sum = np.zeros((40, 50))
    dec_sum = np.zeros((40, 50))
    for s, f in enumerate(files):
        one = json.loads(gcz("eval", f, "-c", spec, "--seed", str(5 + s), "--json", check=True).stdout)["tensors"][0]
        got = rep["steps"][s]["tensors"][0]
        assert got["metrics"]["bytes_out"] == one["metrics"]["bytes_out"] and got["dtype"] == one["dtype"]
        assert got["metrics"]["rel_l2"] == one["metrics"]["rel_l2"], (s, got, one)
        gcz("encode", f, "-o", tmp_path / "e.gcz", "-c", spec, "--seed", str(5 + s), "-q", check=True)
        gcz("decode", tmp_path / "e.gcz", "-o", tmp_path / "d.npy", "--widen", check=True)
        dec_sum += np.load(tmp_path / "d.npy").astype(np.float64)
        true_sum += values(f)
    want = np.linalg.norm(dec_sum - true_sum) / np.linalg.norm(true_sum)
    assert math.isclose(rep["steps"][1]["tensors"][0]["metrics"]["sum_rel_l2"], want, rel_tol=1e-9), want


@needs_samples
def test_ef_codec_powersgd_stores_vector_residuals_with_its_fallback(tmp_path):
    gcz("encode", SAMPLE, "-o", tmp_path / "out.gcz", "--ef-state", tmp_path / "ef.gcz", "--ef-codec", "powersgd",
        "-c", "topk", "-q", check=True)
    codecs = {t["name"]: t["codec"][0]["name"]
              for t in json.loads(gcz("info", tmp_path / "ef.gcz", "--json", check=True).stdout)["tensors"]}
    assert codecs["residual/head.bias"] == "fp16" and "powersgd" in codecs.values(), codecs


def test_an_interrupted_step_leaves_its_output_and_the_state_as_they_were(tmp_path):
    """The step's file and the state are put in place together: a step stopped while the state is
    being written leaves neither (before, OUTPUT was already in place and the state one step behind)."""
    rng = np.random.default_rng(4)
    np.save(tmp_path / "g.npy", rng.standard_normal(1 << 24).astype(np.float32))
    state, out = tmp_path / "ef.gcz", tmp_path / "out.gcz"
    gcz("encode", tmp_path / "g.npy", "-o", tmp_path / "first.gcz", "-c", "topk", "--ef-state", state, "-q",
        check=True)
    before = state.read_bytes()
    interrupt_when(["encode", tmp_path / "g.npy", "-o", out, "-c", "topk", "--ef-state", state, "-q"],
                   tmp_path, "ef.gcz.tmp-*", "the encode finished before its state was being written")
    assert listing(tmp_path) == ["ef.gcz", "first.gcz", "g.npy"]  # no OUTPUT, no temporary
    assert state.read_bytes() == before


@needs_samples
def test_a_temporary_left_by_a_killed_process_of_the_same_number_is_passed_over(tmp_path):
    """SIGKILL leaves its temporaries (NAME.tmp-PID-N); a later gcz given the same process number
    takes other names rather than failing on them, and leaves the stale files alone."""
    shutil.copy(SAMPLE, tmp_path / "g.safetensors")
    script = ('echo junk > out.gcz.tmp-$$-0; echo junk > ef.gcz.tmp-$$-1; '
              f'exec "{GCZ}" encode g.safetensors -c topk --ef-state ef.gcz -o out.gcz -q')
    r = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    stale = sorted(p.name for p in tmp_path.glob("*.tmp-*"))
    assert len(stale) == 2 and all((tmp_path / n).read_text() == "junk\n" for n in stale), stale
    gcz("verify", tmp_path / "out.gcz", tmp_path / "ef.gcz", check=True)


@needs_samples
def test_a_state_directory_gcz_cannot_write_in_is_refused_before_encoding(tmp_path):
    """Checked up front, like OUTPUT's directory: before, the step was encoded and OUTPUT written,
    and only the state's rename failed, at every step."""
    work = Path(tempfile.mkdtemp(prefix="gcz-ro-"))  # outside tmp_path, whose parents may be private
    try:
        work.chmod(0o777)
        src = work / "g.safetensors"
        shutil.copy(SAMPLE, src)
        src.chmod(0o644)
        (work / "ro").mkdir(mode=0o555)
        (work / "ro").chmod(0o555)
        cmd = [str(GCZ), "encode", str(src), "-c", "topk", "--ef-state", str(work / "ro" / "ef.gcz"),
               "-o", str(work / "out.gcz"), "-q"]
        if os.geteuid() == 0:  # root writes anywhere: run as nobody
            if shutil.which("setpriv") is None:
                pytest.skip("running as root and setpriv (util-linux) is missing to drop to another user")
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == EXIT_IO, r.stderr
        assert "--ef-state: " + str(work / "ro" / "ef.gcz") + ": cannot write in the directory" in error_line(r)
        assert sorted(p.name for p in work.iterdir()) == ["g.safetensors", "ro"]  # OUTPUT not written
    finally:
        (work / "ro").chmod(0o755)
        shutil.rmtree(work)


def test_an_output_that_cannot_be_replaced_leaves_the_state_as_it_was():
    """In a sticky directory, another user's OUTPUT cannot be renamed over: the step fails whole, and
    the state does not move on to a step whose file was not written."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to own OUTPUT as one user and run gcz as another) and setpriv (util-linux)")
    work = Path(tempfile.mkdtemp(prefix="gcz-sticky-"))
    try:
        work.chmod(0o1777)
        np.save(work / "g.npy", np.linspace(-1, 1, 1000, dtype=np.float32))
        (work / "g.npy").chmod(0o644)
        gcz("encode", work / "g.npy", "-o", work / "out.gcz", "-q", check=True)  # OUTPUT owned by root
        before = (work / "out.gcz").read_bytes()
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(GCZ), "encode",
                            str(work / "g.npy"), "-o", str(work / "out.gcz"), "-c", "topk", "--ef-state",
                            str(work / "ef.gcz"), "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == EXIT_IO, r.stderr
        assert "out.gcz: cannot rename into place" in error_line(r)
        assert (work / "out.gcz").read_bytes() == before
        assert sorted(p.name for p in work.iterdir()) == ["g.npy", "out.gcz"]  # no state, no temporary
        # The other way round: OUTPUT is the user's own, the state another user's. OUTPUT goes in
        # place first, the state's rename is refused, and OUTPUT gets its old file back.
        gcz("encode", work / "g.npy", "-o", work / "root.gcz", "-c", "topk", "--ef-state", work / "ef.gcz", "-q",
            check=True)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(GCZ), "encode", str(work / "g.npy")]
        r = subprocess.run([*nobody, "-o", str(work / "mine.gcz"), "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        mine, state = (work / "mine.gcz").read_bytes(), (work / "ef.gcz").read_bytes()
        r = subprocess.run([*nobody, "-o", str(work / "mine.gcz"), "-c", "topk", "--ef-state", str(work / "ef.gcz"),
                            "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == EXIT_IO, r.stderr
        assert "ef.gcz: cannot rename into place" in error_line(r)
        assert (work / "mine.gcz").read_bytes() == mine and (work / "ef.gcz").read_bytes() == state
        assert sorted(p.name for p in work.iterdir()) == ["ef.gcz", "g.npy", "mine.gcz", "out.gcz", "root.gcz"]
    finally:
        shutil.rmtree(work)


def test_a_directory_output_refuses_paths_too_long_and_names_that_collide(tmp_path):
    """Names within the per-part limits whose whole path would pass 4095 bytes, and a name whose file
    NAME.npy another name uses as a directory, are refused up front in one short line (exit 2),
    whatever their order; .npz takes both."""
    deep = "/".join(["d" * 200] * 20) + "/" + "f" * 75  # 4095 bytes, every part within its limit
    write_safetensors(tmp_path / "deep.safetensors", {deep: np.ones(2, np.float32)})
    gcz("encode", tmp_path / "deep.safetensors", "-o", tmp_path / "deep.gcz", "-c", "none", "-q", check=True)
    r = gcz("decode", tmp_path / "deep.gcz", "-o", f"{tmp_path}/d/")
    assert r.returncode == EXIT_USAGE and len(r.stderr) < 500, r.stderr
    assert "its file's path would be up to" in error_line(r) and not (tmp_path / "d").exists()
    gcz("decode", tmp_path / "deep.gcz", "-o", tmp_path / "deep.npz", check=True)
    for k, names in enumerate((["x", "x.npy/y"], ["x.npy/y", "x"])):
        write_safetensors(tmp_path / f"c{k}.safetensors", {n: np.ones(1, np.float32) for n in names})
        gcz("encode", tmp_path / f"c{k}.safetensors", "-o", tmp_path / f"c{k}.gcz", "-c", "none", "-q", check=True)
        r = gcz("decode", tmp_path / f"c{k}.gcz", "-o", f"{tmp_path}/o{k}/")
        assert r.returncode == EXIT_USAGE, r.stderr
        assert "tensor 'x': its file x.npy would be a directory that another tensor's name makes" in error_line(r)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f"o{k}")] == []
        gcz("decode", tmp_path / f"c{k}.gcz", "-o", tmp_path / f"c{k}.npz", check=True)


def test_a_name_too_long_for_a_file_name_is_refused_up_front(tmp_path):
    """A 4000-byte name decodes to .npz, and is refused for a directory in one short line (it had
    failed at the temporary file, the name written out twice: 8 KB)."""
    np.savez(tmp_path / "long.npz", **{"a" * 4000: np.ones(3, np.float32), "b" * 228: np.zeros(2, np.float32),
                                       "c" * 255 + "/x": np.zeros(1, np.float32)})
    gcz("encode", tmp_path / "long.npz", "-o", tmp_path / "long.gcz", "-q", check=True)
    r = gcz("decode", tmp_path / "long.gcz", "-o", f"{tmp_path}/d/")
    assert r.returncode == EXIT_USAGE and len(r.stderr) < 400, r.stderr
    assert "a part of its name has 4000 bytes, more than the 228" in r.stderr
    assert not (tmp_path / "d").exists()
    gcz("decode", tmp_path / "long.gcz", "-t", "b*", "-t", "c*", "-o", f"{tmp_path}/d/", check=True)
    assert (tmp_path / "d" / ("b" * 228 + ".npy")).is_file() and (tmp_path / "d" / ("c" * 255) / "x.npy").is_file()
    gcz("decode", tmp_path / "long.gcz", "-o", tmp_path / "back.npz", check=True)
    # The tables show it in part; --json whole.
    for command in (["eval", tmp_path / "long.npz"], ["info", tmp_path / "long.gcz"]):
        out = gcz(*command, check=True).stdout
        assert "a" * 23 + "..." + "a" * 46 + "  " in out and "a" * 80 not in out, out
    rep = json.loads(gcz("eval", tmp_path / "long.npz", "--json", check=True).stdout)
    assert "a" * 4000 in {t["name"] for t in rep["tensors"]}


def test_csv_keeps_a_name_that_holds_a_nul(tmp_path):
    """A safetensors key may hold U+0000: the CSV row has the whole name (it had ended at the NUL)."""
    header = json.dumps({"a\x00x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "n.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    r = subprocess.run([str(GCZ), "eval", str(tmp_path / "n.safetensors"), "-c", "none", "--csv"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.split(b"\n")
    assert rows[1].startswith(b'a\x00x,[2],float32,none,2,'), rows


def test_a_pipe_as_input_is_refused_at_once(tmp_path):
    """A FIFO given as an input (a tensor file or a .gcz) is refused: opening it had waited for a writer."""
    for name, command in (("p.npy", ["eval"]), ("p.gcz", ["info"]), ("q.gcz", ["verify"])):
        os.mkfifo(tmp_path / name)
        r = gcz(*command, tmp_path / name)
        assert r.returncode == 3 and "not a regular file" in error_line(r), r.stderr


def test_a_table_shortens_names_by_terminal_columns(tmp_path):
    """A name of 30 wide characters (60 columns, 90 bytes) is shown whole; one of 50 (100 columns)
    by its ends, in at most 72 columns, its columns aligned with the other rows'."""
    import unicodedata
    wide = lambda text: sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    np.savez(tmp_path / "w.npz", **{"层" * 30: np.ones(2, np.float32), "权" * 50: np.ones(2, np.float32),
                                    "x": np.ones(2, np.float32), "a" * 72: np.ones(2, np.float32),
                                    "b" * 73: np.ones(2, np.float32)})
    lines = gcz("eval", tmp_path / "w.npz", "-c", "fp16", check=True).stdout.splitlines()
    assert any(line.startswith("层" * 30 + " ") for line in lines), lines
    assert any(line.startswith("a" * 72 + " ") for line in lines), lines  # exactly 72 columns: whole
    assert any(line.startswith("b" * 23 + "..." + "b" * 46 + " ") for line in lines), lines
    cut = next(line for line in lines if line.startswith("权"))
    name = cut.split("  ")[0]
    assert "..." in name and wide(name) <= 72 and name.endswith("权" * 23), name
    starts = {wide(line[:line.index("[2]")]) for line in lines if "[2]" in line}
    assert len(starts) == 1, lines  # the shape column starts at one terminal column in every row
    # A cut falls between characters (a kept backslash before "x" is not taken for half an escape),
    # and a combining mark does not lose its base to the "...".
    np.savez(tmp_path / "e.npz", **{"b" * 40 + "\\x" + "层" + "c" * 44: np.ones(2, np.float32),
                                    "e\u0301" * 80: np.ones(2, np.float32)})
    r = subprocess.run([str(GCZ), "eval", str(tmp_path / "e.npz"), "-c", "none"], capture_output=True, timeout=60)
    out = r.stdout.decode("utf-8")  # strict: no byte of a cut character
    assert "..." + "\u0301" not in out and "...e\u0301" in out, out


def test_float64_beyond_what_squares_hold_is_not_measured_across_steps_either(tmp_path):
    """sum_rel_l2 follows the per-step rule: a float64 tensor of 1e-200 wiped out by fp32 is not
    measured (it had read 0.0, lossless), and one kept exactly is 0 at any magnitude."""
    np.save(tmp_path / "tiny.npy", np.full(64, 1e-200))
    for codec, want in (("fp32", None), ("none", 0.0)):
        rep = json.loads(gcz("eval", "--steps", tmp_path / "tiny.npy", tmp_path / "tiny.npy", "-c", codec,
                             "--json", check=True).stdout)
        for step in rep["steps"]:
            assert step["tensors"][0]["metrics"]["rel_l2"] == want
            assert step["tensors"][0]["metrics"]["sum_rel_l2"] == want, (codec, step)
            assert step["total"]["sum_rel_l2"] == want, (codec, step)


@needs_samples
def test_sort_and_top_choose_the_rows(tmp_path):
    """--sort orders the tensor rows (largest first, NaN last), --top keeps the first N; TOTAL is
    every tensor's, in every format."""
    full = json.loads(gcz("eval", SAMPLE, "-c", "topk", "--json", check=True).stdout)
    worst = sorted(full["tensors"], key=lambda t: -t["metrics"]["rel_l2"])[:3]
    rep = json.loads(gcz("eval", SAMPLE, "-c", "topk", "--sort", "rel_l2", "--top", "3", "--json", check=True).stdout)
    assert [t["name"] for t in rep["tensors"]] == [t["name"] for t in worst]
    assert rep["total"] == full["total"]
    rep = json.loads(gcz("eval", SAMPLE, "-c", "topk", "--sort", "cosine:asc", "--json", check=True).stdout)
    cos = [t["metrics"]["cosine"] for t in rep["tensors"]]
    assert cos == sorted(cos) and len(cos) == len(full["tensors"])
    rows = list(csv.reader(io.StringIO(gcz("eval", SAMPLE, "-c", "topk", "--sort", "name", "--top", "2", "--csv",
                                           check=True).stdout)))
    names = sorted(t["name"] for t in full["tensors"])[:2]
    assert [r[0] for r in rows[1:]] == names + ["TOTAL"], rows
    rows = list(csv.reader(io.StringIO(gcz("eval", SAMPLE, "-c", "topk", "--sort", "name:desc", "--top", "2", "--csv",
                                           check=True).stdout)))
    assert [r[0] for r in rows[1:]] == sorted((t["name"] for t in full["tensors"]), reverse=True)[:2] + ["TOTAL"]
    # The table's header "out" is bytes_out.
    by_out = json.loads(gcz("eval", SAMPLE, "-c", "topk", "--sort", "out", "--json", check=True).stdout)["tensors"]
    assert [t["name"] for t in by_out] == [t["name"] for t in sorted(full["tensors"],
                                                                     key=lambda t: -t["metrics"]["bytes_out"])]
    # CSV keeps the digits the metrics need (cosine near 1 differs from 1 in its sixth digit and on).
    rows = list(csv.DictReader(io.StringIO(gcz("eval", SAMPLE, "-c", "qsgd", "--csv", check=True).stdout)))
    as_json = {t["name"]: t["metrics"] for t in json.loads(gcz("eval", SAMPLE, "-c", "qsgd", "--json",
                                                                check=True).stdout)["tensors"]}
    for row in rows[:-1]:
        for key in ("cosine", "rel_l2", "norm_ratio"):
            assert math.isclose(float(row[key]), as_json[row["tensor"]][key], rel_tol=1e-8), (row["tensor"], key)
    table = gcz("eval", SAMPLE, "-c", "topk", "--sort", "rel_l2", "--top", "1", check=True).stdout.splitlines()
    assert table[1].startswith(worst[0]["name"] + " ") and f"{len(full['tensors'])} tensors" in table[-1]
    r = gcz("eval", SAMPLE, "--sort", "cosne")
    assert r.returncode == EXIT_USAGE and "--sort 'cosne': no such column (known: name, numel" in r.stderr
    for bad in ("rel_l2:up", "rel_l2:"):
        r = gcz("eval", SAMPLE, "--sort", bad)
        assert r.returncode == EXIT_USAGE and "asc or desc" in r.stderr, bad
    # sum_rel_l2 is measured only across steps: elsewhere it would leave the rows in file order.
    for cmd in (("eval", SAMPLE), ("encode", SAMPLE, "-o", tmp_path / "s.gcz")):
        r = gcz(*cmd, "--sort", "sum_rel_l2")
        assert r.returncode == EXIT_USAGE and "gcz eval --steps only" in r.stderr, (cmd, r.stderr)
    assert not (tmp_path / "s.gcz").exists()
    # The table's headers name the same columns; a tensor not measured comes first either way.
    header = json.loads(gcz("eval", SAMPLE, "-c", "topk", "--sort", "max_abs_err", "--top", "3", "--json",
                            check=True).stdout)
    assert [t["name"] for t in header["tensors"]] == [t["name"] for t in sorted(
        full["tensors"], key=lambda t: -t["metrics"]["max_abs_error"])[:3]]
    np.save(tmp_path / "ok.npy", np.array([0.5, 1.0], np.float32))
    np.save(tmp_path / "nan64.npy", np.full(4, 1e-200))
    for order in ("rel_l2", "rel_l2:asc", "cosine:asc"):
        rep = json.loads(gcz("eval", tmp_path / "ok.npy", tmp_path / "nan64.npy", "-c", "fp16", "--sort", order,
                             "--top", "1", "--json", check=True).stdout)
        assert [t["name"] for t in rep["tensors"]] == ["nan64"], (order, rep["tensors"])


def test_a_directory_notes_the_entries_it_cannot_read(tmp_path):
    """A symbolic link to nothing (a download that never finished), a link to a directory (not
    followed) and a pipe in a directory input are noted as skipped, not passed over in silence; the
    rest is read."""
    d = tmp_path / "d"
    d.mkdir()
    np.save(d / "x.npy", np.ones(4, np.float32))
    (d / "shard.safetensors").symlink_to(tmp_path / "missing-blob")
    os.mkfifo(d / "f.npy")
    (tmp_path / "elsewhere").mkdir()
    np.save(tmp_path / "elsewhere" / "y.npy", np.ones(4, np.float32))
    (d / "sub").symlink_to(tmp_path / "elsewhere")
    r = gcz("eval", d, "--json", check=True)
    rep = json.loads(r.stdout)
    assert [t["name"] for t in rep["tensors"]] == ["x"]
    assert {(s["name"], s["reason"]) for s in rep["skipped"]} == {
        ("shard.safetensors", "a symbolic link to nothing"),
        ("sub", "a symbolic link to a directory (not followed)"),
        ("f.npy", "not a regular file (a pipe, device or socket)")}, rep["skipped"]
    assert "skipped" in r.stderr and "shard.safetensors: a symbolic link to nothing" in r.stderr, r.stderr
    assert "sub: a symbolic link to a directory (not followed)" in r.stderr, r.stderr


def test_a_file_inside_a_directory_also_given_is_refused(tmp_path):
    """The directory reads the file already: given both, the file's tensors would be encoded twice (or,
    for a shard index, under two names)."""
    d = tmp_path / "d"
    d.mkdir()
    np.save(d / "x.npy", np.ones(4, np.float32))
    for args in (["d", "d/x.npy"], ["./d/x.npy", "d/"]):
        r = gcz("encode", *args, "-o", "o.gcz", cwd=tmp_path)
        assert r.returncode == EXIT_USAGE and not (tmp_path / "o.gcz").exists(), r
        file = args[0] if args[0].endswith(".npy") else args[1]
        assert f"{file}: inside the input directory " in error_line(r), r.stderr
    # A file beside the directory, or reached through a link the directory does not follow, is not.
    np.save(tmp_path / "y.npy", np.ones(4, np.float32))
    (tmp_path / "e").mkdir()
    np.save(tmp_path / "e" / "z.npy", np.ones(4, np.float32))
    (d / "link").symlink_to(tmp_path / "e")
    rep = json.loads(gcz("eval", "d", "y.npy", "d/link/z.npy", "--json", cwd=tmp_path, check=True).stdout)
    assert [t["name"] for t in rep["tensors"]] == ["x", "y", "z"], rep["tensors"]


def test_standard_output_is_not_a_file_name_gcz_writes(tmp_path):
    """'-' means standard output to many tools; gcz refuses it rather than write a file named '-'."""
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    gcz("encode", "x.npy", "-o", "x.gcz", "-q", cwd=tmp_path, check=True)
    for args in (["encode", "x.npy", "-o", "-"], ["decode", "x.gcz", "-o", "-"],
                 ["encode", "x.npy", "-o", "y.gcz", "--ef-state", "-"]):
        r = gcz(*args, cwd=tmp_path)
        assert r.returncode == EXIT_USAGE and r.stdout == "", r
        assert "-: gcz writes its outputs to named files" in error_line(r), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gcz", "x.npy"]


def test_a_gcz_file_with_bytes_after_its_end_is_not_called_only_truncated(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    gcz("encode", tmp_path / "x.npy", "-o", tmp_path / "x.gcz", "-q", check=True)
    longer = tmp_path / "longer.gcz"
    longer.write_bytes((tmp_path / "x.gcz").read_bytes() + bytes(64))
    r = gcz("info", longer)
    assert r.returncode == EXIT_BAD_INPUT and "bad-end-magic" in error_line(r), r
    assert "(file truncated, not closed, or with bytes after its end)" in error_line(r), r.stderr


def test_verify_json_reports_every_file_and_exits_with_the_first_failure(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(300, dtype=np.float32))
    good = tmp_path / "good.gcz"
    gcz("encode", tmp_path / "a.npy", "-o", good, "-c", "qsgd", "-q", check=True)
    bad = tmp_path / "bad.gcz"
    bad.write_bytes(good.read_bytes()[:-1])
    missing = tmp_path / "missing.gcz"
    r = gcz("verify", "--json", good, missing, bad, good)
    assert r.returncode == EXIT_IO, r  # the missing file's, the first failure
    assert len(r.stderr.splitlines()) == 2 and all(ln.startswith("gcz: error: ") for ln in r.stderr.splitlines())
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and [f["path"] for f in doc["files"]] == [str(good), str(missing), str(bad), str(good)]
    ok = {"path": str(good), "ok": True, "tensors": 1, "streams": 2, "file_size": good.stat().st_size}
    assert doc["files"][0] == doc["files"][3] == ok, doc
    assert doc["files"][1]["exit_code"] == EXIT_IO and "no such file" in doc["files"][1]["error"].lower(), doc
    assert doc["files"][2]["exit_code"] == EXIT_BAD_INPUT and "bad-end-magic" in doc["files"][2]["error"], doc
    r = gcz("verify", good, "--json", check=True)
    assert json.loads(r.stdout) == {"ok": True, "files": [ok]} and r.stderr == ""


def test_an_npz_of_no_arrays_is_one_with_no_tensors(tmp_path):
    """numpy's savez() with no arrays writes a zip of its end record alone: no tensor in it, not a
    damaged archive, and a directory holding it is read as if it were not there."""
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "empty.npz")
    assert (tmp_path / "d" / "empty.npz").stat().st_size == 22
    r = gcz("eval", tmp_path / "d" / "empty.npz")
    assert r.returncode == EXIT_UNSUPPORTED, r
    assert error_line(r) == f"gcz: error: {tmp_path / 'd' / 'empty.npz'}: no floating-point tensor to encode", r
    np.save(tmp_path / "d" / "w.npy", np.ones(4, np.float32))
    rep = json.loads(gcz("eval", tmp_path / "d", "--json", check=True).stdout)
    assert [t["name"] for t in rep["tensors"]] == ["w"] and rep["skipped"] == [], rep
    # An end record that counts members the archive does not have is still a damaged one.
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x05\x06" + bytes(4) + b"\x01\x00\x01\x00" + bytes(10))
    r = gcz("eval", bad)
    assert r.returncode == EXIT_BAD_INPUT and "not a zip archive" in error_line(r), r


def test_outputs_that_cannot_be_renamed_into_place_are_refused_first(tmp_path):
    np.save(tmp_path / "w.npy", np.ones(4, np.float32))
    gcz("encode", tmp_path / "w.npy", "-o", tmp_path / "w.gcz", "-q", check=True)
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "e").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "e")
    cases = [(["encode", tmp_path / "w.npy", "-o", "new.gcz/"], "new.gcz/: a name ending in '/' is a directory's"),
             (["encode", tmp_path / "w.npy", "-o", "n.gcz", "--ef-state", "ef.gcz/"], "ef.gcz/: a name ending in"),
             (["decode", tmp_path / "w.gcz", "-o", "plain.txt/"], "plain.txt/: exists and is not a directory"),
             (["decode", tmp_path / "w.gcz", "-o", "link/"], "link/: exists and is a symbolic link"),
             (["decode", tmp_path / "w.gcz", "-o=d/"], "=d/: an output named with a leading '='"),
             (["decode", tmp_path / "w.gcz", "-o=w.npz"], "=w.npz: an output named with a leading '='")]
    for out, name in ((".", "."), ("./", "."), ("e/..", ".."), ("/", "/")):
        cases.append((["decode", tmp_path / "w.gcz", "-o", out], f"the output directory needs a name of its own "
                                                                  f"(e.g. restored/), not '{name}'"))
    before = sorted(p.name for p in tmp_path.iterdir())
    for command, words in cases:
        r = gcz(*command, cwd=tmp_path)
        assert r.returncode == EXIT_USAGE, (command, r)
        assert words in error_line(r), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    gcz("decode", tmp_path / "w.gcz", "-o", "e", cwd=tmp_path, check=True)  # an existing empty one is taken
    assert [p.name for p in (tmp_path / "e").iterdir()] == ["w.npy"]


def test_an_output_name_leaves_room_for_the_temporary_suffix(tmp_path):
    np.save(tmp_path / "w.npy", np.ones(4, np.float32))
    most = "a" * 228 + ".gcz"  # 232 bytes
    gcz("encode", tmp_path / "w.npy", "-o", most, "-q", cwd=tmp_path, check=True)
    for command in (["encode", tmp_path / "w.npy", "-o", "a" + most, "-q"],
                    ["encode", tmp_path / "w.npy", "-o", "x.gcz", "--ef-state", "a" + most, "-q"],
                    ["decode", most, "-o", "b" * 229 + ".npz"], ["decode", most, "-o", "c" * 233 + "/"]):
        r = gcz(*command, cwd=tmp_path)
        assert r.returncode == EXIT_USAGE, (command, r)
        assert ": a name of 233 bytes; the output is written under its name and a temporary suffix of up to 23 " \
               "bytes, so at most 232 fit" in error_line(r), r.stderr
    deep = tmp_path / "d"
    while len(str(deep)) < 4060:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    r = gcz("decode", tmp_path / most, "-o", deep / "out.npz")
    assert r.returncode == EXIT_USAGE and ": a path of " in error_line(r) and "at most 4072 fit" in error_line(r), r
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([most, "w.npy", "d"])


def test_safetensors_edges_said_as_the_format_says_them(tmp_path):
    """__metadata__: null is no metadata (the format's library reads it so); a dtype the format does
    not define is named as such; a header that is not JSON says where, without the parser's tag."""
    text = json.dumps({"__metadata__": None, "a": {"dtype": "f32", "shape": [3], "data_offsets": [0, 12]},
                       "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]}}).encode()
    (tmp_path / "t.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(24))
    r = gcz("eval", tmp_path / "t.safetensors", "-q", check=True)
    assert r.stderr == (f"gcz: note: skipped {tmp_path / 't.safetensors'}: a: dtype f32 is not a safetensors dtype "
                        "gcz knows (F16, BF16, F32 and F64 are the floating ones it reads)\n"), r.stderr
    gcz("encode", tmp_path / "t.safetensors", "-o", tmp_path / "t.gcz", "-q", check=True)
    assert json.loads(gcz("info", tmp_path / "t.gcz", "--json", check=True).stdout)["metadata"] == {}
    text = b'{"a": 1,,}'
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", len(text)) + text)
    r = gcz("eval", tmp_path / "bad.safetensors")
    assert r.returncode == EXIT_BAD_INPUT, r
    assert error_line(r) == (f"gcz: error: {tmp_path / 'bad.safetensors'}: safetensors header is not valid JSON: "
                             "parse error at line 1, column 9: syntax error while parsing object key - unexpected ','; "
                             "expected string literal"), r.stderr


def test_a_rule_for_a_name_with_an_equals_sign_escapes_it(tmp_path):
    write_safetensors(tmp_path / "t.safetensors", {"lr=0.1/w": np.ones(300, np.float32),
                                                   "v": np.ones(300, np.float32)})
    rep = json.loads(gcz("eval", tmp_path / "t.safetensors", "--rule", "lr\\=0.1/*=none", "--rule", "v=bf16",
                         "--json", check=True).stdout)
    assert {t["name"]: t["codec"] for t in rep["tensors"]} == {"lr=0.1/w": "none", "v": "bf16"}, rep["tensors"]
    r = gcz("eval", tmp_path / "t.safetensors", "--rule", "lr=0.1/*=none")
    assert r.returncode == EXIT_USAGE, r
    assert "(a '=' in a tensor's name is written '\\=' in GLOB)" in error_line(r), r.stderr
    r = gcz("eval", tmp_path / "t.safetensors", "--rule", "v=qsgd:bits=x")
    assert r.returncode == EXIT_USAGE and "GLOB" not in error_line(r), r.stderr


def test_eval_refuses_another_models_state_as_encode_does(tmp_path):
    np.savez(tmp_path / "s1.npz", b=np.ones(3, np.float32), w=np.linspace(-1, 1, 5, dtype=np.float32))
    np.savez(tmp_path / "s3.npz", x=np.ones(3, np.float32))
    ef = tmp_path / "ef.gcz"
    gcz("encode", tmp_path / "s1.npz", "-o", tmp_path / "o.gcz", "-c", "topk:k=1", "--ef-state", ef, "-q", check=True)
    refused = []
    for command in (["encode", tmp_path / "s3.npz", "-o", tmp_path / "o3.gcz", "--ef-state", ef],
                    ["eval", "--steps", tmp_path / "s3.npz", tmp_path / "s1.npz", "--ef", "--ef-state", ef]):
        r = gcz(*command)
        assert r.returncode == EXIT_USAGE and r.stdout == "", r
        refused.append(error_line(r).split(" (see ")[0])
    assert refused[0] == refused[1], refused
    assert f"the state {ef} holds residuals for 'b', 'w' and none for this step's tensors 'x'" in refused[1]
    # The first step matching, a later step of other names is warned of, not refused.
    r = gcz("eval", "--steps", tmp_path / "s1.npz", tmp_path / "s3.npz", "--ef", "--ef-state", ef, "-q", check=True)
    assert "no tensor of this step is named as one of the step before" in r.stderr, r.stderr


def test_meta_that_is_not_utf8_is_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    for meta in ("\udcff=1", "k=v\udcfe"):  # the bytes 0xff and 0xfe
        r = gcz("encode", tmp_path / "a.npy", "-o", tmp_path / "a.gcz", "--meta", meta)
        assert r.returncode == EXIT_USAGE, r
        assert "': not UTF-8 text, which a .gcz's metadata is" in error_line(r), r.stderr
        assert not (tmp_path / "a.gcz").exists()


def test_json_of_a_path_that_is_not_utf8_is_still_json(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    odd = os.fsdecode(bytes(tmp_path) + b"/odd\xff.gcz")
    gcz("encode", tmp_path / "a.npy", "-o", odd, "-q", check=True)
    for args in (("info", odd, "--json"), ("verify", odd, "--json")):
        r = gcz(*args, check=True)
        doc = json.loads(r.stdout)
        path = doc["path"] if args[0] == "info" else doc["files"][0]["path"]
        assert path == f"{tmp_path}/odd\ufffd.gcz", r.stdout


def test_csv_of_a_path_that_is_not_utf8_is_still_utf8(tmp_path):
    """eval --steps --csv names each step's file: a byte of it that is not UTF-8 is written as
    U+FFFD, as in JSON, so that the CSV reads as UTF-8 text."""
    odd = os.fsdecode(bytes(tmp_path) + b"/odd\xff")  # the directory: a tensor name must be UTF-8
    os.mkdir(odd)
    np.save(os.path.join(odd, "a.npy"), np.ones(4, np.float32))
    r = subprocess.run([str(GCZ), "eval", "--steps", os.path.join(odd, "a.npy"), "--csv"], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout.decode("utf-8"))))  # strict: a raw 0xff would raise
    assert [row["file"] for row in rows] == [f"{tmp_path}/odd\ufffd/a.npy"] * 2, rows


def test_a_directory_where_a_gcz_file_is_expected_is_named_as_one(tmp_path):
    for command in ("info", "verify"):
        r = gcz(command, tmp_path)
        assert r.returncode == EXIT_IO, r
        assert error_line(r) == f"gcz: error: {tmp_path}: a directory, not a file", r.stderr


def test_json_names_a_skipped_tensor_and_its_file_apart(tmp_path):
    np.savez(tmp_path / "m.npz", w=np.ones(4, np.float32), ids=np.arange(3))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("x")
    np.save(tmp_path / "d" / "v.npy", np.ones(4, np.float32))
    rep = json.loads(gcz("eval", tmp_path / "m.npz", tmp_path / "d", "-c", "none", "--json", check=True).stdout)
    assert {(s["file"], s["name"]) for s in rep["skipped"]} == {
        (str(tmp_path / "m.npz"), "ids"), (str(tmp_path / "d"), "notes.txt")}, rep["skipped"]


def sharded_model(where: Path) -> Dict[str, np.ndarray]:
    """A safetensors checkpoint in two shards with its model.safetensors.index.json; returns the tensors."""
    rng = np.random.default_rng(7)
    tensors = {f"layers.{i}.weight": rng.standard_normal((8, 16)).astype(np.float32) for i in range(3)}
    shards = {"model-00001-of-00002.safetensors": ["layers.0.weight", "layers.1.weight"],
              "model-00002-of-00002.safetensors": ["layers.2.weight"]}
    where.mkdir(parents=True, exist_ok=True)
    for shard, names in shards.items():
        write_safetensors(where / shard, {n: tensors[n] for n in names})
    (where / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 384}, "weight_map": {n: s for s, names in shards.items() for n in names}}))
    return tensors


def test_the_shards_of_a_sharded_safetensors_checkpoint_are_one_model(tmp_path):
    """Tensors of shards that a NAME.safetensors.index.json names keep their own names (with the
    index's directory within the input directory), from the directory or from the index itself."""
    tensors = sharded_model(tmp_path / "ckpt" / "model")
    np.save(tmp_path / "ckpt" / "extra.npy", np.ones(4, np.float32))
    for given, want in [(tmp_path / "ckpt" / "model", list(tensors)),
                        (tmp_path / "ckpt" / "model" / "model.safetensors.index.json", list(tensors)),
                        (tmp_path / "ckpt", ["extra"] + [f"model/{n}" for n in tensors])]:
        r = gcz("encode", given, "-o", tmp_path / "m.gcz", "-c", "none", "--json")
        assert r.returncode == 0, r.stderr
        assert "index.json" not in r.stderr, r.stderr  # the index is read, not skipped
        assert sorted(t["name"] for t in json.loads(r.stdout)["tensors"]) == sorted(want), (given, r.stdout)
    gcz("decode", tmp_path / "m.gcz", "-o", tmp_path / "out.safetensors", check=True)
    got = read_safetensors(tmp_path / "out.safetensors")
    for name, a in tensors.items():
        assert np.array_equal(np.frombuffer(got["model/" + name][2], "<f4").reshape(a.shape), a), name


def test_a_shard_index_may_take_100_mib_and_not_a_byte_more(tmp_path):
    """The index is JSON read whole: past 100 MiB it is refused before it is parsed."""
    tensors = sharded_model(tmp_path / "m")
    index = tmp_path / "m" / "model.safetensors.index.json"
    text = index.read_bytes().rstrip()
    for size, ok in ((100 << 20, True), ((100 << 20) + 1, False)):
        index.write_bytes(text + b" " * (size - len(text)))
        r = gcz("eval", index, "-c", "none", "--json")
        if ok:
            assert r.returncode == 0, r.stderr
            assert sorted(t["name"] for t in json.loads(r.stdout)["tensors"]) == sorted(tensors)
        else:
            assert r.returncode == EXIT_BAD_INPUT, r
            assert f"{index}: a shard index of {size} bytes exceeds the 100 MiB limit" in error_line(r), r.stderr


@pytest.mark.parametrize("change, rule", [
    ("missing shard", "names shard 'model-00002-of-00002.safetensors', which is not a file there"),
    ("unlisted tensor", "'layers.1.weight': not in the weight_map of"),
    ("wrong shard", "'layers.1.weight': the weight_map of"),
    ("absent tensor", "'layers.9.weight': its shard 'model-00001-of-00002.safetensors' does not hold it"),
    ("outside", "names shard '../x.safetensors', which is not a relative path within the index's directory"),
    ("not safetensors", "names shard 'notes.txt', which is not a .safetensors file"),
    ("duplicate key", "has the key 'layers.0.weight' twice"),
    ("no weight_map", "needs a \"weight_map\" object"),
    ("not a string", "the weight_map value is not a file name"),
])
def test_a_shard_index_that_disagrees_with_its_shards_is_refused(change, rule, tmp_path):
    d = tmp_path / "model"
    sharded_model(d)
    index = d / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    wm = doc["weight_map"]
    if change == "missing shard":
        (d / "model-00002-of-00002.safetensors").unlink()
    elif change == "unlisted tensor":
        del wm["layers.1.weight"]
    elif change == "wrong shard":
        wm["layers.1.weight"] = "model-00002-of-00002.safetensors"
    elif change == "absent tensor":
        wm["layers.9.weight"] = "model-00001-of-00002.safetensors"
    elif change == "outside":
        wm["layers.2.weight"] = "../x.safetensors"
        write_safetensors(tmp_path / "x.safetensors", {"layers.2.weight": np.ones(2, np.float32)})
    elif change == "not safetensors":
        wm["layers.2.weight"] = "notes.txt"
        (d / "notes.txt").write_text("x")
    elif change == "no weight_map":
        del doc["weight_map"]
    elif change == "not a string":
        wm["layers.2.weight"] = 2
    text = json.dumps(doc)
    if change == "duplicate key":
        text = text.replace('"weight_map": {', '"weight_map": {"layers.0.weight": "model-00001-of-00002.safetensors", ')
    index.write_text(text)
    for given in (d, index):
        r = gcz("eval", given, "-c", "none")
        assert r.returncode == 4, (given, r.stderr)
        assert rule in error_line(r), (given, r.stderr)


@pytest.mark.parametrize("shard, rule", [
    ("../b/x.safetensors", "which is not a relative path within the index's directory"),
    ("x.bin\x00.safetensors", "which is not a relative path within the index's directory"),
    ("linked/x.safetensors", "which is not a file there (symbolic links to directories are not followed)"),
])
def test_a_shard_outside_the_index_directory_is_refused_however_the_input_is_given(shard, rule, tmp_path):
    """From the directory above, the index's directory, or the index itself: a shard in a sibling
    directory, a name a NUL would cut short, one through a linked directory, are all refused alike."""
    d = tmp_path / "a"
    sharded_model(d)
    (tmp_path / "b").mkdir()
    write_safetensors(tmp_path / "b" / "x.safetensors", {"c": np.ones(2, np.float32)})
    write_safetensors(d / "x.bin", {"c": np.ones(2, np.float32)})
    os.symlink(tmp_path / "b", d / "linked")
    index = d / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["c"] = shard
    index.write_text(json.dumps(doc))
    for given in (tmp_path, d, index):
        r = gcz("eval", given, "-c", "none")
        assert r.returncode == 4 and rule in error_line(r), (given, r.stderr)


def test_a_name_two_files_give_is_refused_naming_both(tmp_path):
    sharded_model(tmp_path)
    write_safetensors(tmp_path / "ema-1.safetensors", {"layers.0.weight": np.ones(2, np.float32)})
    (tmp_path / "ema.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"layers.0.weight": "ema-1.safetensors"}}))
    r = gcz("eval", tmp_path, "-c", "none")
    assert r.returncode == 4, r.stderr
    assert ("'layers.0.weight': two files in the directory give this name: ema-1.safetensors and "
            "model-00001-of-00002.safetensors") in error_line(r), r.stderr


def test_two_shard_indexes_may_not_name_one_shard(tmp_path):
    sharded_model(tmp_path)
    shutil.copy(tmp_path / "model.safetensors.index.json", tmp_path / "copy.safetensors.index.json")
    r = gcz("eval", tmp_path, "-c", "none")
    assert r.returncode == 4 and "two shard indexes name this shard" in error_line(r), r.stderr


def on_a_terminal(cmd) -> bytes:
    """What `cmd` draws on stderr when stderr is a terminal (a pseudo-terminal); it must succeed."""
    import pty
    leader, follower = pty.openpty()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=follower, timeout=300)
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert r.returncode == 0, drawn
    return drawn


def test_the_progress_line_escapes_names(tmp_path):
    """A tensor name or path from a file reaches the terminal escaped, as in every other output (a
    name with an OSC sequence could set the window title)."""
    name = "\x1b]0;TITLE\x07evil"
    header = json.dumps({name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "esc\x1b[31m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    drawn = on_a_terminal([str(GCZ), "eval", str(path), "-q"])
    assert b"\x1b]0" not in drawn and b"\x1b[31m" not in drawn, drawn
    assert b"\\x1b]0;TITLE\\x07evil" in drawn and b"esc\\x1b[31m" in drawn, drawn


@needs_samples
def test_the_progress_line_of_steps(tmp_path):
    """On a terminal, eval --steps says which step it is on, and counts bytes of the input's dtype
    (a bfloat16 step under --ef had counted its float32 working copy: 200%)."""
    steps = [SAMPLE, SAMPLE_BF16, SAMPLES / "step_0001.safetensors"]
    drawn = on_a_terminal([str(GCZ), "eval", "--steps", *map(str, steps), "-c", "topk", "--ef", "-q"])
    lines = [line for line in drawn.decode().replace("\r", "\n").split("\n") if "evaluating" in line]
    assert lines, drawn
    for k in (1, 2, 3):
        assert any(f"evaluating step {k}/3: " in line for line in lines), lines
        assert any(f"evaluating step {k}/3: (opening " in line and line.endswith(f"{steps[k - 1].name})")
                   for line in lines), lines
    for line in (line for line in lines if "(opening" not in line):
        pct = float(re.search(r" ([0-9.]+)% ", line).group(1))
        assert pct <= 100.0, line


@needs_samples
def test_the_progress_line_names_the_adaptive_level_being_tried(tmp_path):
    """With --adapt, each try is drawn with its level; the step's own encode, after them, without."""
    drawn = on_a_terminal([str(GCZ), "encode", str(SAMPLE), "-o", str(tmp_path / "a.gcz"), "--adapt", "fp16",
                           "--adapt", "topk:ratio=0.01", "--budget", "100KiB", "-q"])
    lines = [line for line in drawn.decode().replace("\r", "\n").split("\n") if "encoding" in line]
    for level in ("fp16", "topk:ratio=0.01"):
        assert any(line.startswith(f"\x1b[Kencoding (trying {level}) ") for line in lines), lines
    assert any(line.startswith("\x1b[Kencoding 22/22 ") for line in lines), lines


def test_a_name_with_a_nul_character_goes_only_where_it_can(tmp_path):
    """A safetensors key may hold U+0000: .gcz and .safetensors keep it; a directory, .npz and .h5,
    which would cut the name there, refuse it (the directory had looped for good on the temporary
    name it cut short, .npz had written two members 'a')."""
    header = json.dumps({"a\u0000x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "a\u0000y": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}).encode()
    (tmp_path / "n.safetensors").write_bytes(struct.pack("<Q", len(header)) + header +
                                             np.arange(4, dtype=np.float32).tobytes())
    gcz("encode", tmp_path / "n.safetensors", "-o", tmp_path / "n.gcz", "-c", "none", "-q", check=True)
    for out in ("d/", "n.npz", "n.h5"):
        r = subprocess.run([str(GCZ), "decode", str(tmp_path / "n.gcz"), "-o", f"{tmp_path}/{out}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == EXIT_USAGE, (out, r.stderr)
        assert "tensor 'a\\x00x': a name with a NUL character cannot become a path" in error_line(r), r.stderr
        assert not (tmp_path / out).exists()
    gcz("decode", tmp_path / "n.gcz", "-o", tmp_path / "back.safetensors", check=True)
    back = (tmp_path / "back.safetensors").read_bytes()
    (n,) = struct.unpack_from("<Q", back)
    assert sorted(json.loads(back[8:8 + n])) == ["a\u0000x", "a\u0000y"]
    assert back[8 + n:] == np.arange(4, dtype=np.float32).tobytes()


def test_threads_the_process_cannot_make_change_nothing_but_speed():
    """Where no more threads can be made (RLIMIT_NPROC), the work that a thread would have done runs
    on the calling one: the same bytes. Before, std::thread's exception aborted gcz or ended it with
    an internal error."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (RLIMIT_NPROC binds only another user, who has no other processes) and setpriv")
    work = Path(tempfile.mkdtemp(prefix="gcz-nproc-"))
    try:
        work.chmod(0o777)
        np.save(work / "g.npy", np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32))
        (work / "g.npy").chmod(0o644)
        gcz("encode", work / "g.npy", "-o", work / "free.gcz", "-c", "qsgd", "--threads", "2", "-q", check=True)
        # One process, gcz: its signal thread and the encoder's second are refused. (OpenBLAS, asked
        # for no threads of its own, makes none; by default it would stop at a failed one.)
        limited = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c",
                   f'ulimit -u 1 && exec "$0" encode {work / "g.npy"} -o {work / "limited.gcz"} -c qsgd '
                   "--threads 2 -q", str(GCZ)]
        r = subprocess.run(limited, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        assert (work / "limited.gcz").read_bytes() == (work / "free.gcz").read_bytes()
    finally:
        shutil.rmtree(work)


@needs_samples
def test_state_mistakes_are_caught_and_named(tmp_path):
    src = tmp_path / "g.safetensors"
    shutil.copy(SAMPLE, src)
    # The state named as the input (raw bytes under a name of their own would even be read as both;
    # a tensor format's extension is refused as such).
    raw = tmp_path / "g.dat"
    np.ones(8, np.float32).tofile(raw)
    r = gcz("encode", raw, "--dtype", "f32", "--shape", "8", "-o", tmp_path / "o.gcz", "--ef-state", raw, "-q")
    assert r.returncode == EXIT_USAGE and "--ef-state names an input" in error_line(r), r.stderr
    raw.unlink()
    r = gcz("encode", src, "-o", tmp_path / "o.gcz", "--ef-state", src, "-q")
    assert r.returncode == EXIT_USAGE and "extension of a tensor file format" in error_line(r), r.stderr
    # A state that is not one: the error says which option gave it.
    (tmp_path / "bad.gcz").write_bytes(b"not a gcz file at all, just some bytes" * 4)
    r = gcz("encode", src, "-o", tmp_path / "o.gcz", "--ef-state", tmp_path / "bad.gcz", "-q")
    assert r.returncode == EXIT_BAD_INPUT and error_line(r).startswith(f"gcz: error: --ef-state: {tmp_path}/bad.gcz")
    assert listing(tmp_path) == ["bad.gcz", "g.safetensors"]
    # --ef-codec without a state: error feedback was meant, and is not on.
    r = gcz("encode", src, "-o", tmp_path / "o.gcz", "--ef-codec", "fp16", "-q")
    assert r.returncode == EXIT_USAGE and "no --ef-state is given" in error_line(r), r.stderr
    assert listing(tmp_path) == ["bad.gcz", "g.safetensors"]
    # A state that shares no tensor name with the step is refused before any work, naming both sides.
    np.save(tmp_path / "other.npy", np.ones(10, np.float32))
    r = gcz("encode", src, "-o", tmp_path / "o.gcz", "-c", "fp16", "--ef-state", tmp_path / "ef.gcz", "-q",
            check=True)
    assert r.stderr.splitlines() == [f"gcz: note: --ef-state {tmp_path}/ef.gcz did not exist: this was step 0, "
                                     "from zero residuals"], r.stderr
    state_before = (tmp_path / "ef.gcz").read_bytes()
    r = gcz("encode", tmp_path / "other.npy", "-o", tmp_path / "o2.gcz", "-c", "fp16", "--ef-state",
            tmp_path / "ef.gcz", "-q")
    assert r.returncode == EXIT_USAGE and not (tmp_path / "o2.gcz").exists(), r.stderr
    line = error_line(r)
    assert f"the state {tmp_path}/ef.gcz holds residuals for 'blocks.0.mix.bias', " in line, line
    assert ", ... (22 in all) and none for this step's tensors 'other': another model's or run's state" in line, line
    assert (tmp_path / "ef.gcz").read_bytes() == state_before
    # One name shared is enough (a tensor new to the state starts from zero, and a note says so).
    np.save(tmp_path / "other.npy", np.ones(10, np.float32))
    r = gcz("encode", src, tmp_path / "other.npy", "-o", tmp_path / "o.gcz", "-c", "fp16", "--ef-state",
            tmp_path / "ef.gcz", "-q", check=True)
    assert r.stderr == ("gcz: note: the error-feedback state holds no residual for 'other', which starts from zero "
                        "(new, or renamed since)\n"), r.stderr
    # A tensor whose shape changed: the error names the state, and says what to do.
    np.save(tmp_path / "other.npy", np.ones(12, np.float32))
    r = gcz("encode", tmp_path / "other.npy", "-o", tmp_path / "o3.gcz", "--ef-state", tmp_path / "ef.gcz", "-q")
    assert r.returncode == EXIT_USAGE and not (tmp_path / "o3.gcz").exists()
    line = error_line(r)
    assert f"tensor 'other': the state {tmp_path}/ef.gcz holds a residual of shape [10]" in line, line
    assert "start a new state file" in line, line


@needs_samples
def test_each_step_draws_with_its_own_seed(tmp_path):
    steps = [SAMPLES / f"step_000{k}.safetensors" for k in range(3)]
    state, outs, chain = tmp_path / "ef.gcz", [], []
    for k, step in enumerate(steps):
        outs.append(tmp_path / f"s{k}.gcz")
        r = gcz("encode", step, "-o", outs[-1], "-c", "randomk", "--seed", "7", "--ef-state", state, "--json",
                check=True)
        chain.append(json.loads(r.stdout))
        assert (chain[-1]["step"], chain[-1]["seed"]) == (k, 7 + k)
        meta = json.loads(gcz("info", state, "--json", check=True).stdout)["metadata"]
        assert meta["gcz.ef_steps"] == str(k + 1), meta
    assert [set(tensor_seeds(o)) for o in outs] == [{7}, {8}, {9}]
    plain = json.loads(gcz("encode", steps[0], "-o", tmp_path / "p.gcz", "-c", "randomk", "--json", check=True).stdout)
    assert "step" not in plain and plain["seed"] == 0  # no state, no step
    # The table says which step this was, and its seed.
    r = gcz("encode", steps[0], "-o", tmp_path / "s3.gcz", "-c", "randomk", "--seed", "7", "--ef-state", state,
            check=True)
    assert r.stdout.splitlines()[-1] == f"error feedback: step 3 of {state}, drawn with seed 10", r.stdout
    # Random-K keeps other indices at every step (the state's residuals are sent in turn).
    kept = []
    for o in outs:
        gcz("decode", o, "-o", tmp_path / "d.npz", "-t", "embed.weight", check=True)
        kept.append(np.flatnonzero(np.load(tmp_path / "d.npz")["embed.weight"]))
    assert not np.array_equal(kept[0], kept[1]) and not np.array_equal(kept[1], kept[2])
    # eval --steps --ef gives the same numbers as the chain of encodes, seed for seed.
    ev = json.loads(gcz("eval", "--steps", *steps, "-c", "randomk", "--seed", "7", "--ef", "--json",
                        check=True).stdout)
    assert [s["seed"] for s in ev["steps"]] == [7, 8, 9]
    for s, c in zip(ev["steps"], chain):
        want = {t["name"]: t["metrics"]["rel_l2"] for t in c["tensors"]}
        assert {t["name"]: t["metrics"]["rel_l2"] for t in s["tensors"]} == pytest.approx(want, rel=1e-12)


def test_a_nan_in_one_step_is_not_fed_back_into_the_next(tmp_path):
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal(64).astype(np.float32)
    x0[5], x0[6] = np.nan, np.inf
    x1 = rng.standard_normal(64).astype(np.float32)
    write_safetensors(tmp_path / "s0.safetensors", {"g": x0})
    write_safetensors(tmp_path / "s1.safetensors", {"g": x1})
    state = tmp_path / "ef.gcz"
    for k in range(2):
        gcz("encode", tmp_path / f"s{k}.safetensors", "-o", tmp_path / f"o{k}.gcz", "-c", "fp16",
            "--ef-state", state, "-q", check=True)
        gcz("decode", state, "-o", tmp_path / f"e{k}.npz", check=True)
        e = np.load(tmp_path / f"e{k}.npz")["residual/g"]
        assert np.isfinite(e).all(), e
    assert np.load(tmp_path / "e0.npz")["residual/g"][5:7].tolist() == [0.0, 0.0]
    gcz("decode", tmp_path / "o1.gcz", "-o", tmp_path / "d1.npz", check=True)
    assert np.isfinite(np.load(tmp_path / "d1.npz")["g"]).all()  # step 1 is all finite, and so is its x̂


@needs_samples
def test_eval_steps_opens_every_input_and_checks_the_state_before_the_first_step(tmp_path):
    r = gcz("eval", "--steps", SAMPLE, tmp_path / "missing.safetensors", "-c", "topk")
    assert r.returncode == EXIT_IO and r.stdout == "" and "missing.safetensors" in error_line(r)
    r = gcz("eval", "--steps", SAMPLE, SAMPLE, "--ef", "--ef-state", tmp_path / "none.gcz")
    assert r.returncode == EXIT_IO and "no such file" in error_line(r)
    r = gcz("eval", "--steps", SAMPLE, SAMPLE, "--ef-state", tmp_path / "none.gcz")
    assert r.returncode == EXIT_USAGE and "needs --ef" in error_line(r)


def test_eval_steps_with_feedback_finds_a_change_of_shape_before_the_first_step(tmp_path):
    """With --ef a residual cannot follow a tensor into another shape or dtype: the steps' files are
    all opened first, so the change is an error before any step is computed (no report, no
    warnings of earlier steps), whether it comes between the steps or from the state."""
    for k, b in enumerate((np.ones(6, np.float32), np.ones(6, np.float32), np.ones((2, 3), np.float32))):
        write_safetensors(tmp_path / f"s{k}.safetensors", {"a": np.ones(10, np.float32), "b": b})
    np.savez(tmp_path / "s64.npz", a=np.ones(10, np.float64), b=np.ones(6, np.float32))
    for steps, held in ((["s0.safetensors", "s1.safetensors", "s2.safetensors"], "[6] (float32) in s1.safetensors"),
                        (["s0.safetensors", "s64.npz"], "[10] (float32) in s0.safetensors")):
        r = gcz("eval", "--steps", *steps, "-c", "topk", "--ef", cwd=tmp_path)
        assert r.returncode == EXIT_USAGE and r.stdout == "", r
        assert r.stderr.count("\n") == 1 and f"{steps[-1]}: tensor '" in r.stderr, r.stderr
        assert f"but {held}; a residual is not carried across a change of shape or dtype" in r.stderr, r.stderr
    # Without --ef the steps are independent: the sums start again, with a warning.
    r = gcz("eval", "--steps", "s0.safetensors", "s2.safetensors", "-c", "topk", "-q", cwd=tmp_path, check=True)
    assert "tensor 'b': shape [2, 3], [6] before: its sum_rel_l2 starts again" in r.stderr, r.stderr
    # From a state: the residual it holds.
    gcz("encode", "s0.safetensors", "-o", "o.gcz", "--ef-state", "ef.gcz", "-q", cwd=tmp_path, check=True)
    r = gcz("eval", "--steps", "s2.safetensors", "--ef", "--ef-state", "ef.gcz", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and r.stdout == "", r
    assert "s2.safetensors: tensor 'b': shape [2, 3] (float32), but [6] (float32) in the state ef.gcz" in r.stderr


@needs_samples
def test_eval_steps_from_a_state_numbers_them_on_from_its_count(tmp_path):
    """The steps of eval --steps --ef-state are the state's next ones: numbered, and seeded, as the
    chain of encode --ef-state runs would number them."""
    steps = [SAMPLES / f"step_000{k}.safetensors" for k in (1, 2)]
    gcz("encode", SAMPLE, "-o", tmp_path / "o.gcz", "-c", "randomk", "--ef-state", tmp_path / "ef.gcz", "-q",
        check=True)
    args = ["eval", "--steps", *steps, "-c", "randomk", "--ef", "--ef-state", tmp_path / "ef.gcz"]
    rep = json.loads(gcz(*args, "--json", check=True).stdout)
    assert [(s["step"], s["seed"]) for s in rep["steps"]] == [(1, 1), (2, 2)], rep["steps"]
    table = gcz(*args, check=True).stdout
    assert f"== step 1: {steps[0]} (1 of 2)" in table and f"== step 2: {steps[1]} (2 of 2)" in table, table
    assert [ln.split()[0] for ln in table.split("== summary")[1].splitlines()[2:]] == ["1", "2"], table
    csv_rows = gcz(*args, "--csv", check=True).stdout.splitlines()[1:]
    assert {row.split(",")[0] for row in csv_rows} == {"1", "2"}, csv_rows
    # Without a state they are numbered from 0.
    rep = json.loads(gcz("eval", "--steps", *steps, "-c", "randomk", "--ef", "--json", check=True).stdout)
    assert [(s["step"], s["seed"]) for s in rep["steps"]] == [(0, 0), (1, 1)], rep["steps"]


@needs_samples
def test_a_rule_that_matches_nothing_is_a_warning(tmp_path):
    r = gcz("eval", SAMPLE, "--rule", "nomatch*=none", "--rule", "*.bias=none", "-q", check=True)
    assert r.stderr.count("matched no tensor") == 1 and "'nomatch*=none'" in r.stderr, r.stderr
    r = gcz("eval", "--steps", SAMPLE, SAMPLE, "--rule", "nomatch*=none", "-q", check=True)
    assert r.stderr.count("matched no tensor") == 1, r.stderr
    # A rule shadowed by an earlier one, or reaching only tensors below --min-numel, chooses nothing.
    for args in (["--rule", "*=fp16", "--rule", "*.bias=none"], ["--rule", "*.bias=none", "--min-numel", "10000"]):
        r = gcz("eval", SAMPLE, *args, "-q", check=True)
        assert r.stderr.count("chose no tensor's codec") == 1 and "'*.bias=none'" in r.stderr, r.stderr


def test_a_rule_that_chose_one_tensor_is_not_said_to_have_chosen_none(tmp_path):
    """A rule chooses a tensor's codec when the tensor has at least --min-numel elements: one that did
    so for an earlier tensor is not forgotten at a later, smaller one (it had been, and warned)."""
    np.savez(tmp_path / "two.npz", **{"fc.a": np.ones(200, np.float32), "fc.b": np.ones(4, np.float32)})
    np.savez(tmp_path / "at.npz", **{"fc.c": np.ones(100, np.float32)})  # exactly --min-numel
    for name, expected in (("two.npz", ["fp16", "none"]), ("at.npz", ["fp16"])):
        args = [tmp_path / name, "--min-numel", "100", "--rule", "fc.*=fp16"]
        rep = json.loads(gcz("eval", *args, "--json", check=True).stdout)
        assert [t["codec"] for t in rep["tensors"]] == expected, rep["tensors"]
        r = gcz("eval", *args, "-q", check=True)
        assert "chose no tensor" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, words", [
    (["eval", "x.npy", "--threads", "-1"], "--threads: '-1' is not a whole number in 0..1024"),
    (["eval", "x.npy", "--report", "xml"], "--report"),
    (["eval", "x.npy", "--bogus"], "--bogus"),
    (["eval", "x.npy", "-c", "fp16", "-c", "bf16"], "--codec"),
    (["encode", "x.npy"], "--output is required"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["eval", "x.npy", "--min-numel", "-1"], "not a whole number"),
    (["eval", "x.npy", "--seed", "-1"], "not a whole number"),
    (["eval", "x.npy", "--seed", "18446744073709551616"], "not a whole number"),
    (["eval", "x.npy", "--seed", "1e23"], "not a whole number"),
    (["eval", "x.npy", "--threads", "100000"], "not a whole number in 0..1024"),
    (["eval", "x.npy", "--seed", "99999999999999999999999"], "not a whole number in 0..18446744073709551615"),
    (["encode", "x.npy", "-o", "x.gcz", "--meta", "gcz.ef_steps=3"], "gcz's own"),
    ([], "no command given (commands: encode, eval, decode, info, verify, bench)"),
    (["-X"], "unknown option '-X'"),
    (["eval", "x.npy", "-c", "fp16", "-c", "bf16"], "--codec takes one value and was given 2"),
    (["eval", "x.npy", "-c"], "--codec needs a value"),
    (["eval"], "missing INPUT (gradient dumps)"),
    (["info"], "missing FILE (the .gcz file)"),
    (["verify"], "missing FILE (the .gcz files)"),
    (["info", "a.gcz", "b.gcz"], "unexpected argument 'b.gcz' for gcz info"),
    (["decode", "x.gcz", "-o", "y.npy", "--threads", "2"], "unexpected arguments '--threads 2' for gcz decode"),
    (["bench", "--size-mib", "1.5"], "--size-mib: '1.5' is not a whole number"),
    (["bench", "--size-mib", "0"], "--size-mib: '0' is not a whole number in 1..9223372036854775807"),
    (["bench", "--repeat", "0"], "--repeat: '0' is not a whole number in 1..2147483647"),
    (["bench", "--threads", "1,-1"], "--threads: '-1' is not a whole number in 1..1024"),
    (["bench", "--threads", "0"], "--threads: '0' is not a whole number in 1..1024"),
    (["bench", "--threads", "1,,2"], "--threads: '' is not a whole number in 1..1024 (item 2 of '1,,2')"),
    (["bench", "--threads", "1,"], "--threads: '' is not a whole number in 1..1024 (item 2 of '1,')"),
    (["bench", "--threads", "2", "--threads", ","], "--threads: '' is not a whole number in 1..1024 (item 1 of ',')"),
    (["help", "nope"], "unknown command 'nope' (commands: encode, eval, decode, info, verify, bench"),
    (["help", "eval", "encode"], "'gcz help' takes one command (commands: encode,"),
    (["eval", "x.bin", "--dtype", "float", "--shape", "4"], "'float' is float32 in C but float64 in numpy"),
    (["eval", "x.bin", "--dtype", "f32", "--shape", "123456789012345,1234567890123456"],
     "--shape '123456789012345,1234567890123456': a size of more than 15 digits"),
    (["encode", "x.npy", "-o", "x.gcz", "--meta", "step"], "--meta 'step': expected KEY=VALUE"),
    (["eval", "x.npy", "-o", "x.gcz"], "unexpected argument '-o' for gcz eval (eval writes nothing: gcz encode -o"),
    (["eval", "x.npy", "--output=x.gcz"], "(eval writes nothing: gcz encode -o FILE writes a .gcz)"),
    (["eval", "x.npy", "--seed", ""], "--seed: '' is not a whole number"),
    (["eval", "x.bin", "--dtype", "f32", "--shape", "4,"], "--shape '4,': expected comma-separated sizes"),
    (["encode", "x.npy", "-o", "x.gcz", "--meta", "=v"], "--meta '=v': expected KEY=VALUE"),
    (["bogus\ncmd"], "unknown command 'bogus\\x0acmd'"),
    (["help", "x\ny"], "unknown command 'x\\x0ay'"),
    (["eval", "x.npy", "--no\x1b[2J"], "unexpected argument '--no\\x1b[2J' for gcz eval"),
    (["eval", "-lead.npy"], "unexpected argument '-lead.npy' for gcz eval (an unknown option; a file whose name "
                            "starts with '-' is given as ./-lead.npy or after --)"),
    (["verify", "-x.gcz"], "unexpected argument '-x.gcz' for gcz verify (an unknown option;"),
    (["encode", "x.npy", "--bogus"], "unexpected argument '--bogus' for gcz encode (and --output is required)"),
    (["encode", "x.npy", "-o=x.gcz"], "=x.gcz: an output named with a leading '=', as -o=NAME gives; write -o NAME"),
])
def test_command_line_mistakes_are_one_line(args, words):
    r = gcz(*args)
    assert r.returncode == EXIT_USAGE and r.stdout == "", r
    assert words in error_line(r)


def test_small_things_said_plainly(tmp_path):
    """One input given twice, an output in a missing directory, one .npy for several tensors, a single
    tensor counted, and bits per element too small for two decimals."""
    np.save(tmp_path / "a.npy", np.linspace(-1, 1, 1 << 20, dtype=np.float32))
    r = gcz("eval", "a.npy", "./a.npy", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE
    assert error_line(r).startswith("gcz: error: ./a.npy: the same input is given twice (as a.npy too)"), r.stderr
    gcz("encode", tmp_path / "a.npy", tmp_path / "a.npy", "-o", tmp_path / "x.gcz", check=False)
    assert not (tmp_path / "x.gcz").exists()
    r = gcz("encode", tmp_path / "a.npy", "-o", tmp_path / "x.gcz", "-c", "topk:k=1", check=True)
    total = [ln for ln in r.stdout.splitlines() if ln.startswith("TOTAL")][0].split()
    assert total[1:3] == ["1", "tensor"], total
    row = [ln for ln in r.stdout.splitlines() if ln.startswith("a ")][0]
    assert re.search(r" \d\.\de-03 ", row) and " 0.00 " not in row, row  # bits/el: 8 * 350 B / 2^20
    assert "(1 tensor, " in gcz("verify", tmp_path / "x.gcz", check=True).stdout
    for out, words in ((tmp_path / "no" / "y.npz", f"{tmp_path / 'no' / 'y.npz'}: {tmp_path / 'no'}: no such directory"),
                       (f"{tmp_path / 'no' / 'd'}/", f"{tmp_path / 'no'}: no such directory"),
                       (tmp_path / "a.npy" / "y.npz", f"{tmp_path / 'a.npy'} is not a directory")):
        r = gcz("decode", tmp_path / "x.gcz", "-o", out)
        assert r.returncode == EXIT_IO and words in error_line(r), r.stderr
    np.savez(tmp_path / "two.npz", p=np.ones(3, np.float32), q=np.ones(3, np.float32))
    gcz("encode", tmp_path / "two.npz", "-o", tmp_path / "two.gcz", "-q", check=True)
    r = gcz("decode", tmp_path / "two.gcz", "-o", tmp_path / "one.npy")
    assert r.returncode == EXIT_USAGE and "or decode one (gcz decode -t NAME)" in error_line(r), r.stderr
    gcz("decode", tmp_path / "two.gcz", "-o", tmp_path / "one.npy", "-t", "q", check=True)


def test_a_file_of_another_kind_is_named_for_what_it_is(tmp_path):
    """A PyTorch checkpoint under any name, a .gcz given to eval, a .npy given to decode, a .npy named
    .npz: the error says what the file is and what reads it."""
    import pickle
    import zipfile
    with zipfile.ZipFile(tmp_path / "model.pt", "w") as z:  # torch.save's layout: NAME/data.pkl first
        z.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
        z.writestr("archive/version", "3\n")
    shutil.copy(tmp_path / "model.pt", tmp_path / "pytorch_model.bin")
    shutil.copy(tmp_path / "model.pt", tmp_path / "model.safetensors")
    (tmp_path / "old.pt").write_bytes(pickle.dumps({"w": 1}, protocol=2))
    np.save(tmp_path / "g.npy", np.ones(64, np.float32))
    shutil.copy(tmp_path / "g.npy", tmp_path / "g.npz")
    gcz("encode", tmp_path / "g.npy", "-o", tmp_path / "g.gcz", "-q", check=True)
    torch = "it is a PyTorch checkpoint (torch.save), which gcz does not read: write the gradients with " \
            "safetensors.torch.save_file"
    cases = [
        (("eval", "model.pt"), EXIT_UNSUPPORTED, "model.pt: unknown tensor file extension '.pt'; " + torch),
        (("eval", "pytorch_model.bin"), EXIT_USAGE, "needs both an element dtype and a shape; " + torch),
        (("eval", "model.safetensors"), EXIT_BAD_INPUT, "exceeds the 100 MiB limit; " + torch),
        (("eval", "old.pt"), EXIT_UNSUPPORTED, "it is a Python pickle (an older torch.save checkpoint?), which gcz "
                                               "does not read"),
        (("eval", "g.gcz"), EXIT_UNSUPPORTED, "g.gcz: unknown tensor file extension '.gcz'; it is a .gcz file: gcz "
                                              "decode, info and verify read it"),
        (("eval", "g.npz"), EXIT_BAD_INPUT, "not a zip archive (no readable central directory); it is a .npy file: "
                                            "name it NAME.npy"),
        (("decode", "g.npy", "-o", "x.npz"), EXIT_BAD_INPUT, "g.npy: bad-magic: not a .gcz file (wrong magic bytes); "
                                                            "it is a .npy file: gcz encode and gcz eval read it"),
    ]
    for args, code, words in cases:
        r = gcz(*args, cwd=tmp_path)
        assert r.returncode == code and words in error_line(r), (args, r.returncode, r.stderr)


def test_safetensors_metadata_is_kept_and_given_back(tmp_path):
    """__metadata__ goes into the .gcz as safetensors.KEY (a --meta of that key wins) and comes back
    in a decoded .safetensors; other outputs have no place for it. Non-string values are refused, as
    safetensors itself refuses them."""
    def header_of(path):
        data = path.read_bytes()
        return json.loads(data[8:8 + struct.unpack_from("<Q", data)[0]])
    meta = {"step": "100", "loss": "0.25", "format": "pt"}
    write_safetensors(tmp_path / "g.safetensors", {"w": np.arange(6, dtype=np.float32)}, meta)
    gcz("encode", tmp_path / "g.safetensors", "-o", tmp_path / "g.gcz", "--meta", "safetensors.loss=0.5",
        "--meta", "run=7", "-q", check=True)
    info = json.loads(gcz("info", tmp_path / "g.gcz", "--json", check=True).stdout)["metadata"]
    assert info == {"run": "7", "safetensors.format": "pt", "safetensors.loss": "0.5", "safetensors.step": "100"}
    gcz("decode", tmp_path / "g.gcz", "-o", tmp_path / "back.safetensors", check=True)
    back = header_of(tmp_path / "back.safetensors")
    assert back["__metadata__"] == {"format": "pt", "loss": "0.5", "step": "100"}
    gcz("decode", tmp_path / "g.gcz", "-o", tmp_path / "back.npz", check=True)
    assert np.array_equal(np.load(tmp_path / "back.npz")["w"], np.arange(6, dtype=np.float32))
    write_safetensors(tmp_path / "plain.safetensors", {"w": np.ones(2, np.float32)})
    gcz("encode", tmp_path / "plain.safetensors", "-o", tmp_path / "p.gcz", "-q", check=True)
    gcz("decode", tmp_path / "p.gcz", "-o", tmp_path / "p.safetensors", check=True)
    assert "__metadata__" not in header_of(tmp_path / "p.safetensors")
    write_safetensors(tmp_path / "bad.safetensors", {"w": np.ones(2, np.float32)}, {"step": 100})
    r = gcz("eval", tmp_path / "bad.safetensors")
    assert r.returncode == EXIT_BAD_INPUT and "__metadata__ 'step' is not a string" in error_line(r), r.stderr


def test_big_endian_and_fortran_npy_encode_as_their_values(tmp_path):
    """A big-endian or Fortran-order .npy is read in place only where its bytes are the values as
    they are in memory; otherwise through the conversion. Either way the values come back exactly."""
    x = np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64)
    cases = {"be32": x.astype(">f4"), "be64": x.astype(">f8"), "fortran": np.asfortranarray(x),
             "be_fortran": np.asfortranarray(x.astype(">f4")), "le32": x}
    for name, a in cases.items():
        np.save(tmp_path / f"{name}.npy", a)
        gcz("encode", tmp_path / f"{name}.npy", "-o", tmp_path / f"{name}.gcz", "-c", "none", "-q", check=True)
        gcz("decode", tmp_path / f"{name}.gcz", "-o", tmp_path / f"{name}_back.npy", check=True)
        back = np.load(tmp_path / f"{name}_back.npy")
        assert back.dtype == a.dtype.newbyteorder("<") and np.array_equal(back, a), name
        # The chunked codecs read in place too: fp16 of the values, as numpy rounds them.
        r = gcz("eval", tmp_path / f"{name}.npy", "-c", "fp16", "--json", check=True)
        assert json.loads(r.stdout)["tensors"][0]["metrics"]["max_abs_error"] <= 2.0 ** -9, name


def test_directory_edge_names(tmp_path):
    """A file named only '.safetensors.index.json' is no shard index (nothing before the suffix);
    a tensor named 'a/' cannot become a file in a directory output."""
    d = tmp_path / "d"
    d.mkdir()
    np.save(d / "a.npy", np.ones(4, np.float32))
    (d / ".safetensors.index.json").write_text("{}")
    r = gcz("eval", d, "-c", "none", "--json", check=True)
    assert [t["name"] for t in json.loads(r.stdout)["tensors"]] == ["a"]
    assert "skipped" in r.stderr and ".safetensors.index.json" in r.stderr, r.stderr
    write_safetensors(tmp_path / "slash.safetensors", {"a/": np.ones(2, np.float32)})
    gcz("encode", tmp_path / "slash.safetensors", "-o", tmp_path / "slash.gcz", "-q", check=True)
    r = gcz("decode", tmp_path / "slash.gcz", "-o", f"{tmp_path / 'out'}/")
    assert r.returncode == EXIT_USAGE and "empty, '.' or '..' component" in error_line(r), r.stderr
    assert not (tmp_path / "out").exists()


def test_a_shard_that_is_a_symbolic_link_is_read_but_not_one_behind_a_linked_directory(tmp_path):
    """A directory's listing takes a shard file that is a symbolic link (as a download cache makes
    them), but not one reached through a linked directory, which the listing does not follow."""
    store, d = tmp_path / "store", tmp_path / "d"
    store.mkdir()
    d.mkdir()
    write_safetensors(store / "blob", {"w": np.arange(4, dtype=np.float32)})
    (d / "s1.safetensors").symlink_to(store / "blob")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "s1.safetensors"}}))
    r = gcz("eval", d / "model.safetensors.index.json", "-c", "none", "--json", check=True)
    assert [t["name"] for t in json.loads(r.stdout)["tensors"]] == ["w"]
    (d / "sub").symlink_to(store, target_is_directory=True)
    shutil.copy(store / "blob", store / "s2.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "sub/s2.safetensors"}}))
    r = gcz("eval", d / "model.safetensors.index.json", "-c", "none")
    assert r.returncode == EXIT_BAD_INPUT and "sub/s2.safetensors" in error_line(r), r.stderr


def test_help_command_prints_what_help_options_print():
    for command in ([], ["encode"], ["bench"]):
        r = gcz("help", *command, check=True)
        assert r.stdout == gcz(*command, "--help", check=True).stdout and r.stderr == "", command
    for asked in ("--help", "-h", "help"):
        assert gcz("help", asked, check=True).stdout == gcz("--help", check=True).stdout
    assert gcz("-V", check=True).stdout == gcz("--version", check=True).stdout


@needs_samples
def test_value_codec_that_refuses_every_tensor_is_a_usage_error_before_any_work(tmp_path):
    for command in (["eval", SAMPLE], ["bench", SAMPLE, "--repeat", "1"]):
        r = gcz(*command, "-c", "topk:values=(powersgd)")
        assert r.returncode == EXIT_USAGE and r.stdout == "", r
        assert "it fails on every tensor (a 256x256 and a 2048x2048 float32 matrix both fail)" in error_line(r)


def test_names_with_control_characters_are_printed_escaped(tmp_path):
    name = "x\ny\x1b[31mred"
    write_safetensors(tmp_path / "c.safetensors", {name: np.full(16, np.nan, np.float32)})
    r = gcz("eval", tmp_path / "c.safetensors", check=True)
    for text in (r.stdout, r.stderr):
        assert "\x1b" not in text and "x\\x0ay\\x1b[31mred" in text, text
    gcz("encode", tmp_path / "c.safetensors", "-o", tmp_path / "c.gcz", "-q", check=True)
    r = gcz("info", tmp_path / "c.gcz")
    assert "\x1b" not in r.stdout and "x\\x0ay" in r.stdout


def test_names_print_by_terminal_columns_and_what_does_not_print_is_escaped(tmp_path):
    # A C1 CSI (U+009B, which some terminals obey), a right-to-left override and a zero-width space
    # are escaped byte by byte; a wide character takes two columns and a combining accent none.
    names = {"c1\u009b31m": "c1\\xc2\\x9b31m", "bidi\u202eabc": "bidi\\xe2\\x80\\xaeabc",
             "zero\u200bwidth": "zero\\xe2\\x80\\x8bwidth",
             "\u5c421": "\u5c421", "e\u0301": "e\u0301", "plain": "plain"}
    write_safetensors(tmp_path / "n.safetensors", {n: np.ones(4, np.float32) for n in names})
    gcz("encode", tmp_path / "n.safetensors", "-o", tmp_path / "n.gcz", "-q", check=True)
    columns = {"\u5c421": 3, "e\u0301": 1}
    for command in (["eval", tmp_path / "n.safetensors"], ["info", tmp_path / "n.gcz"]):
        out = subprocess.run([str(GCZ), *map(str, command)], capture_output=True, check=True).stdout.decode()
        rows = {shown: ln for ln in out.splitlines() for shown in names.values() if ln.startswith(shown + " ")}
        assert len(rows) == len(names), out
        # The second column starts in the same terminal column on every row.
        starts = {columns.get(shown, len(shown)) + len(ln) - len(shown) - len(ln[len(shown):].lstrip())
                  for shown, ln in rows.items()}
        assert len(starts) == 1, out


@pytest.mark.parametrize("args, says", [
    (["x.npy", "y"], "tensor 'x' appears in both "),  # y/x.npy is named 'x' too
    (["r.bin", "--dtype", "f32"], "and --shape is missing"),
    (["r.bin", "--dtype", "f32", "--shape", ""], "--shape: expected comma-separated sizes"),
    (["x.npy", "--rule", "noequals"], "--rule 'noequals': expected GLOB=SPEC"),
])
def test_usage_errors_say_what_and_point_to_help(args, says, tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    (tmp_path / "y").mkdir()
    np.save(tmp_path / "y" / "x.npy", np.ones(4, np.float32))
    np.ones(4, np.float32).tofile(tmp_path / "r.bin")
    r = gcz("eval", *args, cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r
    line = error_line(r)
    assert says in line and line.endswith(" (see 'gcz eval --help')"), line
    if "appears in both" in says:
        assert "gcz eval --steps" in line, line


def test_raw_options_without_a_raw_input_are_noted(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    r = gcz("eval", "x.npy", "--dtype", "f32", "--shape", "4", "-q", cwd=tmp_path, check=True)
    assert r.stderr.startswith("gcz: note: --dtype and --shape apply to raw binary input only"), r.stderr
    np.ones(4, np.float32).tofile(tmp_path / "r.bin")
    r = gcz("eval", "x.npy", "r.bin", "--dtype", "f32", "--shape", "4", "-q", cwd=tmp_path, check=True)
    assert r.stderr == "", r.stderr


def test_a_metadata_key_given_twice_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    r = gcz("encode", "x.npy", "-o", "x.gcz", "--meta", "step=1", "--meta", "step=2", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and not (tmp_path / "x.gcz").exists(), r
    assert error_line(r) == "gcz: error: --meta 'step=2': the key 'step' is given twice (see 'gcz encode --help')"


def test_an_output_of_no_known_extension_is_told_of_directories(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    gcz("encode", tmp_path / "x.npy", "-o", tmp_path / "x.gcz", "-q", check=True)
    r = gcz("decode", tmp_path / "x.gcz", "-o", tmp_path / "out")
    assert r.returncode == EXIT_UNSUPPORTED and "or a directory (a path ending in '/')" in error_line(r), r
    (tmp_path / "x.dat").write_bytes(bytes(16))
    r = gcz("eval", tmp_path / "x.dat")  # an input: raw bytes are an option
    assert r.returncode == EXIT_UNSUPPORTED and "any file as raw bytes given --dtype and --shape" in error_line(r), r


def test_names_that_are_not_utf8_are_refused(tmp_path):
    # An index is UTF-8 JSON: two such names would both have become 'bad\ufffd', a file gcz refuses.
    (tmp_path / "d").mkdir()
    for raw in (b"bad\xff", b"bad\xfe"):
        with open(os.path.join(bytes(tmp_path / "d"), raw + b".npy"), "wb") as f:
            np.save(f, np.ones(4, np.float32))
    for command in (["encode", "-o", tmp_path / "d.gcz"], ["eval"]):
        r = subprocess.run([str(GCZ), command[0], str(tmp_path / "d"), *map(str, command[1:])], capture_output=True)
        assert r.returncode == EXIT_UNSUPPORTED, r
        line = r.stderr.decode()  # strict: the message is UTF-8, the stray byte written as \xNN
        assert "tensor 'bad\\xfe': a .gcz tensor name is UTF-8 text" in line and line.count("\n") == 1, line
    assert not (tmp_path / "d.gcz").exists()


def test_npz_output_refuses_names_that_climb_out(tmp_path):
    write_safetensors(tmp_path / "e.safetensors", {"../evil": np.ones(4, np.float32)})
    gcz("encode", tmp_path / "e.safetensors", "-o", tmp_path / "e.gcz", "-q", check=True)
    r = gcz("decode", tmp_path / "e.gcz", "-o", tmp_path / "e.npz")
    assert r.returncode == EXIT_USAGE and "'..'" in error_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.gcz", "e.safetensors"]


def test_names_are_matched_and_written_by_character(tmp_path):
    write_safetensors(tmp_path / "u.safetensors", {"\u00fcn\u00ef": np.ones(4, np.float32), "abcde": np.ones(4, np.float32)})
    gcz("encode", tmp_path / "u.safetensors", "-o", tmp_path / "u.gcz", "--rule", "???=none", "-q", check=True)
    codecs = {t["name"]: t["codec"][0]["name"]
              for t in json.loads(gcz("info", tmp_path / "u.gcz", "--json", check=True).stdout)["tensors"]}
    assert codecs == {"\u00fcn\u00ef": "none", "abcde": "fp16"}  # '???' is three characters, not bytes
    gcz("decode", tmp_path / "u.gcz", "-o", tmp_path / "u.npz", check=True)
    assert sorted(np.load(tmp_path / "u.npz").files) == ["abcde", "\u00fcn\u00ef"]  # flagged UTF-8 in the zip
    # Tables pad by characters: the shape column starts at one place on every row.
    for command in (["eval", tmp_path / "u.safetensors"], ["info", tmp_path / "u.gcz"]):
        lines = gcz(*command, check=True).stdout.splitlines()
        rows = [ln for ln in lines if ln.startswith(("\u00fcn\u00ef ", "abcde "))]
        assert len(rows) == 2 and len({len(r) - len(r[5:].lstrip()) for r in rows}) == 1, lines


@pytest.mark.parametrize("name, extra", [("", []), ("x" * 5000, []), ("x" * 4090, ["--ef-state", "ef.gcz"])])
def test_encode_refuses_names_a_gcz_cannot_hold(name, extra, tmp_path):
    write_safetensors(tmp_path / "n.safetensors", {name: np.ones(3, np.float32)})
    r = gcz("encode", tmp_path / "n.safetensors", "-o", tmp_path / "n.gcz", *extra, cwd=tmp_path)
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    line = error_line(r)
    assert "a .gcz tensor name is 1-4096 bytes" in line and len(line) < 400, line
    assert ("4087 with error feedback" in line) == bool(extra), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.safetensors"]  # neither OUTPUT nor a state


@needs_samples
def test_dtype_and_shape_apply_to_raw_files_only(tmp_path):
    np.arange(9, dtype=np.float32).tofile(tmp_path / "r.bin")
    r = gcz("eval", tmp_path / "r.bin", SAMPLE, *RAW_ARGS, "--json", check=True)
    names = {t["name"] for t in json.loads(r.stdout)["tensors"]}
    assert "r" in names and "embed.weight" in names, names


def encode_once_mapped(tmp_path: Path, codec: str, name: str = "in.npy") -> subprocess.Popen:
    """Starts `gcz encode NAME -o out.gcz -c CODEC` in tmp_path on one thread, and returns once
    gcz has mapped NAME, or opened it (HDF5 reads through a file of its own; a few ms), or has ended."""
    p = subprocess.Popen([str(GCZ), "encode", name, "-o", "out.gcz", "-c", codec, "--threads", "1", "-q"],
                         cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    proc, path = Path(f"/proc/{p.pid}"), str(tmp_path / name)

    def opened() -> bool:
        if path in (proc / "maps").read_text():
            return True
        return any(os.readlink(fd) == path for fd in (proc / "fd").iterdir())

    for _ in range(5000):
        try:
            if opened():
                break
        except OSError:  # gone already (or a descriptor closed while listed: look again)
            if p.poll() is not None:
                break
    return p


def test_an_input_that_shrinks_while_read_is_an_error_not_a_crash(tmp_path):
    """gcz maps its inputs: a file truncated while it is read (rewritten in place) takes its pages
    away, and the next read of them raises SIGBUS. gcz says which file in one line, exit 3, and
    leaves no output."""
    np.save(tmp_path / "in.npy", np.random.default_rng(0).standard_normal(32 << 20, dtype=np.float32))
    p = encode_once_mapped(tmp_path, "topk:ratio=0.01")
    os.truncate(tmp_path / "in.npy", 4096)
    err = p.communicate(timeout=300)[1]
    if p.returncode == 0:
        pytest.skip("gcz read the whole input before it could be truncated")
    assert p.returncode == EXIT_IO and err.count("\n") == 1, (p.returncode, err)
    assert err == ("gcz: error: in.npy: the file shrank while gcz read it (was it rewritten in place? replace a "
                   "file by renaming a new one over it)\n"), err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.npy"]


def test_an_input_rewritten_in_place_while_read_is_an_error(tmp_path):
    """An input rewritten in place to the same length, while gcz reads it, would be read half old,
    half new: once a tensor is read, gcz checks the file is the one it opened, unchanged (size and
    modification time), and stops with exit 3, leaving nothing, if not."""
    np.save(tmp_path / "in.npy", np.random.default_rng(0).standard_normal((4096, 8192), dtype=np.float32))
    before = os.stat(tmp_path / "in.npy").st_mtime_ns
    # PowerSGD reads the tensor once, then multiplies (Top-K, which reads it in passes, checks itself).
    p = encode_once_mapped(tmp_path, "powersgd:rank=8")
    if p.poll() is not None:
        pytest.skip("gcz ended before its input could be rewritten")
    with open(tmp_path / "in.npy", "r+b") as f:  # the same length, other bytes, a later time
        f.seek(1 << 20)
        f.write(bytes(1 << 20))
    os.utime(tmp_path / "in.npy", ns=(before + 10**9, before + 10**9))
    err = p.communicate(timeout=300)[1]
    assert p.returncode == EXIT_IO, (p.returncode, err)  # its check comes after the products, long after this
    assert err == ("gcz: error: in.npy: the file changed while gcz read it (was it rewritten in place? replace a "
                   "file by renaming a new one over it)\n"), err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.npy"]
    # Replaced by a rename instead: the file gcz opened is read whole, and that is no error.
    np.save(tmp_path / "new.npy", np.ones(4, np.float32))
    p = encode_once_mapped(tmp_path, "powersgd:rank=8")
    os.replace(tmp_path / "new.npy", tmp_path / "in.npy")
    err = p.communicate(timeout=300)[1]
    assert p.returncode == 0 and "error" not in err, err
    info = json.loads(gcz("info", tmp_path / "out.gcz", "--json", check=True).stdout)
    assert info["tensors"][0]["shape"] == [4096, 8192]  # the file it opened, not the one renamed over it


@pytest.mark.parametrize("name", ["in.npz", "in.h5"])
def test_a_compressed_or_hdf5_input_rewritten_in_place_is_an_error(tmp_path, name):
    """The same check for the inputs gcz reads through a library rather than its mapping: a deflated
    .npz member (minizip) and an HDF5 dataset. A read that fails because of the change (a CRC that no
    longer matches) is reported as the change."""
    x = np.random.default_rng(0).standard_normal((4096, 8192), dtype=np.float32)
    if name == "in.npz":
        np.savez_compressed(tmp_path / name, g=x)
    else:
        np.save(tmp_path / "x.npy", x)
        gcz("encode", tmp_path / "x.npy", "-o", tmp_path / "x.gcz", "-c", "none", "-q", check=True)
        gcz("decode", tmp_path / "x.gcz", "-o", tmp_path / name, check=True)
        for f in ("x.npy", "x.gcz"):
            (tmp_path / f).unlink()
    before = os.stat(tmp_path / name).st_mtime_ns
    p = encode_once_mapped(tmp_path, "powersgd:rank=8", name)
    if p.poll() is not None:
        pytest.skip("gcz ended before its input could be rewritten")
    with open(tmp_path / name, "r+b") as f:  # the same length, other bytes, a later time
        f.seek(8 << 20)
        f.write(bytes(1 << 20))
    os.utime(tmp_path / name, ns=(before + 10**9, before + 10**9))
    err = p.communicate(timeout=300)[1]
    assert p.returncode == EXIT_IO, (p.returncode, err)  # its check comes after the products, long after this
    assert err == (f"gcz: error: {name}: the file changed while gcz read it (was it rewritten in place? replace a "
                   "file by renaming a new one over it)\n"), err
    assert sorted(x.name for x in tmp_path.iterdir()) == [name]


def gcz_under_limit(which: str, limit: int):
    """A function that runs gcz as gcz() does (without `check`), with the resource limit `which`
    ("RLIMIT_AS", "RLIMIT_FSIZE", ...) set to `limit`."""
    import resource

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(GCZ), *map(str, args)], capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: resource.setrlimit(getattr(resource, which), (limit, limit)))
    return run


def gcz_in_1gib_address_space():
    """gcz_under_limit for a 1 GiB address space; the test skips where gcz cannot start in one."""
    limited = gcz_under_limit("RLIMIT_AS", 1 << 30)
    if limited("--version").returncode != 0:
        pytest.skip("this gcz cannot start under a 1 GiB address-space limit (a sanitizer build reserves more)")
    return limited


def with_index(src: Path, dst: Path, edit) -> None:
    """Writes `src` with its index bytes replaced by edit(index bytes), the trailer's length and
    checksum fixed (the index is the last thing before the trailer)."""
    import xxhash  # the numpy reader's dependency, installed by .ci/setup.sh
    b = src.read_bytes()
    off, length = struct.unpack("<QQ", b[-32:-16])
    text = edit(b[off:off + length])
    dst.write_bytes(b[:off] + text + struct.pack("<QQQ", off, len(text), xxhash.xxh3_64_intdigest(text)) + b[-8:])


def test_an_index_too_costly_to_read_is_refused_not_a_crash(tmp_path):
    """An index of millions of small values (here 8 Mi empty objects under a key readers ignore, 24 MiB)
    would take about 800 MiB to read: refused with one line where that is more than half of what the
    process may use, instead of ending in an abort when the memory runs out; read where it is not."""
    np.save(tmp_path / "v.npy", np.arange(8, dtype=np.float32))
    gcz("encode", tmp_path / "v.npy", "-o", tmp_path / "v.gcz", "-q", check=True)

    def padded(text: bytes) -> bytes:
        return text[:-1] + b',"x":[' + b",".join([b"{}"] * (8 << 20)) + b"]}"

    with_index(tmp_path / "v.gcz", tmp_path / "big.gcz", padded)
    limited = gcz_in_1gib_address_space()
    for command in (["verify", tmp_path / "big.gcz"], ["info", tmp_path / "big.gcz"]):
        r = limited(*command)
        assert r.returncode == EXIT_UNSUPPORTED, r
        m = re.fullmatch(rf"gcz: error: {re.escape(str(tmp_path / 'big.gcz'))}: the index would take about \d+ MiB "
                         r"of memory to read, more than half of what this process may use \((\d+) MiB\)",
                         error_line(r))
        assert m and int(m[1]) <= 1024, r.stderr  # 1 GiB of address space, or less where a cgroup says so
    assert "(1 tensor, 1 stream, " in gcz("verify", tmp_path / "big.gcz", check=True).stdout


def test_bench_keeps_its_data_within_the_memory_the_process_may_use(tmp_path):
    limited = gcz_in_1gib_address_space()
    r = limited("bench", "--size-mib", "400", "-c", "fp16")
    assert r.returncode == EXIT_USAGE and r.stdout == "", r
    m = re.search(r"--size-mib must be 1\.\.(\d+) here \(a fifth of the memory this process may use", error_line(r))
    assert m and int(m[1]) <= 1024 // 5, r.stderr  # 1 GiB of address space, or less where a cgroup says so


def test_a_tensor_too_large_to_decode_whole_is_refused(tmp_path):
    """A tiny file may claim a Top-K tensor of 2^40 elements; decoding it whole is refused, not tried."""
    np.save(tmp_path / "v.npy", np.arange(8, dtype=np.float32))
    gcz("encode", tmp_path / "v.npy", "-o", tmp_path / "v.gcz", "-c", "topk:k=1", "-q", check=True)

    def huge(text: bytes) -> bytes:
        index = json.loads(text)
        index["tensors"][0]["shape"] = [1 << 40]
        return json.dumps(index, separators=(",", ":")).encode()

    with_index(tmp_path / "v.gcz", tmp_path / "huge.gcz", huge)
    for command in (["verify", tmp_path / "huge.gcz"], ["decode", tmp_path / "huge.gcz", "-o", tmp_path / "h.npy"]):
        r = gcz(*command)
        assert r.returncode == EXIT_UNSUPPORTED, r
        assert "decodes the tensor whole" in error_line(r)
    assert not (tmp_path / "h.npy").exists()


def test_a_state_whose_residual_is_too_large_for_memory_is_refused_before_it_is_read(tmp_path):
    """A state file's residuals are decoded whole when it is loaded: one claiming 2^40 elements (a Top-K
    residual, whose streams do not grow with the shape) is refused against the memory gcz may use,
    before an allocation is tried."""
    np.save(tmp_path / "v.npy", np.arange(8, dtype=np.float32))
    gcz("encode", tmp_path / "v.npy", "-o", tmp_path / "o.gcz", "--ef-state", tmp_path / "ef.gcz",
        "--ef-codec", "topk:k=1", "-q", check=True)

    def huge(text: bytes) -> bytes:
        index = json.loads(text)
        index["tensors"][0]["shape"] = [1 << 40]
        return json.dumps(index, separators=(",", ":")).encode()

    with_index(tmp_path / "ef.gcz", tmp_path / "huge.gcz", huge)
    r = gcz("encode", tmp_path / "v.npy", "-o", tmp_path / "o2.gcz", "--ef-state", tmp_path / "huge.gcz")
    assert r.returncode == EXIT_UNSUPPORTED, r
    assert f"{tmp_path / 'huge.gcz'}: tensor 'residual/v': 4398046511104 bytes decoded, more than this process " \
           "may use" in error_line(r), r.stderr
    assert not (tmp_path / "o2.gcz").exists()


@pytest.mark.parametrize("elements, words", [
    (1 << 29, "its codec topk decodes the tensor whole, in 2147483648 bytes of memory, more than this process may use"),
    (((1 << 30) - (1 << 20)) // 4, "out of memory decoding it (1072693248 bytes at once"),
])
def test_a_tensor_too_large_for_a_memory_limit_is_refused_by_name(elements, words, tmp_path):
    """Under ulimit -v (1 GiB here) the bound is the limit, not the machine: a tensor past it is refused
    before any work, and one just under it, which the allocation then cannot hold, is refused by file
    and tensor (exit 5) rather than as a bare "out of memory"."""
    np.save(tmp_path / "v.npy", np.arange(8, dtype=np.float32))
    gcz("encode", tmp_path / "v.npy", "-o", tmp_path / "v.gcz", "-c", "topk:k=1", "-q", check=True)

    def shaped(text: bytes) -> bytes:
        index = json.loads(text)
        index["tensors"][0]["shape"] = [elements]
        return json.dumps(index, separators=(",", ":")).encode()

    with_index(tmp_path / "v.gcz", tmp_path / "big.gcz", shaped)
    limited = gcz_in_1gib_address_space()
    for command in (["verify", tmp_path / "big.gcz"], ["decode", tmp_path / "big.gcz", "-o", tmp_path / "b.npy"]):
        r = limited(*command)
        assert r.returncode == EXIT_UNSUPPORTED, r
        assert f"big.gcz: tensor 'v': {words}" in error_line(r), r.stderr
    assert not (tmp_path / "b.npy").exists()


def test_a_file_size_limit_is_an_io_error_with_nothing_left_behind(tmp_path):
    """Past `ulimit -f` a write fails (SIGXFSZ ignored) and is reported as for a full disk: one line,
    exit 3, no temporary file; for HDF5, whose clean-up at exit would crash on the file it could not
    close, too."""
    np.save(tmp_path / "big.npy", np.random.default_rng(0).standard_normal(200_000).astype(np.float32))
    gcz("encode", tmp_path / "big.npy", "-o", tmp_path / "big.gcz", "-c", "none", "-q", check=True)
    limited = gcz_under_limit("RLIMIT_FSIZE", 100 * 1024)

    out = tmp_path / "out"
    out.mkdir()
    for command, words in ((["encode", tmp_path / "big.npy", "-o", out / "x.gcz", "-c", "none", "-q"],
                            "x.gcz: write failed: File too large"),
                           (["decode", tmp_path / "big.gcz", "-o", out / "x.npz"],
                            "x.npz: tensor 'big': write failed: File too large"),
                           (["decode", tmp_path / "big.gcz", "-o", out / "x.h5"],
                            "x.h5: tensor 'big': HDF5 write failed: file write failed: File too large"),
                           (["decode", tmp_path / "big.gcz", "-o", out / "x.npy"], "File too large"),
                           (["encode", tmp_path / "big.npy", "-o", out / "y.gcz", "-c", "topk", "--ef-state",
                             out / "ef.gcz", "-q"], f"gcz: error: {out}/ef.gcz: write failed: File too large")):
        r = limited(*command)
        assert r.returncode == EXIT_IO, (command, r)
        assert words in error_line(r) and error_line(r).count("File too large") == 1, r.stderr
        assert list(out.iterdir()) == [], list(out.iterdir())


def test_a_report_that_cannot_be_written_is_an_io_error(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    gcz("encode", tmp_path / "a.npy", "-o", tmp_path / "a.gcz", "-q", check=True)
    for command in (["eval", tmp_path / "a.npy"], ["eval", tmp_path / "a.npy", "--json"], ["info", tmp_path / "a.gcz"],
                    ["verify", tmp_path / "a.gcz"], ["--version"], ["eval", "--help"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([str(GCZ), *map(str, command)], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=300)
        assert r.returncode == EXIT_IO, (command, r)
        line = error_line(r)
        assert line.startswith("gcz: error: cannot write to standard output"), line
        assert line.endswith(": what gcz printed there is incomplete (the command's work is done: the files it "
                             "writes are in place)"), line
    # encode's outputs, the state's next step included, are in place: not to be encoded again.
    with open("/dev/full", "w") as full:
        r = subprocess.run([str(GCZ), "encode", str(tmp_path / "a.npy"), "-o", str(tmp_path / "b.gcz"), "-c", "topk",
                            "--ef-state", str(tmp_path / "s.gcz")], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=300)
    assert r.returncode == EXIT_IO and "the files it writes are in place" in r.stderr.splitlines()[-1], r
    meta = json.loads(gcz("info", tmp_path / "s.gcz", "--json", check=True).stdout)["metadata"]
    assert (tmp_path / "b.gcz").exists() and meta["gcz.ef_steps"] == "1", meta
    # With standard output closed, as `>&-` leaves it; -q prints nothing there, and succeeds.
    r = subprocess.run([str(GCZ), "eval", str(tmp_path / "a.npy")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=300, preexec_fn=lambda: os.close(1))
    assert r.returncode == EXIT_IO and "Bad file descriptor" in error_line(r), r
    r = subprocess.run([str(GCZ), "eval", str(tmp_path / "a.npy"), "-q"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and r.stderr == "", r


def test_an_interrupted_encode_leaves_no_temporary_file(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "big.npy", rng.standard_normal(1 << 24).astype(np.float32))
    interrupt_when(["encode", tmp_path / "big.npy", "-o", tmp_path / "big.gcz", "-c", "qsgd+zstd:level=19", "-q"],
                   tmp_path, "big.gcz.tmp-*", "the encode finished before it could be interrupted")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["big.npy"]


@pytest.mark.parametrize("command", ["encode", "eval"])
def test_inputs_without_a_floating_tensor_are_an_error(command, tmp_path):
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "ints.npz", a=np.arange(3), b=np.ones(2, np.int8))
    np.save(tmp_path / "ints.npy", np.arange(3))
    for src in ("empty", "ints.npz", "ints.npy"):
        out = ["-o", tmp_path / "o.gcz"] if command == "encode" else []
        r = gcz(command, tmp_path / src, *out)
        assert r.returncode == EXIT_UNSUPPORTED and r.stdout == "", r
        assert src in error_line(r)
    assert not (tmp_path / "o.gcz").exists()


@needs_samples
def test_eval_steps_warnings_name_their_step():
    """One norm-ratio line per step: how many tensors, and the lowest, as the step's JSON has them."""
    r = gcz("eval", "--steps", SAMPLE, SAMPLE_BF16, "-c", "topk", "--json", check=True)
    warnings = [line for line in r.stderr.splitlines() if "norm ratio" in line]
    assert len(warnings) == 2, r.stderr
    for line, step, path in zip(warnings, json.loads(r.stdout)["steps"], (SAMPLE, SAMPLE_BF16)):
        low = [t for t in step["tensors"] if t["metrics"]["norm_ratio"] < 0.9]
        worst = min(low, key=lambda t: t["metrics"]["norm_ratio"])
        assert line == (f"gcz: warning: {path}: {len(low)} tensors have a norm ratio below 0.9, the lowest "
                        f"'{worst['name']}' at {worst['metrics']['norm_ratio']:.3f}: the codec shrinks these "
                        "gradients (over-compression?)"), line


def test_eval_steps_warn_of_a_tensor_whose_shape_changed(tmp_path):
    """Without --ef its sums start again (with --ef it is an error): said once, at the step it changed."""
    for k, rows in enumerate((64, 32, 32)):
        np.savez(tmp_path / f"s{k}.npz", w=np.ones((rows, 8), np.float32), b=np.ones(4, np.float32))
    r = gcz("eval", "--steps", "s0.npz", "s1.npz", "s2.npz", "--json", cwd=tmp_path, check=True)
    assert r.stderr.splitlines() == [
        "gcz: warning: s1.npz: tensor 'w': shape [32, 8], [64, 8] before: its sum_rel_l2 starts again"], r.stderr
    r = gcz("eval", "--steps", "s0.npz", "s1.npz", "--ef", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and r.stdout == "", r
    assert "s1.npz: tensor 'w': shape [32, 8] (float32), but [64, 8] (float32) in s0.npz" in error_line(r), r.stderr


def test_eval_steps_count_a_rule_used_by_any_step(tmp_path):
    """A rule that chose a codec at one step is not warned of because a later step lacks its tensor."""
    np.savez(tmp_path / "s0.npz", x=np.ones(64, np.float32), y=np.ones(64, np.float32))
    np.savez(tmp_path / "s1.npz", y=np.ones(64, np.float32))
    r = gcz("eval", "--steps", tmp_path / "s0.npz", tmp_path / "s1.npz", "--rule", "x=bf16", "-q", check=True)
    assert "--rule" not in r.stderr, r.stderr
    r = gcz("eval", "--steps", tmp_path / "s0.npz", tmp_path / "s1.npz", "--rule", "z=bf16", "-q", check=True)
    assert "--rule 'z=bf16' matched no tensor" in r.stderr, r.stderr


def test_eval_steps_csv_has_a_step_and_file_column_and_each_steps_total(tmp_path):
    """--csv: each step's rows, its TOTAL last, after `step,file` (steps counted from 0, as in
    the table and --json), with the JSON's sum_rel_l2."""
    rng = np.random.default_rng(1)
    steps = []
    for s in range(3):
        steps.append(tmp_path / f"p{s}.npz")
        np.savez(steps[-1], a=rng.normal(size=300).astype(np.float32), b=rng.normal(size=200).astype(np.float32))
    args = ("eval", "--steps", *steps, "-c", "topk:k=20", "--ef")
    rows = list(csv.DictReader(io.StringIO(gcz(*args, "--csv", check=True).stdout)))
    rep = json.loads(gcz(*args, "--json", check=True).stdout)
    assert [(r["step"], r["file"], r["tensor"]) for r in rows] == [
        (str(k), str(f), t) for k, f in enumerate(steps) for t in ("a", "b", "TOTAL")]
    want = [m["sum_rel_l2"] for st in rep["steps"] for m in [t["metrics"] for t in st["tensors"]] + [st["total"]]]
    assert len(set(want)) == len(want), want  # every row's sum_rel_l2 differs: a row out of place shows
    for r, w in zip(rows, want):
        assert abs(float(r["sum_rel_l2"]) - w) <= 1e-8 * w, (r, w)


def test_zstd_at_its_highest_level_writes_a_file_that_reads_back(tmp_path):
    np.save(tmp_path / "w.npy", np.linspace(-1, 1, 4096, dtype=np.float32))
    gcz("encode", tmp_path / "w.npy", "-o", tmp_path / "w.gcz", "-c", "fp16+zstd:level=22", "-q", check=True)
    assert json.loads(gcz("info", tmp_path / "w.gcz", "--json", check=True).stdout)["tensors"][0]["codec"][1] == {
        "name": "zstd", "params": {"level": 22}}
    gcz("verify", tmp_path / "w.gcz", check=True)


def test_eval_steps_sums_leave_out_elements_whose_true_sum_is_not_finite(tmp_path):
    """A NaN in a step's gradient makes that element's true sum NaN: sum_rel_l2 is over the others,
    neither NaN nor 0 (the NaN in both of its sums would make it either)."""
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    np.save(tmp_path / "s0.npy", x)
    x_nan = x.copy()
    x_nan[7] = np.nan
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "b" / "s0.npy", x_nan)
    r = gcz("eval", "--steps", tmp_path / "s0.npy", tmp_path / "b" / "s0.npy", "-c", "fp16", "--json", check=True)
    last = json.loads(r.stdout)["steps"][-1]["tensors"][0]["metrics"]
    # fp16 rounds to nearest; the sums are in float64.
    def fp16(v):
        return v.astype(np.float16).astype(np.float64)
    sum_x = x.astype(np.float64) + x_nan
    err = (fp16(x) + fp16(x_nan)) - sum_x
    kept = np.isfinite(sum_x)
    want = math.sqrt(np.sum(err[kept] ** 2) / np.sum(sum_x[kept] ** 2))
    assert want > 1e-5 and abs(last["sum_rel_l2"] - want) <= 1e-9 * want, (last, want)


def test_the_state_records_its_step_count_as_the_residuals_seed(tmp_path):
    """A lossy --ef-codec that draws (QSGD) draws afresh at each save: the residuals' seed is the
    step count, recorded in the state beside gcz.ef_steps."""
    np.save(tmp_path / "w.npy", np.arange(8, dtype=np.float32))
    state = tmp_path / "ef.gcz"
    for step in (1, 2):
        gcz("encode", tmp_path / "w.npy", "-o", tmp_path / f"o{step}.gcz", "-c", "topk:k=2", "--ef-state", state,
            "--ef-codec", "qsgd", "-q", check=True)
        info = json.loads(gcz("info", state, "--json", check=True).stdout)
        assert info["metadata"]["gcz.ef_steps"] == str(step)
        assert [(t["name"], t["seed"]) for t in info["tensors"]] == [("residual/w", step)]


def test_eval_steps_that_share_no_name_are_warned_of(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    np.save(tmp_path / "b.npy", np.ones(4, np.float32))
    r = gcz("eval", "--steps", "a.npy", "a.npy", "b.npy", "-q", cwd=tmp_path, check=True)
    assert r.stderr.splitlines() == [
        "gcz: warning: b.npy: no tensor of this step is named as one of the step before, so sum_rel_l2 starts "
        "again for every tensor (steps of one model share their names; a .npy's tensor is named after its file: "
        "keep one file name from step to step, e.g. step_1/grad.npy, step_2/grad.npy)"], r.stderr


def test_norm_ratio_warnings_name_five_tensors_and_count_the_rest(tmp_path):
    rng = np.random.default_rng(3)
    write_safetensors(tmp_path / "g.safetensors", {f"t{i}": rng.normal(size=1000).astype(np.float32) for i in range(8)})
    r = gcz("eval", tmp_path / "g.safetensors", "-c", "topk:ratio=0.01", "-q", check=True)
    lines = r.stderr.splitlines()
    assert [ln.split("'")[1] for ln in lines[:5]] == ["t0", "t1", "t2", "t3", "t4"], r.stderr
    assert all("norm ratio" in ln and "is below 0.9" in ln for ln in lines[:5]), r.stderr
    assert lines[5:] == ["gcz: warning: 3 more tensors have a norm ratio below 0.9 (the report's norm_ratio column "
                         "has every tensor's)"], r.stderr


def test_the_norm_ratio_warning_is_below_0_9_and_not_above(tmp_path):
    """Top-K of k of 100 equal values keeps a norm ratio of sqrt(k / 100): 0.883 for k = 78 is
    warned of, 0.911 for k = 83 is not."""
    np.save(tmp_path / "t.npy", np.ones(100, np.float32))
    for k, warned in ((78, True), (83, False)):
        r = gcz("eval", tmp_path / "t.npy", "-c", f"topk:k={k}", "--json", check=True)
        ratio = json.loads(r.stdout)["tensors"][0]["metrics"]["norm_ratio"]
        assert abs(ratio - math.sqrt(k / 100)) < 1e-6, ratio
        assert ("norm ratio" in r.stderr) == warned, (k, r.stderr)


def test_an_npz_member_longer_than_its_array_is_refused_for_its_length():
    """Its CRC-32, over all its bytes, is right: the length is what is wrong, and the error says so."""
    src = CORRUPT / "inputs" / "npz-member-trailing-bytes.npz"
    r = gcz("eval", src, "-c", "fp16")
    assert r.returncode == EXIT_BAD_INPUT, r.stderr
    assert error_line(r) == (f"gcz: error: {src}: tensor 'a': the zip member holds 148 bytes, but its npy header "
                             "(shape [4], <f4) needs 144"), r.stderr


def test_an_encrypted_npz_member_is_noted_as_skipped(tmp_path):
    """An encrypted member is not read (gcz has no password to give it), but named in a note, and
    the archive's other members are encoded."""
    np.savez(tmp_path / "g.npz", a=np.ones(4, np.float32), b=np.arange(4, dtype=np.float32))
    data = bytearray((tmp_path / "g.npz").read_bytes())
    local, central = data.index(b"PK\x03\x04"), data.index(b"PK\x01\x02")  # a.npy's headers come first
    assert data[local + 30:local + 35] == b"a.npy" and data[central + 46:central + 51] == b"a.npy"
    data[local + 6] |= 1  # general-purpose flag bit 0: encrypted
    data[central + 8] |= 1
    (tmp_path / "enc.npz").write_bytes(bytes(data))
    r = gcz("eval", tmp_path / "enc.npz", "-c", "fp16", "--json", check=True)
    assert [t["name"] for t in json.loads(r.stdout)["tensors"]] == ["b"]
    assert f"gcz: note: skipped {tmp_path / 'enc.npz'}: a: the zip member is encrypted" in r.stderr, r.stderr


def test_a_npy_of_integers_is_skipped_as_in_a_directory_and_alone_is_refused(tmp_path):
    """`gcz eval dump/*.npy` goes on past a step counter, as `gcz eval dump/` does; an input of
    nothing but integers holds nothing to encode (exit 5)."""
    np.save(tmp_path / "w.npy", np.ones(4, np.float32))
    np.save(tmp_path / "step.npy", np.arange(3))
    r = gcz("eval", tmp_path / "w.npy", tmp_path / "step.npy", "-c", "fp16", "--json", check=True)
    assert [t["name"] for t in json.loads(r.stdout)["tensors"]] == ["w"]
    note = f"gcz: note: skipped {tmp_path / 'step.npy'}: step: dtype <i8 is not floating"
    assert r.stderr.splitlines() == [note], r.stderr
    r = gcz("eval", tmp_path, "-c", "fp16", "-q", check=True)
    assert r.stderr.splitlines() == [f"gcz: note: skipped {tmp_path}: step: dtype <i8 is not floating"], r.stderr
    for cmd in (("eval", tmp_path / "step.npy"), ("encode", tmp_path / "step.npy", "-o", tmp_path / "s.gcz")):
        r = gcz(*cmd)
        assert r.returncode == EXIT_UNSUPPORTED and error_line(r) == (
            f"gcz: error: {tmp_path / 'step.npy'}: no floating-point tensor to encode (skipped: step, dtype <i8 "
            "is not floating)"), r.stderr
    assert not (tmp_path / "s.gcz").exists()
    r = gcz("bench", tmp_path / "step.npy", "-c", "fp16")
    assert r.returncode == EXIT_UNSUPPORTED and "no floating-point tensor to measure" in error_line(r), r.stderr


def test_an_interrupted_decode_to_a_directory_leaves_nothing(tmp_path):
    import signal
    import time
    write_safetensors(tmp_path / "many.safetensors", {f"t{i}": np.full(4, i, np.float32) for i in range(8000)})
    gcz("encode", tmp_path / "many.safetensors", "-o", tmp_path / "many.gcz", "-c", "none", "-q", check=True)

    def written() -> int:  # files in the temporary output directory so far
        return sum(len(os.listdir(d)) for d in tmp_path.glob("out.tmp-*") if d.is_dir())

    left = []
    for _ in range(3):
        p = popen_interruptible(["decode", tmp_path / "many.gcz", "-o", str(tmp_path / "out") + "/"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Interrupted with thousands of files written and more coming: the removal races the writer.
        deadline = time.monotonic() + 60
        while written() < 2000 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if p.poll() is not None:
            pytest.skip("the decode finished before it could be interrupted")
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        assert p.returncode == -signal.SIGINT
        left += [x.name for x in tmp_path.iterdir() if x.name.startswith("out")]
    assert left == []  # neither the temporary directory nor a half-written output


def test_an_index_with_a_nul_byte_is_not_json(tmp_path):
    """The JSON parser stopped at a NUL byte as at the end of the text: an index with one after the
    object was accepted."""
    with_index(REPO / "tests" / "golden" / "fp16.gcz", tmp_path / "nul.gcz", lambda text: text + b"\0")
    r = gcz("verify", tmp_path / "nul.gcz")
    assert r.returncode == EXIT_BAD_INPUT and "index-json" in error_line(r)


def test_a_directory_output_at_the_path_length_limit(tmp_path):
    """A directory output's longest file path, counted as PATH, its temporary suffix (23 bytes at
    most), '/', the name and '.npy', is 4095 bytes (Linux's limit less the NUL): a name that makes
    exactly 4095 is written, one a byte longer refused before anything is made."""
    name = "n" * 100
    target = 4095 - 23 - 1 - len(name) - 4  # the length of the output path as given, its '/' counted
    deep = tmp_path
    while target - len(str(deep)) - 2 > 250:
        deep = deep / ("p" * 200)
    deep.mkdir(parents=True)
    out = str(deep / ("o" * (target - len(str(deep)) - 2))) + "/"
    assert len(out) == target
    np.savez(tmp_path / "in.npz", **{name: np.arange(3, dtype=np.float32), name + "x": np.ones(2, np.float32)})
    gcz("encode", tmp_path / "in.npz", "-o", tmp_path / "in.gcz", "-c", "none", "-q", check=True)
    r = gcz("decode", tmp_path / "in.gcz", "-o", out)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "its file's path would be up to 4096 bytes, more than the 4095 a path can take" in r.stderr, r.stderr
    assert list(deep.iterdir()) == []
    gcz("decode", tmp_path / "in.gcz", "-t", name, "-o", out, check=True)
    assert np.load(f"{out}{name}.npy").tolist() == [0.0, 1.0, 2.0]


def test_a_zstd_stream_over_several_chunks_keeps_every_byte(tmp_path):
    """A tensor of more than one chunk (2^24 elements) reaches zstd in several appends; the later
    ones, long enough to fill zstd's output buffer more than once, keep every byte."""
    x = np.random.default_rng(3).integers(0, 256, (1 << 24) + (1 << 18)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    gcz("encode", tmp_path / "x.npy", "-o", tmp_path / "x.gcz", "-c", "none+zstd", "-q", check=True)
    info = json.loads(gcz("info", tmp_path / "x.gcz", "--json", check=True).stdout)
    assert [s["encoding"] for s in info["tensors"][0]["streams"]] == ["zstd"], info["tensors"][0]["streams"]
    gcz("decode", tmp_path / "x.gcz", "-o", tmp_path / "y.npy", check=True)
    assert np.array_equal(np.load(tmp_path / "y.npy"), x)


def test_a_tensor_name_of_4096_bytes_is_the_longest(tmp_path):
    np.savez(tmp_path / "ok.npz", **{"n" * 4096: np.ones(3, np.float32)})
    np.savez(tmp_path / "long.npz", **{"n" * 4097: np.ones(3, np.float32)})
    gcz("encode", tmp_path / "ok.npz", "-o", tmp_path / "ok.gcz", "-q", check=True)
    gcz("decode", tmp_path / "ok.gcz", "-o", tmp_path / "back.npz", check=True)
    assert np.load(tmp_path / "back.npz")["n" * 4096].tolist() == [1.0, 1.0, 1.0]
    r = gcz("encode", tmp_path / "long.npz", "-o", tmp_path / "long.gcz", "-q")
    assert r.returncode != 0 and "(4097 bytes)" in r.stderr and not (tmp_path / "long.gcz").exists(), r.stderr


def test_error_feedback_refuses_a_residual_of_another_dtype(tmp_path):
    """A float64 residual is not read as float32 the step the tensor turns float32."""
    np.savez(tmp_path / "s1.npz", w=np.array([1.0, -2.0, 3.0, 0.5]))
    np.savez(tmp_path / "s2.npz", w=np.array([1.0, -2.0, 3.0, 0.5], np.float32))
    state = tmp_path / "state.gcz"
    gcz("encode", tmp_path / "s1.npz", "-o", tmp_path / "o1.gcz", "-c", "topk:k=1", "--ef-state", state, "-q",
        check=True)
    r = gcz("encode", tmp_path / "s2.npz", "-o", tmp_path / "o2.gcz", "-c", "topk:k=1", "--ef-state", state, "-q")
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "(float64) but the input is [4] (float32)" in r.stderr and "change of shape or dtype" in r.stderr, r.stderr


def test_error_feedback_metrics_compare_with_the_true_gradient(tmp_path):
    """With error feedback the report's error is that of x̂ against the step's gradient x, not
    against x + residual, which the codec was given (docs/CLI.md)."""
    rng = np.random.default_rng(11)
    state = tmp_path / "state.gcz"
    for step in (1, 2):
        x = rng.standard_normal(64).astype(np.float32)
        np.savez(tmp_path / f"s{step}.npz", w=x)
        rep = json.loads(gcz("encode", tmp_path / f"s{step}.npz", "-o", tmp_path / f"o{step}.gcz",
                             "-c", "topk:ratio=0.5", "--ef-state", state, "--json", check=True).stdout)
        gcz("decode", tmp_path / f"o{step}.gcz", "-o", tmp_path / f"d{step}.npz", check=True)
        xhat = np.load(tmp_path / f"d{step}.npz")["w"].astype(np.float64)
        want = np.linalg.norm(xhat - x) / np.linalg.norm(x.astype(np.float64))
        assert rep["tensors"][0]["metrics"]["rel_l2"] == pytest.approx(want, rel=1e-9), step


def test_eval_steps_without_ef_start_powersgd_cold_at_every_step(tmp_path):
    """Without --ef nothing is carried from step to step, PowerSGD's Q neither: step s is the
    single-step eval with seed SEED + s."""
    np.save(tmp_path / "m.npy", np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32))
    steps = json.loads(gcz("eval", "--steps", tmp_path / "m.npy", tmp_path / "m.npy", "-c", "powersgd:rank=2",
                           "--json", check=True).stdout)["steps"]
    for s in (0, 1):
        alone = json.loads(gcz("eval", tmp_path / "m.npy", "-c", "powersgd:rank=2", "--seed", str(s), "--json",
                               check=True).stdout)
        step = {k: v for k, v in steps[s]["tensors"][0]["metrics"].items() if k != "sum_rel_l2"}
        assert step == alone["tensors"][0]["metrics"], s
    carried = json.loads(gcz("eval", "--steps", tmp_path / "m.npy", tmp_path / "m.npy", "-c", "powersgd:rank=2",
                             "--ef", "--json", check=True).stdout)["steps"]
    assert carried[1]["tensors"][0]["metrics"]["rel_l2"] != steps[1]["tensors"][0]["metrics"]["rel_l2"]


def test_tensors_new_to_the_state_are_named(tmp_path):
    """A tensor the state holds no residual for starts from zero, and a note names it, counting the
    residuals the step left (a renamed tensor leaves its old one); eval --steps --ef says it per step."""
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "s0.npz", a=rng.standard_normal(100, dtype=np.float32),
             b=rng.standard_normal(50, dtype=np.float32))
    np.savez(tmp_path / "s1.npz", a=rng.standard_normal(100, dtype=np.float32),
             c=rng.standard_normal(50, dtype=np.float32), d=rng.standard_normal(5, dtype=np.float32))
    note = ("the error-feedback state holds no residual for 'c', 'd', which start from zero (new, or renamed since); "
            "it keeps 1 residual no tensor of this step took")
    for k in (0, 1):
        r = gcz("encode", tmp_path / f"s{k}.npz", "-o", tmp_path / f"o{k}.gcz", "-c", "topk:ratio=0.1", "--ef-state",
                tmp_path / "ef.gcz", "-q", check=True)
        assert (f"gcz: note: {note}" in r.stderr.splitlines()) == (k == 1), r.stderr
    r = gcz("eval", "--steps", tmp_path / "s0.npz", tmp_path / "s1.npz", "-c", "topk:ratio=0.1", "--ef", "-q",
            check=True)
    assert f"gcz: note: {tmp_path / 's1.npz'}: {note}" in r.stderr.splitlines(), r.stderr
    r = gcz("eval", "--steps", tmp_path / "s0.npz", tmp_path / "s1.npz", "-c", "topk:ratio=0.1", "-q", check=True)
    assert "no residual" not in r.stderr, r.stderr  # without --ef nothing is carried


def test_the_state_lists_a_residual_for_an_empty_tensor(tmp_path):
    """Every tensor of the step has its residual in the state, one of no elements too."""
    np.savez(tmp_path / "s.npz", w=np.array([1.0, -2.0, 3.0, 0.5], np.float32), z=np.zeros((0, 3), np.float32))
    state = tmp_path / "state.gcz"
    gcz("encode", tmp_path / "s.npz", "-o", tmp_path / "o.gcz", "-c", "topk:k=1", "--ef-state", state, "-q",
        check=True)
    info = json.loads(gcz("info", state, "--json", check=True).stdout)
    assert {(t["name"], tuple(t["shape"])) for t in info["tensors"]} == {("residual/w", (4,)), ("residual/z", (0, 3))}


def test_a_tensor_of_no_elements_has_no_bits_per_element(tmp_path):
    np.savez(tmp_path / "s.npz", z=np.zeros((0, 3), np.float32))
    rep = json.loads(gcz("eval", tmp_path / "s.npz", "--json", check=True).stdout)
    for m in (rep["tensors"][0]["metrics"], rep["total"]):
        assert m["numel"] == 0 and m["bytes_out"] > 0, m
        assert m["bits_per_element"] is None and m["ratio"] == 0.0, m  # bytes for no element: not measured
        assert (m["rel_l2"], m["cosine"]) == (0.0, 1.0), m  # reproduced exactly
    row = gcz("eval", tmp_path / "s.npz", check=True).stdout.splitlines()[1].split()
    assert row[0] == "z" and row[9:11] == ["0.00", "nan"], row  # name, shape, dtype, codec, in, out: 9 words


# ------------------------------------------------------------------------------------------------
# Adaptive compression (docs/CLI.md): --adapt levels, lightest first, and a --budget of bytes

LEVELS = ["fp16", "qsgd:bits=4", "topk:ratio=0.01"]
ADAPT = [a for level in LEVELS for a in ("--adapt", level)]


@needs_samples
def test_adaptive_compression_takes_the_lightest_level_that_fits():
    alone = [json.loads(gcz("eval", SAMPLE, "-c", level, "--json", check=True).stdout) for level in LEVELS]
    sizes = [rep["total"]["bytes_out"] for rep in alone]
    assert sizes == sorted(sizes, reverse=True), sizes
    for budget, level in ((sizes[0], 0), (sizes[0] - 1, 1), (sizes[1] + 1, 1), (sizes[2], 2), (sizes[1] - 1, 2)):
        r = gcz("eval", SAMPLE, *ADAPT, "--budget", str(budget), "--json", check=True)
        rep = json.loads(r.stdout)
        assert rep["adaptive"] == {"budget": budget, "level": level, "codec": LEVELS[level], "fits": True,
                                   "tried": [{"codec": c, "bytes": b} for c, b in zip(LEVELS, sizes[:level + 1])]}
        assert rep["total"]["bytes_out"] == sizes[level] and "warning: no --adapt level" not in r.stderr
        assert rep["tensors"] == alone[level]["tensors"]  # the same codecs, bytes and errors
    # Nothing fits: the strongest, and a warning.
    r = gcz("eval", SAMPLE, *ADAPT, "--budget", "1KiB", "--json", check=True)
    rep = json.loads(r.stdout)
    assert (rep["adaptive"]["level"], rep["adaptive"]["fits"]) == (2, False), rep["adaptive"]
    assert [t["bytes"] for t in rep["adaptive"]["tried"]] == sizes
    assert (f"gcz: warning: no --adapt level fits the budget of 1024 bytes: the strongest, 'topk:ratio=0.01', "
            f"takes {sizes[2]}") in r.stderr, r.stderr
    table = gcz("eval", SAMPLE, *ADAPT, "--budget", "200KiB", check=True).stdout
    assert (f"\nadaptive: budget 204800 bytes (200.0 KiB): level 2 of 3, 'qsgd:bits=4', {sizes[1]} bytes; "
            f"over it: 'fp16' {sizes[0]} bytes\n") in table, table
    # Exact bytes: a level a byte over the budget does not read as if it fitted.
    table = gcz("eval", SAMPLE, *ADAPT, "--budget", str(sizes[1] - 1), check=True).stdout
    assert f"over it: 'fp16' {sizes[0]} bytes, 'qsgd:bits=4' {sizes[1]} bytes" in table, table


@needs_samples
def test_adaptive_encode_writes_the_level_it_tried_and_carries_the_state_as_that_level_would(tmp_path):
    """The levels are tried on a copy of the state: the file and the state are byte for byte those of
    encoding the step with the chosen level directly, and the file fits the budget."""
    step1 = SAMPLES / "step_0001.safetensors"
    gcz("encode", SAMPLE, "-o", tmp_path / "s0.gcz", "-c", "topk", "--ef-state", tmp_path / "a.gcz", "-q",
        check=True)
    shutil.copy(tmp_path / "a.gcz", tmp_path / "b.gcz")
    r = gcz("encode", step1, "-o", tmp_path / "adaptive.gcz", *ADAPT, "--budget", "200KiB", "--ef-state",
            tmp_path / "a.gcz", "--json", check=True)
    assert json.loads(r.stdout)["adaptive"]["codec"] == "qsgd:bits=4"
    gcz("encode", step1, "-o", tmp_path / "direct.gcz", "-c", "qsgd:bits=4", "--ef-state", tmp_path / "b.gcz", "-q",
        check=True)
    assert (tmp_path / "adaptive.gcz").read_bytes() == (tmp_path / "direct.gcz").read_bytes()
    assert (tmp_path / "a.gcz").read_bytes() == (tmp_path / "b.gcz").read_bytes()
    assert (tmp_path / "adaptive.gcz").stat().st_size <= 200 * 1024


@needs_samples
def test_adaptive_steps_take_a_budget_each_and_error_feedback_carries_what_a_strong_step_dropped():
    steps = [SAMPLES / f"step_000{k}.safetensors" for k in range(3)]
    args = ["eval", "--steps", *steps, *ADAPT, "--budget", "600KiB,40KiB,600KiB"]
    runs = {ef: json.loads(gcz(*args, *(["--ef"] if ef else []), "--json", check=True).stdout) for ef in (False, True)}
    for rep in runs.values():
        assert [s["adaptive"]["codec"] for s in rep["steps"]] == ["fp16", "topk:ratio=0.01", "fp16"], rep["steps"]
        assert [s["adaptive"]["budget"] for s in rep["steps"]] == [600 * 1024, 40 * 1024, 600 * 1024]
    drift = {ef: rep["steps"][-1]["total"]["sum_rel_l2"] for ef, rep in runs.items()}
    assert drift[True] < 1e-3 < 0.1 < drift[False], drift
    summary = gcz(*args, "--ef", check=True).stdout.split("== summary")[1].splitlines()
    assert summary[1].split()[:3] == ["step", "file", "adapt"], summary
    assert [ln.split()[2] for ln in summary[2:]] == ["fp16", "topk:ratio=0.01", "fp16"], summary
    # One budget for every step.
    rep = json.loads(gcz("eval", "--steps", *steps, *ADAPT, "--budget", "40KiB", "--json", check=True).stdout)
    assert [s["adaptive"]["level"] for s in rep["steps"]] == [2, 2, 2]


@pytest.mark.parametrize("args, words", [
    (["-c", "fp16", "--adapt", "fp16", "--budget", "1MiB"], "-c and --adapt are both given"),
    (["--adapt", "fp16"], "--adapt is given without --budget"),
    (["--budget", "1MiB"], "--budget is given without --adapt"),
    (["--adapt", "fp16", "--budget", "1.5MiB"], "--budget: '1.5MiB' is not a size"),
    (["--adapt", "fp16", "--budget", "12XB"], "--budget: '12XB' is not a size"),
    (["--adapt", "fp16", "--budget", "0"], "--budget: '0' is 0 bytes; a .gcz takes at least 96"),
    (["--adapt", "fp16", "--budget", "000KiB"], "--budget: '000KiB' is 0 bytes"),
    (["--adapt", "fp16", "--budget", "95"], "--budget: '95' is 95 bytes; a .gcz takes at least 96"),
    (["--adapt", "fp16", "--budget", "17179869184G"], "--budget: '17179869184G' is more than 2^64 - 1 bytes"),
    (["--adapt", "fp16", "--budget", "18446744073709551616"], "is more than 2^64 - 1 bytes"),
    (["--adapt", "fp16", "--budget", "1KB"], "--budget: '1KB' is not a size (bytes, or with KiB MiB GiB"),
    (["--adapt", "fp16", "--budget", " 1MiB"], "--budget: ' 1MiB' is not a size"),
    (["--adapt", "fp16", "--budget", ""], "--budget: '' is not a size"),
    (["--adapt", "--budget", "1MiB"], "--adapt '--budget': a level is a codec spec; did --adapt lose its value"),
    (["--steps", "x.npy", "--adapt", "fp16", "--budget", "1K,2K"], "'1K,2K': 2 sizes for 1 step;"),
    (["--adapt", "fp16", "--budget", "1MiB,2MiB"], "one size here (a list, a size per step, is for eval --steps)"),
    (["--adapt", "fp16", "--adapt", "qsgd:bits=9", "--budget", "1MiB"], "--adapt 'qsgd:bits=9'"),
    (["--steps", "x.npy", "x2.npy", "--adapt", "fp16", "--budget", "1K,2K,3K"], "3 sizes for 2 steps"),
    (["--steps", "x.npy", "x2.npy", "--adapt", "fp16", "--budget", "1K,"], "--budget: '' is not a size"),
])
def test_adaptive_compression_mistakes_are_usage_errors(args, words, tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    np.save(tmp_path / "x2.npy", np.ones(4, np.float32))
    inputs = [] if "--steps" in args else ["x.npy"]
    r = gcz("eval", *inputs, *args, cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and r.stdout == "", r
    assert words in error_line(r), r.stderr


def test_budget_sizes_are_bytes_binary_or_decimal_multiples(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    for text, value in (("5000", 5000), ("700B", 700), ("3K", 3 << 10), ("3KiB", 3 << 10), ("2M", 2 << 20),
                        ("2MiB", 2 << 20), ("1G", 1 << 30), ("1GiB", 1 << 30), ("3kB", 3000), ("2MB", 2000000),
                        ("1GB", 10 ** 9), ("0001MiB", 1 << 20), ("00000000000000000001024", 1024),
                        ("18446744073709551615", (1 << 64) - 1), ("17179869183G", 17179869183 << 30)):
        rep = json.loads(gcz("eval", "x.npy", "--adapt", "fp16", "--budget", text, "--json", cwd=tmp_path,
                             check=True).stdout)
        assert rep["adaptive"]["budget"] == value, text
