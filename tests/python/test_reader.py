"""Cross-checks the independent Python reader (samples/python/gczread.py) against the C++ gcz tool.

For files written by `gcz encode`, gczread must decode every tensor to the same bits as
`gcz decode`, and agree with `gcz info --json` on names, shapes, dtypes, codec chains and streams.
Corrupted copies must be rejected with GczFormatError naming the FORMAT.md §6 rule (the same rule
`gcz verify` names).

Needs: numpy, pytest, xxhash, zstandard, and the gcz binary: $GCZ_BIN, default <repo>/build/gcz.
Run: python3 -m pytest -q tests/python/test_reader.py
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "samples" / "python"))

pytest.importorskip("xxhash", reason="gczread needs xxhash for XXH3-64: pip install xxhash")
pytest.importorskip("zstandard", reason="zstd streams need zstandard: pip install zstandard")
import xxhash  # noqa: E402
import zstandard  # noqa: E402

import gczread  # noqa: E402
from gczread import GczFile, GczFormatError  # noqa: E402

GCZ = Path(os.environ.get("GCZ_BIN", str(REPO / "build" / "gcz")))
pytestmark = pytest.mark.skipif(
    not (GCZ.is_file() and os.access(GCZ, os.X_OK)),
    reason=f"gcz binary not found at {GCZ}: build it (cmake, target gcz_cli) or set GCZ_BIN",
)

SAMPLES = REPO / "samples" / "grads"
SPECS = ["none", "fp32", "fp16", "bf16", "fp16+zstd", "bf16+zstd:level=9", "none+zstd"]
SAMPLE_INPUTS = ["step_0000.safetensors", "step_0000_bf16.safetensors"]

ST_DTYPE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
UINT = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}
# CODECS.md: which codecs are lossless for which original dtype.
LOSSLESS = {
    "none": {"float16", "bfloat16", "float32", "float64"},
    "fp32": {"float16", "bfloat16", "float32"},
    "fp16": {"float16"},
    "bf16": {"bfloat16"},
}


# ------------------------------------------------------------------------------------------------
# helpers


def gcz(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(GCZ), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"gcz {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def read_safetensors(path: Path) -> dict:
    """{name: (dtype, shape, bytes)} of a safetensors file (the format is 8 + JSON + data)."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], list(t["shape"]), data[base + a:base + b])
    return out


def write_safetensors(path: Path, tensors: dict) -> None:
    """tensors: {name: (ST dtype, shape, uint array of bits)}."""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, bits) in tensors.items():
        b = np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def encode(tmp: Path, src: Path, spec: str, tag: str) -> Path:
    out = tmp / f"{tag}_{spec.replace(':', '_').replace('=', '')}.gcz"
    gcz("encode", str(src), "-o", str(out), "-c", spec, "-q")
    return out


def fmt_masks(dtype: str):
    f = gczread.FMTS[dtype]
    exp = ((1 << f.exp_bits) - 1) << f.frac_bits
    frac = (1 << f.frac_bits) - 1
    return f, exp, frac


def is_nan_bits(u: np.ndarray, dtype: str) -> np.ndarray:
    _, exp, frac = fmt_masks(dtype)
    t = UINT[dtype]
    return ((u & t(exp)) == t(exp)) & ((u & t(frac)) != 0)


def special_bits(dtype: str, n_random: int = 4000, seed: int = 7) -> np.ndarray:
    """Zeros, subnormals, normal extremes, Inf, quiet/signalling NaNs with payloads and signs,
    and random bit patterns (which hit every exponent, including subnormals and NaNs)."""
    f, exp, frac = fmt_masks(dtype)
    sign = 1 << (f.bits - 1)
    quiet = 1 << (f.frac_bits - 1)
    vals = [0, sign, 1, sign | 1, frac, sign | frac, 1 << f.frac_bits, exp - 1, sign | (exp - 1),
            exp, sign | exp, exp | quiet, sign | exp | quiet, exp | 1, sign | exp | 1,
            exp | (quiet - 1), exp | frac, sign | exp | frac, exp | quiet | 5]
    rng = np.random.default_rng(seed)
    rnd = rng.integers(0, 1 << min(f.bits, 63), size=n_random, dtype=np.uint64)
    if f.bits == 64:
        rnd |= rng.integers(0, 2, size=n_random, dtype=np.uint64) << np.uint64(63)
    return np.concatenate([np.array(vals, dtype=np.uint64), rnd]).astype(UINT[dtype])


def check_against_cpp(path: Path, tmp: Path) -> dict:
    """Decode `path` with gcz and gczread; assert the same names, shapes, dtypes and bits, and that
    gczread's index view matches `gcz info --json`. Returns {name: gczread bits}."""
    out_st = tmp / (path.stem + ".decoded.safetensors")
    gcz("decode", str(path), "-o", str(out_st))
    cpp = read_safetensors(out_st)
    info = json.loads(gcz("info", str(path), "--json").stdout)
    mine = {}
    with GczFile(path) as f:
        assert f.tensors == [t["name"] for t in info["tensors"]]
        assert sorted(f.tensors) == sorted(cpp)
        assert f.producer == info["producer"]
        assert f.file_size == path.stat().st_size == info["file_size"]
        for t in info["tensors"]:
            name = t["name"]
            ti = f.info(name)
            assert ti.dtype == t["dtype"]
            assert list(ti.shape) == t["shape"]
            assert [dict(s) for s in ti.codec] == t["codec"]
            assert ti.seed == t["seed"] and ti.rng == t["rng"]
            assert [vars(s) for s in ti.streams] == t["streams"]

            bits = f.read_bits(name)
            st_dtype, st_shape, st_bytes = cpp[name]
            assert st_dtype == ST_DTYPE[ti.dtype]
            assert st_shape == list(ti.shape) == list(bits.shape)
            assert bits.dtype == UINT[ti.dtype]
            assert bits.astype(bits.dtype.newbyteorder("<")).tobytes() == st_bytes, \
                f"{path.name}: tensor {name!r} decodes to different bits than gcz decode"

            arr = f.read(name)
            if ti.dtype == "bfloat16":
                assert arr.dtype == np.uint16 and np.array_equal(arr, bits)
                wide = f.read(name, widen=True)
                assert wide.dtype == np.float32 and wide.shape == bits.shape
                ok = ~is_nan_bits(bits, "bfloat16")
                assert np.array_equal(wide.view(np.uint32)[ok], bits.astype(np.uint32)[ok] << 16)
                assert np.isnan(wide[~ok]).all()
            else:
                assert arr.dtype == np.dtype(ti.dtype) and arr.shape == bits.shape
                assert np.array_equal(arr.view(bits.dtype), bits)
            mine[name] = bits
        summary = f.verify()
        assert summary["tensors"] == len(info["tensors"])
    return mine


def assert_lossless(decoded: np.ndarray, original: np.ndarray, dtype: str, same_format: bool):
    """Lossless per CODECS.md: identical bits, except that a NaN converted through another format
    is a NaN of the same sign with the quiet bit set (the NaN rule of 'Element conversions')."""
    original = original.reshape(decoded.shape)
    if same_format:
        assert np.array_equal(decoded, original)
        return
    f = gczread.FMTS[dtype]
    nan = is_nan_bits(original, dtype)
    assert np.array_equal(decoded[~nan], original[~nan])
    assert is_nan_bits(decoded[nan], dtype).all()
    t = UINT[dtype]
    sign, quiet = t(1 << (f.bits - 1)), t(1 << (f.frac_bits - 1))
    assert np.array_equal(decoded[nan] & sign, original[nan] & sign)
    assert ((decoded[nan] & quiet) != 0).all()


# ------------------------------------------------------------------------------------------------
# 1. the sample gradients, every codec spec


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sample", SAMPLE_INPUTS)
def test_samples_match_cpp_decoder(tmp_path, sample, spec):
    src = SAMPLES / sample
    if not src.is_file():
        pytest.skip(f"sample input {src} is missing")
    path = encode(tmp_path, src, spec, Path(sample).stem)
    mine = check_against_cpp(path, tmp_path)

    original = read_safetensors(src)
    element = spec.split("+")[0]
    for name, bits in mine.items():
        st_dtype, shape, raw = original[name]
        dtype = {v: k for k, v in ST_DTYPE.items()}[st_dtype]
        assert list(bits.shape) == shape
        if dtype in LOSSLESS[element]:
            assert_lossless(bits, np.frombuffer(raw, dtype=np.dtype(UINT[dtype]).newbyteorder("<")),
                            dtype, same_format=True)


# ------------------------------------------------------------------------------------------------
# 2. special values: NaN (quiet, signalling, payloads, signs), Inf, subnormals, 0-d, empty tensors


def make_special_input(tmp: Path, dtype: str) -> tuple[Path, dict]:
    """An input holding special values of `dtype`; returns (path, {name: original bits})."""
    bits = special_bits(dtype)
    rng = np.random.default_rng(11)
    tensors = {
        "special": bits,
        "cube": bits[: 7 * 5 * 3].reshape(7, 5, 3),
        "scalar": bits[3:4].reshape(()),
        "empty": bits[:0].reshape(0, 3),
        "empty1d": bits[:0],
    }
    if dtype == "float64":
        # Float16 and float32 rounding midpoints, exactly and nudged by far less than a float32
        # ulp: rounding via float32 (double rounding) would get about half of them wrong.
        mids = []
        for ftype, utype, top in ((np.float16, np.uint16, 0x7BFF), (np.float32, np.uint32,
                                                                     0x7F7FFFFF)):
            lo = np.unique(rng.integers(1, top, size=600).astype(utype))
            a = lo.view(ftype).astype(np.float64)
            b = (lo + utype(1)).view(ftype).astype(np.float64)
            mid, tiny = (a + b) / 2, (b - a) * 2.0 ** -32
            mids += [mid, mid + tiny, mid - tiny, -(mid + tiny)]
        x = np.concatenate(mids + [rng.standard_normal(500) * 1e-5, [1e300, -1e-300, 65520.0]])
        tensors["midpoints"] = x.view(np.uint64)
    if dtype == "bfloat16":  # numpy cannot write bfloat16 .npy: use safetensors
        path = tmp / "special_bf16.safetensors"
        write_safetensors(path, {k: ("BF16", v.shape, v) for k, v in tensors.items()})
    else:
        path = tmp / f"special_{dtype}"
        path.mkdir()
        for k, v in tensors.items():
            np.save(path / f"{k}.npy", v.view(np.dtype(dtype)))
    return path, tensors


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", ["float16", "float64", "float32", "bfloat16"])
def test_special_values_match_cpp_decoder(tmp_path, dtype, spec):
    src, originals = make_special_input(tmp_path, dtype)
    path = encode(tmp_path, src, spec, "special_" + dtype)
    mine = check_against_cpp(path, tmp_path)
    assert sorted(mine) == sorted(originals)

    element = spec.split("+")[0]
    stored = gczread.CAST_CODECS[element] or dtype
    for name, bits in mine.items():
        assert bits.shape == originals[name].shape
        if dtype in LOSSLESS[element]:
            assert_lossless(bits, originals[name], dtype, same_format=(stored == dtype))
    if dtype == "float64" and element in ("fp16", "fp32"):
        # CODECS.md: one rounding from the float64 value (numpy's astype rounds directly, RNE).
        x = originals["midpoints"].view(np.float64)
        with np.errstate(over="ignore"):
            ref = x.astype(np.float16 if element == "fp16" else np.float32).astype(np.float64)
        assert np.array_equal(mine["midpoints"].view(np.float64), ref)


def test_conversion_rules_examples():
    """A few hand-checked conversions of CODECS.md, independent of the C++ tool."""
    cb = gczread.convert_bits
    u16, u32 = np.uint16, np.uint32
    # float32 -> bfloat16, round to nearest even; overflow to Inf; NaN keeps sign, gets quiet bit
    f = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xFF800001, 0x7F800000,
                  0x00000001, 0x80000000], dtype=u32)
    assert cb(f, "float32", "bfloat16").tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFFC0,
                                                    0x7F80, 0x0000, 0x8000]
    # float32 -> float16: ties to even, overflow, subnormal results, signalling NaN quietened
    f = np.array([0x3F801000, 0x3F803000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001,
                  0xB3000000, 0x7F800001, 0x7FFFFFFF], dtype=u32)
    assert cb(f, "float32", "float16").tolist() == [0x3C00, 0x3C02, 0x7C00, 0x7BFF, 0x0000,
                                                   0x0001, 0x8000, 0x7E00, 0x7FFF]
    # float16 -> float32 / float64: exact, subnormals included; NaN payload moved up, quietened
    h = np.array([0x0001, 0x83FF, 0x7C00, 0x7C01, 0xFE00], dtype=u16)
    assert cb(h, "float16", "float32").tolist() == [0x33800000, 0xB87FC000, 0x7F800000,
                                                   0x7FC02000, 0xFFC00000]
    assert cb(h, "float16", "float64").view(np.float64)[:3].tolist() == [2.0 ** -24,
                                                                        -(1023 / 1024) * 2.0 ** -14,
                                                                        np.inf]
    assert cb(h, "float16", "float64")[3] == 0x7FF8040000000000
    # bfloat16 -> float16: one rounding (bf16 1+2^-7 is exact in f16; 2^-25 ties to 0, even)
    b = np.array([0x3F81, 0x3300, 0x3301, 0x4780], dtype=u16)
    assert cb(b, "bfloat16", "float16").tolist() == [0x3C08, 0x0000, 0x0001, 0x7C00]
    # float16 -> bfloat16: 1 + 2^-8 + 2^-10 rounds up; 1 + 2^-8 is a tie, goes to even
    h = np.array([0x3C05, 0x3C04, 0x3C0C], dtype=u16)
    assert cb(h, "float16", "bfloat16").tolist() == [0x3F81, 0x3F80, 0x3F82]


def test_float64_narrowing_is_one_rounding():
    """convert_bits from float64 (PowerSGD's float64 sums): one round-to-nearest-even step to
    float16 / bfloat16 / float32, checked against exact rational arithmetic; NaN rule kept."""
    from fractions import Fraction
    rng = np.random.default_rng(3)
    cases = {"float16": (np.float16, np.uint16, 0x7BFF), "bfloat16": (None, np.uint16, 0x7F7F),
             "float32": (np.float32, np.uint32, 0x7F7FFFFF)}
    for dst, (ftype, utype, top) in cases.items():
        f = gczread.FMTS[dst]
        lo = np.unique(rng.integers(1, top, size=300).astype(utype))
        wide = lambda b: gczread.convert_bits(b, dst, "float64").view(np.float64)  # noqa: E731
        a, b = wide(lo), wide(lo + utype(1))
        mid, tiny = (a + b) / 2, (b - a) * 2.0 ** -40
        x = np.concatenate([mid, mid + tiny, mid - tiny, -mid, a, [0.0, -0.0, 1e300, -1e300,
                                                                   5e-324, -2.0 ** -1000]])
        got = gczread.convert_bits(x.view(np.uint64), "float64", dst)
        emin = 2 - (1 << (f.exp_bits - 1))
        for xi, gi in zip(x.tolist(), got.tolist()):
            q = max(math.frexp(xi)[1] - 1, emin) - f.frac_bits
            r = round(Fraction(xi) / Fraction(2) ** q) * Fraction(2) ** q  # ties to even
            want = math.copysign(float(abs(r)) if abs(r) < 2 ** (1 << (f.exp_bits - 1))
                                 else math.inf, xi)
            w = gczread.convert_bits(np.array([want]).view(np.uint64), "float64", dst)[0]
            assert gi == w and np.array_equal(wide(np.array([gi], utype)), [want]), (dst, xi)
        if ftype is not None:  # numpy's direct conversion agrees
            with np.errstate(over="ignore"):
                assert np.array_equal(got, x.astype(ftype).view(utype))
    nan = np.array([0x7FF0000000000001, 0xFFF8000000000000 | (0x2AB << 42)], np.uint64)
    assert gczread.convert_bits(nan, "float64", "float16").tolist() == [0x7E00, 0xFE00 | 0x2AB]
    assert gczread.convert_bits(nan, "float64", "bfloat16").tolist() == [0x7FC0, 0xFFC0 | 0x55]


# ------------------------------------------------------------------------------------------------
# 3. rejection of corrupted files


def _trailer(data: bytes):
    return struct.unpack_from("<QQQ", data, len(data) - 32)


def _with_index(data: bytes, index: bytes) -> bytes:
    """Replace the index (fixing up the trailer, checksum included)."""
    off, length, _ = _trailer(data)
    tr = struct.pack("<QQQ", off, len(index), xxhash.xxh3_64_intdigest(index)) + b"\x89GCZEND\n"
    return data[:off] + index + tr


def _edit_index(fn):
    def apply(data: bytes) -> bytes:
        off, length, _ = _trailer(data)
        j = json.loads(data[off:off + length])
        fn(j)
        return _with_index(data, json.dumps(j, separators=(",", ":")).encode())
    return apply


def _raw_index(fn):
    def apply(data: bytes) -> bytes:
        off, length, _ = _trailer(data)
        return _with_index(data, fn(data[off:off + length]))
    return apply


def _relayout(fn, pad: int = 0):
    """Rebuild the data section after fn(index, {(tensor, stream): stored bytes}) edited it;
    offsets, lengths and checksums are recomputed so that only the intended fault remains."""
    def apply(data: bytes) -> bytes:
        off, length, _ = _trailer(data)
        j = json.loads(data[off:off + length])
        blobs = {(ti, si): data[s["offset"]:s["offset"] + s["length"]]
                 for ti, t in enumerate(j["tensors"]) for si, s in enumerate(t["streams"])}
        fn(j, blobs)
        out = bytearray(data[:64])
        for ti, t in enumerate(j["tensors"]):
            for si, s in enumerate(t["streams"]):
                out += bytes([pad]) * (-len(out) % 64)
                b = blobs[(ti, si)]
                s["offset"], s["length"] = len(out), len(b)
                s["xxh3"] = "%016x" % xxhash.xxh3_64_intdigest(b)
                out += b
        out += b"\0" * (-len(out) % 64)
        idx = json.dumps(j, separators=(",", ":")).encode()
        return (bytes(out) + idx + struct.pack("<QQQ", len(out), len(idx), xxhash.xxh3_64_intdigest(
            idx)) + b"\x89GCZEND\n")
    return apply


def _flip(pos_fn, mask: int = 0x01):
    def apply(data: bytes) -> bytes:
        b = bytearray(data)
        b[pos_fn(data)] ^= mask
        return bytes(b)
    return apply


def _set(pos: int, fmt: str, value_fn):
    def apply(data: bytes) -> bytes:
        b = bytearray(data)
        p = pos if pos >= 0 else len(b) + pos
        struct.pack_into(fmt, b, p, value_fn(struct.unpack_from(fmt, b, p)[0]))
        return bytes(b)
    return apply


def _zstd_stream_index(data: bytes) -> int:
    off, length, _ = _trailer(data)
    j = json.loads(data[off:off + length])
    return next(i for i, t in enumerate(j["tensors"]) if t["streams"][0]["encoding"] == "zstd")


def _stream_byte(encoding: str):
    def pos(data: bytes) -> int:
        off, length, _ = _trailer(data)
        j = json.loads(data[off:off + length])
        s = next(t["streams"][0] for t in j["tensors"]
                 if t["streams"][0]["encoding"] == encoding and t["streams"][0]["length"] > 0)
        return s["offset"] + s["length"] // 2
    return pos


def _zstd_edit(fn):
    def edit(j, blobs):
        ti = next(i for i, t in enumerate(j["tensors"]) if t["streams"][0]["encoding"] == "zstd")
        blobs[(ti, 0)] = fn(blobs[(ti, 0)], j["tensors"][ti])
    return _relayout(edit)


def _unzstd(b: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(b)


T0 = lambda j: j["tensors"][0]  # noqa: E731

# (id, corruption, expected rule, when: "open" | "read" | "verify")
CORRUPTIONS = [
    ("truncate-to-95", lambda d: d[:95], "too-small", "open"),
    ("truncate-last-byte", lambda d: d[:-1], "bad-end-magic", "open"),
    ("truncate-half", lambda d: d[: len(d) // 2], "bad-end-magic", "open"),
    ("magic-byte", _flip(lambda d: 1), "bad-magic", "open"),
    ("magic-first-byte", _flip(lambda d: 0, 0x80), "bad-magic", "open"),
    ("version-major-2", _set(8, "<H", lambda v: 2), "bad-version", "open"),
    ("version-major-0", _set(8, "<H", lambda v: 0), "bad-version", "open"),
    ("flags", _set(12, "<I", lambda v: 1), "reserved-nonzero", "open"),
    ("reserved", _flip(lambda d: 40), "reserved-nonzero", "open"),
    ("reserved-first-byte", _flip(lambda d: 16, 1), "reserved-nonzero", "open"),
    ("end-magic", _flip(lambda d: len(d) - 3), "bad-end-magic", "open"),
    ("index-length-0", _set(-24, "<Q", lambda v: 0), "index-too-large", "open"),
    ("index-length-huge", _set(-24, "<Q", lambda v: 1 << 40), "index-too-large", "open"),
    ("index-offset+1", _set(-32, "<Q", lambda v: v + 1), "index-out-of-range", "open"),
    ("index-offset+64", _set(-32, "<Q", lambda v: v + 64), "index-out-of-range", "open"),
    ("index-offset-0", _set(-32, "<Q", lambda v: 0), "index-out-of-range", "open"),
    ("index-length+1", _set(-24, "<Q", lambda v: v + 1), "index-out-of-range", "open"),
    ("index-checksum-field", _flip(lambda d: len(d) - 16), "index-checksum", "open"),
    ("index-byte", _flip(lambda d: _trailer(d)[0] + 20), "index-checksum", "open"),
    ("index-not-json", _raw_index(lambda b: b[:-1]), "index-json", "open"),
    ("index-bad-utf8", _raw_index(lambda b: b.replace(b'"gcz"', b'"g\xffz"', 1)), "index-json",
     "open"),
    ("index-array", _raw_index(lambda b: b"[" + b + b"]"), "index-json", "open"),
    ("index-nan", _raw_index(lambda b: b.replace(b'"seed":0', b'"seed":NaN', 1)), "index-json",
     "open"),
    ("format-wrong", _edit_index(lambda j: j.update(format="gcx")), "index-schema", "open"),
    ("version-mismatch", _edit_index(lambda j: j.update(version=2)), "index-schema", "open"),
    ("no-tensors-key", _edit_index(lambda j: j.pop("tensors")), "index-schema", "open"),
    ("no-producer", _edit_index(lambda j: j.pop("producer")), "index-schema", "open"),
    ("metadata-not-strings", _edit_index(lambda j: j.update(metadata={"a": 1})), "index-schema",
     "open"),
    ("seed-float", _raw_index(lambda b: b.replace(b'"seed":0', b'"seed":0.0', 1)), "index-schema",
     "open"),
    ("seed-2^64", _edit_index(lambda j: T0(j).update(seed=1 << 64)), "index-schema", "open"),
    ("shape-negative", _edit_index(lambda j: T0(j).update(shape=[-1])), "index-schema", "open"),
    ("codec-empty", _edit_index(lambda j: T0(j).update(codec=[])), "index-schema", "open"),
    ("xxh3-uppercase", _edit_index(lambda j: T0(j)["streams"][0].update(
        xxh3="ABCDEF0123456789")), "index-schema", "open"),
    ("duplicate-name", _edit_index(lambda j: j["tensors"][1].update(name=T0(j)["name"])),
     "duplicate-name", "open"),
    ("empty-name", _edit_index(lambda j: T0(j).update(name="")), "duplicate-name", "open"),
    ("long-name", _edit_index(lambda j: T0(j).update(name="n" * 4097)), "duplicate-name", "open"),
    ("dtype-int8", _edit_index(lambda j: T0(j).update(dtype="int8")), "bad-dtype", "open"),
    ("shape-33-dims", _edit_index(lambda j: T0(j).update(shape=[1] * 33)), "bad-shape", "open"),
    ("shape-2^48+", _edit_index(lambda j: T0(j).update(shape=[1 << 24, (1 << 24) + 1])),
     "bad-shape", "open"),
    ("codec-unknown", _edit_index(lambda j: T0(j)["codec"][0].update(name="qsgd9")),
     "unknown-codec", "open"),
    ("codec-params", _edit_index(lambda j: T0(j)["codec"][0].update(params={"k": 1})),
     "unknown-codec", "open"),
    ("zstd-first", _edit_index(lambda j: T0(j)["codec"].reverse()), "unknown-codec", "open"),
    ("stage-unknown", _edit_index(lambda j: T0(j)["codec"][1].update(name="lz4")),
     "unknown-codec", "open"),
    ("stream-renamed", _edit_index(lambda j: T0(j)["streams"][0].update(name="vals")),
     "bad-streams", "open"),
    ("stream-missing", _edit_index(lambda j: T0(j).update(streams=[])), "bad-streams", "open"),
    ("encoding-unknown", _edit_index(lambda j: T0(j)["streams"][0].update(encoding="lz4")),
     "bad-encoding", "open"),
    ("stream-offset", _edit_index(lambda j: j["tensors"][1]["streams"][0].update(
        offset=j["tensors"][1]["streams"][0]["offset"] + 64)), "stream-out-of-range", "open"),
    ("stream-past-index", _edit_index(lambda j: _grow_last(j, 10 ** 6)), "stream-out-of-range",
     "open"),
    ("unindexed-bytes", _edit_index(lambda j: j["tensors"].pop()), "stream-out-of-range", "open"),
    ("stream-size", _edit_index(lambda j: T0(j)["streams"][0].update(
        size=T0(j)["streams"][0]["size"] + 2)), "stream-size", "open"),
    ("zstd-size-ratio", _edit_index(lambda j: j["tensors"][_zstd_idx(j)].update(
        shape=[65536 * j["tensors"][_zstd_idx(j)]["streams"][0]["length"] + 2]) or
        j["tensors"][_zstd_idx(j)]["streams"][0].update(
        size=2 * (65536 * j["tensors"][_zstd_idx(j)]["streams"][0]["length"] + 2))),
     "stream-size", "open"),
    ("raw-stream-byte", _flip(_stream_byte("raw")), "stream-checksum", "read"),
    ("zstd-stream-byte", _flip(_stream_byte("zstd")), "stream-checksum", "read"),
    ("stream-xxh3-field", _edit_index(lambda j: T0(j)["streams"][0].update(xxh3="0" * 16)),
     "stream-checksum", "read"),
    ("stream-xxh3-15-digits", _edit_index(lambda j: T0(j)["streams"][0].update(xxh3="0" * 15)),
     "index-schema", "open"),
    ("stream-xxh3-letter-g", _edit_index(lambda j: T0(j)["streams"][0].update(xxh3="0" * 15 + "g")),
     "index-schema", "open"),
    ("zstd-trailing-bytes", _zstd_edit(lambda b, t: b + b"\0\0\0"), "zstd-frame", "read"),
    ("zstd-two-frames", _zstd_edit(lambda b, t: b + zstandard.ZstdCompressor().compress(b"")),
     "zstd-frame", "read"),
    ("zstd-truncated", _zstd_edit(lambda b, t: b[:-5]), "zstd-frame", "read"),
    ("zstd-short-content", _zstd_edit(lambda b, t: zstandard.ZstdCompressor(
        write_content_size=False).compress(_unzstd(b)[:-2])), "zstd-frame", "read"),
    ("zstd-long-content", _zstd_edit(lambda b, t: zstandard.ZstdCompressor(
        write_content_size=False).compress(_unzstd(b) + b"xy")), "zstd-frame", "read"),
    ("zstd-declared-size", _zstd_edit(lambda b, t: zstandard.ZstdCompressor(
        write_content_size=True).compress(_unzstd(b)[:-2])), "zstd-frame", "read"),
    ("zstd-skippable-frame", _zstd_edit(lambda b, t: bytes.fromhex("505e2a18") + struct.pack(
        "<I", 2) + b"ab" + b), "zstd-frame", "read"),
    ("zstd-not-a-frame", _zstd_edit(lambda b, t: b"\0" * len(b)), "zstd-frame", "read"),
    ("nonzero-padding", _relayout(lambda j, b: None, pad=0x5A), "nonzero-padding", "verify"),
]


def _grow_last(j, extra: int) -> None:
    """Make the last tensor's (raw) stream consistent but `extra` bytes longer than the file."""
    t = j["tensors"][-1]
    s = t["streams"][0]
    n = (s["length"] + extra) // 2
    t.update(shape=[n], codec=[{"name": "fp16", "params": {}}])
    s.update(encoding="raw", length=2 * n, size=2 * n)


def _zstd_idx(j) -> int:
    return next(i for i, t in enumerate(j["tensors"]) if t["streams"][0]["encoding"] == "zstd")


@pytest.fixture(scope="module")
def victim(tmp_path_factory) -> bytes:
    """fp16+zstd of the step-0 gradients: has both zstd and raw streams, and padding."""
    tmp = tmp_path_factory.mktemp("victim")
    path = encode(tmp, SAMPLES / "step_0000.safetensors", "fp16+zstd", "victim")
    data = path.read_bytes()
    off, length, _ = _trailer(data)
    encs = {t["streams"][0]["encoding"] for t in json.loads(data[off:off + length])["tensors"]}
    assert encs == {"raw", "zstd"}, encs
    return data


@pytest.mark.parametrize("case,corrupt,rule,when", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_rejects_corruption(tmp_path, victim, case, corrupt, rule, when):
    path = tmp_path / f"{case}.gcz"
    path.write_bytes(corrupt(victim))

    def everything():
        with GczFile(path) as f:
            if when == "verify":
                for name in f.tensors:  # decoding alone does not look at padding
                    f.read(name)
                f.verify()
            else:
                for name in f.tensors:
                    f.read(name)

    if when != "open":
        with GczFile(path) as f:  # the structure is fine: opening succeeds
            assert f.tensors
    with pytest.raises(GczFormatError) as ei:
        everything()
    assert ei.value.rule == rule
    assert str(ei.value).startswith(rule + ":"), str(ei.value)

    # The C++ tool names the same rule.
    r = gcz("verify", str(path), check=False)
    assert r.returncode != 0
    assert f"{rule}:" in r.stderr, r.stderr


def test_accepts_minor_versions_and_unknown_keys(tmp_path, victim):
    data = _set(10, "<H", lambda v: 7)(victim)  # version_minor 7
    data = _edit_index(lambda j: (j.update(future_key={"x": [1, 2.5]}),
                                  T0(j).update(future_tensor_key=1),
                                  T0(j)["streams"][0].update(future_stream_key="y"),
                                  T0(j).pop("metrics", None)))(data)
    path = tmp_path / "minor.gcz"
    path.write_bytes(data)
    with GczFile(path) as f:
        assert f.version == (1, 7)
        f.verify()
    gcz("verify", str(path))


def test_an_index_of_exactly_64_mib_is_read_and_one_byte_more_is_not(tmp_path, victim):
    """FORMAT.md caps the index at 64 MiB: both readers take an index of exactly that (padded under
    an unknown key) and name index-too-large for one a byte longer."""
    off, length, _ = _trailer(victim)
    key = b'"pad":"",'
    for extra, rule in ((0, None), (1, "index-too-large")):
        pad = (64 << 20) - length - len(key) + extra
        data = _raw_index(lambda b: b.replace(b"{", b'{"pad":"' + b"x" * pad + b'",', 1))(victim)
        assert _trailer(data)[1] == (64 << 20) + extra
        path = tmp_path / f"index-{extra}.gcz"
        path.write_bytes(data)
        r = gcz("verify", str(path), check=False)
        if rule is None:
            with GczFile(path) as f:
                f.verify()
            assert r.returncode == 0, r.stderr
        else:
            with pytest.raises(GczFormatError) as ei:
                with GczFile(path):
                    pass
            assert ei.value.rule == rule
            assert r.returncode != 0 and f"{rule}:" in r.stderr, r.stderr


def test_a_96_byte_file_with_an_empty_index_is_index_too_large_in_both_readers(tmp_path):
    """The smallest file size a .gcz may have, with index_length 0: not too small, but no index."""
    path = tmp_path / "empty-index.gcz"
    path.write_bytes(b"\x89GCZ\r\n\x1a\n" + struct.pack("<HHI", 1, 0, 0) + bytes(48) +
                     struct.pack("<QQQ", 64, 0, 0) + b"\x89GCZEND\n")
    assert path.stat().st_size == 96
    with pytest.raises(GczFormatError) as ei:
        with GczFile(path):
            pass
    assert ei.value.rule == "index-too-large", str(ei.value)
    r = gcz("verify", str(path), check=False)
    assert r.returncode != 0 and "index-too-large:" in r.stderr, r.stderr


def test_a_single_byte_of_padding_is_checked_by_both_readers(tmp_path):
    """Top-K of the 62 largest of 1000 elements, at indices 0..61: the encoding's byte and 62
    one-byte varints, so one byte of padding follows the indices stream. Set, it is
    nonzero-padding to both readers' verify."""
    x = np.linspace(0.1, 0.2, 1000, dtype=np.float32)
    x[:62] = np.arange(100, 162, dtype=np.float32)
    np.save(tmp_path / "t.npy", x)
    gcz("encode", str(tmp_path / "t.npy"), "-o", str(tmp_path / "t.gcz"), "-c", "topk:k=62", "-q")
    data = bytearray((tmp_path / "t.gcz").read_bytes())
    off, length, _ = _trailer(bytes(data))
    streams = json.loads(data[off:off + length])["tensors"][0]["streams"]
    indices = [st for st in streams if st["name"] == "indices"][0]
    assert indices["length"] == 63 and indices["encoding"] == "raw", indices
    pad = indices["offset"] + 63
    assert data[pad] == 0 and (pad + 1) % 64 == 0
    data[pad] = 1
    (tmp_path / "p.gcz").write_bytes(bytes(data))
    with pytest.raises(GczFormatError) as ei:
        with GczFile(tmp_path / "p.gcz") as f:
            f.verify()
    assert ei.value.rule == "nonzero-padding", str(ei.value)
    r = gcz("verify", str(tmp_path / "p.gcz"), check=False)
    assert r.returncode != 0 and "nonzero-padding:" in r.stderr, r.stderr


def test_thirty_two_dimensions_round_trip_through_both_readers(tmp_path):
    """32 dimensions, the most a .gcz holds: gcz writes and decodes them, the numpy reader reads them."""
    x = np.arange(6, dtype=np.float32).reshape((1,) * 30 + (2, 3))
    np.save(tmp_path / "r32.npy", x)
    gcz("encode", str(tmp_path / "r32.npy"), "-o", str(tmp_path / "r32.gcz"), "-c", "none", "-q")
    gcz("decode", str(tmp_path / "r32.gcz"), "-o", str(tmp_path / "back.npy"))
    back = np.load(tmp_path / "back.npy")
    assert back.shape == x.shape and np.array_equal(back, x)
    with GczFile(tmp_path / "r32.gcz") as f:
        got = f.read("r32")
    assert got.shape == x.shape and np.array_equal(got, x)


def test_zstd_stage_edge_cases_rejected_by_both_readers(tmp_path, victim):
    """A zstd stage with no level or a level outside 1..22, and an empty zstd stream (not 'exactly
    one zstd frame'): the spec forbids them, and gczread and gcz both reject them naming the rule."""
    cases = {
        "zstd-no-level": _edit_index(lambda j: T0(j)["codec"][1].update(params={})),
        "zstd-level-23": _edit_index(lambda j: T0(j)["codec"][1].update(params={"level": 23})),
        "zstd-empty": _zstd_edit(lambda b, t: t.update(shape=[0]) or t["streams"][0].update(
            size=0) or b""),
    }
    rules = {"zstd-no-level": "unknown-codec", "zstd-level-23": "unknown-codec",
             "zstd-empty": "zstd-frame"}
    for case, corrupt in cases.items():
        path = tmp_path / f"{case}.gcz"
        path.write_bytes(corrupt(victim))
        with pytest.raises(GczFormatError) as ei:
            with GczFile(path) as f:
                f.verify()
        assert ei.value.rule == rules[case]
        r = subprocess.run([str(GCZ), "verify", str(path)], capture_output=True, text=True)
        assert r.returncode != 0 and f"{rules[case]}:" in r.stderr, (case, r.stderr)


CORRUPT = REPO / "tests" / "corrupt" / "gcz"


@pytest.mark.parametrize("path", sorted(CORRUPT.glob("*.gcz")), ids=lambda p: p.name)
def test_corrupt_corpus(path):
    """Every file of the corrupt corpus is rejected with the rule its name gives; valid*.gcz verify."""
    if path.name.startswith("valid"):
        with GczFile(path) as f:
            f.verify()
        return
    with pytest.raises(GczFormatError) as ei:
        with GczFile(path) as f:
            f.verify()
    assert path.stem.startswith(ei.value.rule), (path.name, ei.value.rule, str(ei.value))


def test_missing_zstandard_is_a_clear_error(monkeypatch, victim, tmp_path):
    path = tmp_path / "v.gcz"
    path.write_bytes(victim)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    with GczFile(path) as f:
        zname = next(n for n in f.tensors if f.info(n).streams[0].encoding == "zstd")
        rname = next(n for n in f.tensors if f.info(n).streams[0].encoding == "raw")
        f.read(rname)  # raw streams do not need it
        with pytest.raises(ImportError, match="pip install zstandard"):
            f.read(zname)


def test_command_line_lists_tensors(tmp_path, victim):
    path = tmp_path / "v.gcz"
    path.write_bytes(victim)
    r = subprocess.run([sys.executable, str(REPO / "samples" / "python" / "gczread.py"), str(path),
                        "--verify"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("embed.weight", "head.bias", "blocks.1.mlp.fc2.weight"):
        assert name in r.stdout
    assert "verify: ok" in r.stdout
    bad = tmp_path / "bad.gcz"
    bad.write_bytes(victim[:-1])
    r = subprocess.run([sys.executable, str(REPO / "samples" / "python" / "gczread.py"), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "bad-end-magic" in r.stderr


# ------------------------------------------------------------------------------------------------
# 4. the other codecs: qsgd, terngrad, topk, randomk, powersgd, and value codecs inside them
#    (docs/codecs/*.md): gczread must decode every tensor to the same bits as `gcz decode`

CODEC_SPECS = [
    "qsgd",
    "qsgd:bits=4,group=64,scale=l2,rounding=nearest,scale_dtype=bf16",
    "qsgd:bits=2,group=7,scale_dtype=fp16",
    "qsgd:bits=3,group=5,scale=l2,rounding=nearest+zstd",
    "qsgd:bits=7,group=1000",
    "terngrad",
    "terngrad:scale=group,packing=2bit",
    "terngrad:clip=0,scale=group,group=13,rounding=deterministic",
    "terngrad:clip=1.5+zstd",
    "topk:ratio=0.01",
    "topk:k=100,values=(qsgd:bits=8)",
    "topk:ratio=0.29,values=(fp16)",
    "topk:ratio=1,values=(bf16)+zstd",
    "topk:k=5,values=(terngrad:packing=2bit)",
    "randomk:ratio=0.05,scale=unbiased,values=(fp16)",
    "randomk",
    "randomk:k=7,values=(qsgd:bits=4,group=3)",
    "randomk:ratio=1,scale=unbiased+zstd",
    "powersgd:rank=4",
    "powersgd:rank=2,iters=2,factors=(bf16)",
    "powersgd:rank=1,view=last,factors=(fp16)",
    "powersgd:rank=3,factors=(qsgd:bits=8,group=16)+zstd",
    "powersgd:rank=2,min_rate=1,fallback=(qsgd:bits=4)",
    # value codecs inside value codecs: keys XOR XXH3("values"/"p"/"q") at every level
    "topk:ratio=0.3,values=(randomk:ratio=0.5)",
    "randomk:ratio=0.5,values=(topk:k=3,values=(qsgd:bits=2))",
    "powersgd:rank=2,factors=(randomk:ratio=0.5)",
    "powersgd:rank=2,fallback=(topk:ratio=0.2,values=(fp16))",
]
STOCHASTIC_SPECS = [
    "qsgd:bits=3,group=9",
    "terngrad:scale=group,group=6",
    "randomk:ratio=0.1,values=(qsgd:bits=4)",
    "topk:ratio=0.2,values=(terngrad)",
    "powersgd:rank=2,factors=(qsgd:bits=6)",
]


def encode_seed(tmp: Path, src: Path, spec: str, tag: str, seed: int = 0, *extra: str) -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in spec)
    out = tmp / f"{tag}_{safe}_{seed}.gcz"
    gcz("encode", str(src), "-o", str(out), "-c", spec, "-q", "--seed", str(seed), *extra)
    return out


@pytest.mark.parametrize("spec", CODEC_SPECS)
@pytest.mark.parametrize("sample", SAMPLE_INPUTS)
def test_codecs_samples_match_cpp_decoder(tmp_path, sample, spec):
    src = SAMPLES / sample
    if not src.is_file():
        pytest.skip(f"sample input {src} is missing")
    path = encode_seed(tmp_path, src, spec, Path(sample).stem, seed=7)
    mine = check_against_cpp(path, tmp_path)
    with GczFile(path) as f:
        codecs = {f.info(n).element_codec for n in f.tensors}
    assert spec.split(":")[0].split("+")[0] in codecs  # not everything went to a fallback
    original = read_safetensors(src)
    for name, bits in mine.items():
        assert list(bits.shape) == original[name][1]


@pytest.mark.parametrize("shape, rank", [((301, 997), 3), ((3, 70001), 1)])
def test_powersgd_reconstruction_in_row_blocks_matches_cpp(tmp_path, shape, rank):
    """The reader rebuilds P Q^T a block of rows at a time: rows of 997 elements in blocks of 65 (the
    last one partial) and rows longer than a block (one row at a time) give gcz's bits."""
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "m.npy", x)
    path = encode_seed(tmp_path, tmp_path / "m.npy", f"powersgd:rank={rank}", "m")
    with GczFile(path) as f:
        assert f.info("m").element_codec == "powersgd"
    check_against_cpp(path, tmp_path)


def make_codec_input(tmp: Path, dtype: str) -> Tuple[Path, dict]:
    """Tensors for the quantizers and sparsifiers in `dtype`: sizes that are not multiples of a
    group, of 8 or of 5, matrices PowerSGD takes (also in float16), constants, zeros, special
    values (NaN, Inf, subnormals), a 0-d and empty tensors. Returns (path, {name: bits})."""
    rng = np.random.default_rng({"float16": 1, "bfloat16": 2, "float32": 3, "float64": 4}[dtype])
    u = np.linspace(0, 3, 64)
    lowrank = (np.outer(np.sin(u), np.cos(u[:48])) + 0.3 * np.outer(u, u[:48] ** 2) / 9
               + 0.01 * rng.standard_normal((64, 48)))
    vals = {
        "gauss": rng.standard_normal((37, 29)) * np.exp(rng.uniform(-3, 3, (37, 1))),
        "lowrank": lowrank,
        "wide3d": rng.standard_normal((24, 5, 11)) * 1e-3,
        "const": np.full(41, -0.375),
        "zeros": np.zeros((5, 64)),
        "ties": np.tile([1.0, -1.0, 0.5, 0.0, -0.0, 0.5], 11),
        "scalar": np.array(2.75),
        "empty": np.zeros((0, 3)),
        "empty1d": np.zeros(0),
        "tiny": rng.standard_normal(203) * 2.0 ** -20,
    }
    tensors = {}
    for k, v in vals.items():
        if dtype == "bfloat16":
            tensors[k] = gczread.convert_bits(v.astype(np.float32).view(np.uint32), "float32",
                                              "bfloat16")
        else:
            tensors[k] = v.astype(dtype).view(UINT[dtype])
    spec_bits = special_bits(dtype, n_random=200, seed=5)
    tensors["special"] = spec_bits[:211]                            # NaN, Inf, subnormals, ...
    if dtype == "float64":
        tensors["beyond_f32"] = np.array([1e300, -1e39, 3.0, -2.0, 1e-300, 0.5] * 7).view(np.uint64)
    if dtype == "bfloat16":
        path = tmp / "codec_bf16.safetensors"
        write_safetensors(path, {k: ("BF16", v.shape, v) for k, v in tensors.items()})
    else:
        path = tmp / f"codec_{dtype}"
        path.mkdir()
        for k, v in tensors.items():
            np.save(path / f"{k}.npy", v.view(np.dtype(dtype)))
    return path, tensors


@pytest.fixture(scope="module")
def codec_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("codec_inputs")
    return {dt: make_codec_input(tmp, dt) for dt in ("float16", "bfloat16", "float32", "float64")}


@pytest.mark.parametrize("spec", CODEC_SPECS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_codecs_all_dtypes_and_shapes_match_cpp_decoder(tmp_path, codec_inputs, dtype, spec):
    src, originals = codec_inputs[dtype]
    path = encode_seed(tmp_path, src, spec, "codec_" + dtype, seed=3)
    mine = check_against_cpp(path, tmp_path)
    assert sorted(mine) == sorted(originals)
    for name, bits in mine.items():
        assert bits.shape == originals[name].shape
    if spec.startswith("powersgd:rank=4"):  # the low-rank matrix goes to PowerSGD in every dtype
        with GczFile(path) as f:
            assert f.info("lowrank").element_codec == "powersgd"


@pytest.mark.parametrize("seed", [1, 0xDEADBEEF, 2 ** 63 + 12345, 2 ** 64 - 1])
@pytest.mark.parametrize("spec", STOCHASTIC_SPECS)
def test_codecs_seeds_match_cpp_decoder(tmp_path, codec_inputs, spec, seed):
    src, _ = codec_inputs["float32"]
    path = encode_seed(tmp_path, src, spec, "seed", seed=seed)
    check_against_cpp(path, tmp_path)
    with GczFile(path) as f:
        assert {f.info(n).seed for n in f.tensors if f.info(n).element_codec != "fp16"} == {seed}


# ------------------------------------------------------------------------------------------------
# 5. Random-K: the indices are drawn again from (seed, tensor name), CODECS.md "Randomness"


def test_philox_known_answers_and_draw_numbering():
    ph = gczread.philox4x32_10
    # CODECS.md's known answer, and the Random123 known answers for all-ones and pi digits
    assert ph(np.zeros((1, 4), np.uint64), (0, 0))[0].tolist() == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert ph(np.full((1, 4), 0xFFFFFFFF, np.uint64), (0xFFFFFFFF, 0xFFFFFFFF))[0].tolist() == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert ph(np.array([[0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]], np.uint64),
              (0xA4093822, 0x299F31D0))[0].tolist() == [0xD16CFE09, 0x94FDCCEB, 0x5001E420,
                                                        0x24126EA1]
    # draw i = word i mod 4 of counter (lo32(i//4), hi32(i//4), purpose, 0), key = seed ^ tkey
    seed, tkey = 0x0123456789ABCDEF, gczread.tensor_key("w")
    k = seed ^ tkey
    for i in (0, 3, 5, 4 * (1 << 32) + 6):
        b = i // 4
        ctr = np.array([[b & 0xFFFFFFFF, b >> 32, 3, 0]], np.uint64)
        want = ph(ctr, (k & 0xFFFFFFFF, k >> 32))[0][i % 4]
        assert gczread.rng_bits(seed, tkey, 3, 1, start=i)[0] == want
        assert gczread.rng_bits(seed, tkey, 3, 7, start=i)[0] == want
    # draw16(i) = 256 * coarse + fine, byte i mod 16 of block i // 16 of sub-streams 0 and 1 (counter
    # word 3); uniform = (draw16 + 0.5) * 2^-16
    for start in (0, 1, 2, 7, 15, 16, 17, 31):
        d = gczread.rng_draw16(seed, tkey, 1, 1000, start)
        want = []
        for i in range(start, start + 1000):
            b = i // 16
            ctr = [np.array([[b & 0xFFFFFFFF, b >> 32, 1, sub]], np.uint64) for sub in (0, 1)]
            words = [ph(c, (k & 0xFFFFFFFF, k >> 32))[0] for c in ctr]
            byte = [int(w[(i % 16) // 4]) >> (8 * (i % 4)) & 0xFF for w in words]
            want.append(256 * byte[0] + byte[1])
        assert d.dtype == np.uint16 and d.tolist() == want
    # the known answers of CODECS.md: seed 0, tensor key 0, purpose 1
    assert gczread.rng_draw16(0, 0, 1, 18).tolist()[0] == 0xE1C1
    assert gczread.rng_draw16(0, 0, 1, 18).tolist()[17] == 0xF680
    u = gczread.rng_uniform(seed, tkey, 1, 1000)
    assert u.dtype == np.float32 and (u > 0).all() and (u < 1).all()
    want = (gczread.rng_draw16(seed, tkey, 1, 1000).astype(np.float64) + 0.5) / 65536
    assert np.array_equal(u.astype(np.float64), want)
    assert gczread.tensor_key("w") == xxhash.xxh3_64_intdigest(b"w")


def test_randomk_selection_rule():
    """randomk.md: the k smallest keys, ties to the lower index, ascending (its numpy form)."""
    seed, tkey, n = 99, gczread.tensor_key("t"), 5000
    keys = gczread.rng_bits(seed, tkey, 3, n)
    for k in (0, 1, 17, 2500, 4999, 5000):
        want = np.sort(np.lexsort((np.arange(n), keys))[:k])
        assert np.array_equal(gczread.randomk_indices(seed, tkey, n, k), want)


def test_smallest_k_breaks_ties_to_the_lower_index():
    """_smallest_k, the O(n) selection randomk_indices uses, against the sort that defines it, on keys
    with many ties at the k-th smallest (a handful of distinct values) and on distinct keys."""
    rng = np.random.default_rng(8)
    for keys in (rng.integers(0, 4, 3001).astype(np.uint32),
                 np.full(100, 7, np.uint32),
                 rng.permutation(2000).astype(np.uint32)):
        n = len(keys)
        for k in (1, 2, n // 4, n // 2 + 1, n - 1, n):
            want = np.sort(np.lexsort((np.arange(n), keys))[:k])
            got = gczread._smallest_k(keys, k)
            assert got.dtype == np.int64 and np.array_equal(got, want), (n, k)


def _read_all(path: Path) -> dict:
    with GczFile(path) as f:
        return {n: f.read(n) for n in f.tensors}


def test_randomk_indices_change_with_seed(tmp_path):
    rng = np.random.default_rng(5)
    src = tmp_path / "dense"
    src.mkdir()
    x = {"w": (rng.uniform(0.5, 1.0, (50, 30)) * rng.choice([-1, 1], (50, 30))).astype(np.float32),
         "b": rng.uniform(1.0, 2.0, 333).astype(np.float32)}  # no zeros: kept = nonzero
    for k, v in x.items():
        np.save(src / f"{k}.npy", v)
    kept = {}
    for seed in (1, 2, 3, 2 ** 64 - 1):
        path = encode_seed(tmp_path, src, "randomk:ratio=0.1", "rk", seed=seed)
        out = check_against_cpp(path, tmp_path)
        for name, v in x.items():
            n = v.size
            idx = gczread.randomk_indices(seed, gczread.tensor_key(name), n, n // 10)
            dec = out[name].view(np.float32).reshape(-1)
            assert np.array_equal(np.flatnonzero(dec), idx)
            assert np.array_equal(dec[idx], v.reshape(-1)[idx])  # fp32 values: exact
            kept[(seed, name)] = tuple(idx)
    for name in x:
        assert len({kept[(s, name)] for s in (1, 2, 3, 2 ** 64 - 1)}) == 4
    assert kept[(1, "w")][:20] != kept[(1, "b")][:20]  # the name is part of the key too

    # The seed is part of the encoding: editing it moves the values; both decoders agree.
    path = encode_seed(tmp_path, src, "randomk:ratio=0.1", "rk", seed=1)
    edited = tmp_path / "reseeded.gcz"
    edited.write_bytes(_edit_index(lambda j: [t.update(seed=2) for t in j["tensors"]])(
        path.read_bytes()))
    out = check_against_cpp(edited, tmp_path)
    assert np.array_equal(np.flatnonzero(out["b"].view(np.float32)),
                          gczread.randomk_indices(2, gczread.tensor_key("b"), 333, 33))


# ------------------------------------------------------------------------------------------------
# 6. hostile streams: rejected with a clear error (rule "bad-stream-data"), never garbage


def _victim(tmp: Path, x: np.ndarray, spec: str) -> bytes:
    d = tmp / f"victim_{len(list(tmp.iterdir()))}"
    d.mkdir()
    np.save(d / "t.npy", x.astype(np.float32))
    return encode_seed(tmp, d, spec, "victim").read_bytes()


def _with_stream(data: bytes, stream: str, new: bytes) -> bytes:
    def edit(j, blobs):
        t = j["tensors"][0]
        si = [s["name"] for s in t["streams"]].index(stream)
        t["streams"][si].update(encoding="raw", size=len(new))
        blobs[(0, si)] = new
    return _relayout(edit)(data)


def _cpp_decode_fails(path: Path, tmp: Path) -> str:
    r = gcz("decode", str(path), "-o", str(tmp / "out.safetensors"), check=False)
    assert r.returncode != 0, f"gcz decode accepted {path.name}"
    return r.stderr


x_varint = np.zeros(1000, np.float32)
x_varint[[5, 100, 700]] = [3, -2, 1]
x_bitmap = np.zeros(13, np.float32)
x_bitmap[[2, 9]] = [1, -1]
# (id, input, replacement indices stream, topk.md rule number); gcz writes 00 06 5f d8 04 (varint,
# deltas 6, 95, 600 for k = 3 of n = 1000) and 01 04 02 (bitmap, k = 2 of n = 13).
HOSTILE_TOPK = [
    ("missing-tag", x_varint, "", 2),
    ("unknown-tag", x_varint, "02 06 5f d8 04", 3),
    ("truncated-varint", x_varint, "00 06 5f d8 84", 4),
    ("overlong-varint", x_varint, "00 86 00 5f d8 04", 5),
    ("repeated-index", x_varint, "00 06 00 5f", 6),
    ("index-past-n", x_varint, "00 06 5f 88 07", 7),
    ("too-few-indices", x_varint, "00 06 d8 04", 8),
    ("bytes-after-k", x_varint, "00 06 5f d8 04 00", 8),
    ("bitmap-short", x_bitmap, "01 04", 9),
    ("bitmap-bit-past-n", x_bitmap, "01 04 22", 10),
    ("bitmap-count", x_bitmap, "01 05 02", 11),
]


@pytest.mark.parametrize("case,x,stream,rule", HOSTILE_TOPK, ids=[c[0] for c in HOSTILE_TOPK])
def test_rejects_hostile_topk_indices(tmp_path, case, x, stream, rule):
    spec = "topk:k=3" if x is x_varint else "topk:k=2"
    data = _victim(tmp_path, x, spec)
    path = tmp_path / f"{case}.gcz"
    path.write_bytes(_with_stream(data, "indices", bytes.fromhex(stream)))
    with GczFile(path) as f:  # the structure is fine
        with pytest.raises(GczFormatError) as ei:
            f.read("t")
        with pytest.raises(GczFormatError):
            f.verify()
    assert ei.value.rule == "bad-stream-data"
    msg = str(ei.value)
    assert msg.startswith("bad-stream-data: tensor 't': topk: stream 'indices': ")
    assert f"rule {rule})" in msg, msg
    assert "topk" in _cpp_decode_fails(path, tmp_path)
    _assert_cpp_verify_names_bad_stream_data(path)


def _assert_cpp_verify_names_bad_stream_data(path):
    """gcz verify decodes every tensor, so it catches what checksums cannot, naming the rule."""
    r = subprocess.run([str(GCZ), "verify", str(path)], capture_output=True, text=True)
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert "bad-stream-data:" in r.stderr, r.stderr


def test_topk_indices_either_encoding_and_bound(tmp_path):
    """A decoder accepts the varint form where the encoder chose the bitmap (within the bound);
    a stream longer than the bound is a stream-size error in both readers."""
    data = _victim(tmp_path, x_bitmap, "topk:k=2")
    path = tmp_path / "varint.gcz"
    path.write_bytes(data)
    with GczFile(path) as f:
        assert f.read_stream("t", "indices") == bytes.fromhex("010402")
    path.write_bytes(_with_stream(data, "indices", bytes.fromhex("00 03 07")))
    out = check_against_cpp(path, tmp_path)
    assert np.array_equal(out["t"].view(np.float32), x_bitmap)
    path.write_bytes(_with_stream(data, "indices", bytes.fromhex("00 03 07 00")))
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "stream-size"
    assert "stream-size:" in _cpp_decode_fails(path, tmp_path)


def test_topk_indices_unit():
    ti = gczread.topk_indices
    b = lambda h: np.frombuffer(bytes.fromhex(h), np.uint8)  # noqa: E731
    assert ti(b("00 06 5f d8 04"), 1000, 3).tolist() == [5, 100, 700]
    assert ti(b("01 04 02"), 13, 2).tolist() == [2, 9]
    assert ti(b(""), 0, 0).tolist() == []
    n = 1 << 40
    big = lambda v: bytes([(v >> (7 * i) & 0x7F) | (0x80 if v >> (7 * i + 7) else 0)  # noqa: E731
                           for i in range(max(1, -(-v.bit_length() // 7)))]).hex()
    assert ti(b("00" + big(n - 1) + big(1)), n, 2).tolist() == [n - 2, n - 1]
    # a delta that would wrap around 2^64 back to a lower index (a descending list)
    with pytest.raises(ValueError, match="rule 7"):
        ti(b("00" + big(1 << 39) + big((1 << 64) - (1 << 38)) + big(1)), n, 3)
    with pytest.raises(ValueError, match="rule 5"):  # 65 bits
        ti(b("00" + "ff" * 9 + "02" + "01"), n, 2)
    with pytest.raises(ValueError, match="rule 1"):
        ti(b("00 01"), 0, 0)


# (id, spec, stream, replacement bytes) for the 13 elements X13
HOSTILE_QUANT = [
    ("qsgd-nan-scale", "qsgd:bits=3,group=5", "scales", "0000c07f 0000803f 0000803f"),
    ("qsgd-negative-scale", "qsgd:bits=3,group=5", "scales", "0000803f 000080bf 0000803f"),
    ("qsgd-inf-bf16-scale", "qsgd:bits=3,group=5,scale_dtype=bf16", "scales", "803f 807f 803f"),
    ("qsgd-padding-bits", "qsgd:bits=3,group=5", "codes", "bfdd229a f4"),
    ("terngrad-byte-243", "terngrad", "trits", "f3 00 00"),
    ("terngrad-base3-padding", "terngrad", "trits", "00 00 51"),
    ("terngrad-2bit-code-3", "terngrad:packing=2bit", "trits", "03 00 00 00"),
    ("terngrad-2bit-padding", "terngrad:packing=2bit", "trits", "00 00 00 04"),
    ("terngrad-nan-scale", "terngrad", "scales", "0100c0ff"),
]
X13 = np.linspace(-1, 1, 13)


@pytest.mark.parametrize("case,spec,stream,new", HOSTILE_QUANT, ids=[c[0] for c in HOSTILE_QUANT])
def test_rejects_hostile_quantizer_streams(tmp_path, case, spec, stream, new):
    path = tmp_path / f"{case}.gcz"
    path.write_bytes(_with_stream(_victim(tmp_path, X13, spec), stream, bytes.fromhex(new)))
    with GczFile(path) as f:
        with pytest.raises(GczFormatError) as ei:
            f.read("t")
    assert ei.value.rule == "bad-stream-data"
    assert str(ei.value).startswith(f"bad-stream-data: tensor 't': {spec.split(':')[0]}: ")
    _cpp_decode_fails(path, tmp_path)
    _assert_cpp_verify_names_bad_stream_data(path)


def test_odd_but_valid_streams_match_cpp(tmp_path):
    """Streams the encoder never writes but the decoding rules accept: -0 and +0 scales with
    nonzero codes, sign bits on level 0, trits under a zero scale: same bits as gcz."""
    cases = [("qsgd:bits=3,group=5", "scales", "00000080 0000803f 0000803f"),
             ("qsgd:bits=3,group=5", "scales", "00000000 0000803f 0000803f"),
             ("qsgd:bits=3,group=5", "codes", "24 49 92 24 01"),
             ("terngrad", "scales", "00000080"),
             ("terngrad:scale=group,group=4", "scales", "00000000 0000803f 00000080 0000803f")]
    for i, (spec, stream, new) in enumerate(cases):
        path = tmp_path / f"odd{i}.gcz"
        path.write_bytes(_with_stream(_victim(tmp_path, X13, spec), stream, bytes.fromhex(new)))
        check_against_cpp(path, tmp_path)


# ------------------------------------------------------------------------------------------------
# 7. codec parameters in the index


PARAM_EDITS = [
    ("qsgd", lambda p: p.update(foo=1), "unknown-codec"),
    ("qsgd", lambda p: p.update(bits=9), "unknown-codec"),
    ("qsgd", lambda p: p.update(bits=8.0), "unknown-codec"),
    ("qsgd", lambda p: p.update(group=(1 << 24) + 1), "unknown-codec"),
    ("qsgd", lambda p: p.update(scale_dtype="fp64"), "unknown-codec"),
    ("qsgd", lambda p: p.update(bits=None), "index-schema"),
    ("terngrad", lambda p: p.update(group=5), "unknown-codec"),
    ("terngrad", lambda p: p.update(clip=-1), "unknown-codec"),
    ("terngrad", lambda p: p.update(clip="2.5"), "unknown-codec"),
    ("topk", lambda p: p.update(k=3), "unknown-codec"),
    ("topk", lambda p: p.update(ratio=0), "unknown-codec"),
    ("topk", lambda p: p.update(ratio=1.0000000000000002), "unknown-codec"),
    ("topk", lambda p: p.update(values="fp32+zstd"), "unknown-codec"),
    ("topk", lambda p: p.update(values="(fp32)"), "unknown-codec"),
    ("topk", lambda p: p.update(values="qsgd:bits=8.0"), "unknown-codec"),
    ("topk", lambda p: p.update(values="randomk:ratio=nan"), "unknown-codec"),
    ("topk", lambda p: p.update(values="zstd"), "unknown-codec"),
    ("topk", lambda p: p.update(values="qsgd"), "bad-streams"),
    ("topk", lambda p: p.update(ratio=0.5), "stream-size"),
    ("randomk", lambda p: p.update(scale="biased"), "unknown-codec"),
    ("powersgd", lambda p: p.update(fallback="powersgd"), "unknown-codec"),
    ("powersgd", lambda p: p.update(rank=3), "stream-size"),
    ("powersgd", lambda p: p.update(min_rate=1000), "stream-size"),  # not eligible
]


@pytest.fixture(scope="module")
def param_victims(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("params")
    d = tmp / "in"
    d.mkdir()
    np.save(d / "m.npy", np.random.default_rng(0).standard_normal((40, 30)).astype(np.float32))
    return {c: encode_seed(tmp, d, c, "p").read_bytes()
            for c in ("qsgd", "terngrad", "topk", "randomk", "powersgd")}


@pytest.mark.parametrize("i", range(len(PARAM_EDITS)))
def test_codec_parameters_checked_like_cpp(tmp_path, param_victims, i):
    codec, fn, rule = PARAM_EDITS[i]
    path = tmp_path / f"param{i}.gcz"
    path.write_bytes(_edit_index(lambda j: fn(T0(j)["codec"][0]["params"]))(param_victims[codec]))
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == rule, str(ei.value)
    assert f"{rule}:" in _cpp_decode_fails(path, tmp_path)


def test_missing_codec_parameters_take_their_defaults(tmp_path, param_victims):
    for codec, data in param_victims.items():
        path = tmp_path / f"{codec}_bare.gcz"
        path.write_bytes(_edit_index(lambda j: T0(j)["codec"][0].update(params={}))(data))
        check_against_cpp(path, tmp_path)


def test_spec_strings():
    ps, ms = gczread.parse_spec, gczread.make_spec
    assert ps("fp16") == ("fp16", {})
    assert ps("topk:ratio=0.01,values=(qsgd:bits=8,group=128)") == (
        "topk", {"ratio": "0.01", "values": "qsgd:bits=8,group=128"})
    s = ms(*ps("randomk:k=3,values=(topk:ratio=0.5,values=(qsgd:bits=2))"), True)
    assert s.params["k"] == 3 and s.params["scale"] == "none"
    assert s.params["values"].params["values"] == gczread.CodecSpec("qsgd", {
        "bits": 2, "group": 128, "scale": "max", "rounding": "stochastic", "scale_dtype": "fp32"})
    names = [st.name for st in gczread.layout(s, "float32", (1000,))]
    assert names == ["values.indices", "values.values.codes", "values.values.scales"]
    # gcz writes numbers without a '+' (clip=1e20; test_gcz_writes_numbers_without_plus), and takes
    # a value in parentheses for a word, never for a number
    assert ms(*ps("terngrad:clip=1e20"), True).params["clip"] == 1e20
    assert ms(*ps("terngrad:clip=9.9999999999999995e-08"), True).params["clip"] == 1e-7
    assert ms(*ps("qsgd:scale=(l2),rounding=(nearest)"), True).params["scale"] == "l2"
    assert ms(*ps("topk:values=fp16"), True) == ms(*ps("topk:values=(fp16)"), True)
    for bad in ("", "fp32+zstd", "topk:values=(fp16", "qsgd:bits=", "qsgd:bits=8,", "qsgd:=1",
                "qsgd:bits=8,bits=8", "Topk", "qsgd:bits= 8", "terngrad:clip=1_0",
                "terngrad:clip=inf", "randomk:ratio=0x1p-3", "terngrad:clip=(1e+20)",
                "terngrad:clip=1e+20", "topk:values=(fp16))", "topk:values=fp16)",
                "qsgd:sc\u00e9le=max"):
        with pytest.raises(GczFormatError) as ei:
            ms(*ps(bad), True)
        assert ei.value.rule == "unknown-codec"
    assert gczread.sparse_k({"ratio": 0.29}, 100) == 28  # topk.md: 0.29 * 100 = 28.999...
    assert gczread.sparse_k({"ratio": 1e-9}, 100) == 1 and gczread.sparse_k({"k": 5}, 3) == 3


def test_spec_numbers_read_as_gcz_reads_them():
    """A number in a spec string: not in parentheses (gcz reads a parenthesised value as a word),
    an integer of at most 2^63 - 1 (strtoll; gcz reads a larger one as a float), and a float64 that
    neither overflows nor underflows (strtod's ERANGE: a subnormal or 0 that the literal is not
    exactly)."""
    ps, ms = gczread.parse_spec, gczread.make_spec
    bad = ["terngrad:clip=(2.5)", "qsgd:bits=(8)", "topk:ratio=(0.5)", "randomk:k=(3)",
           "powersgd:min_rate=(2)", "powersgd:rank=(1)", "terngrad:clip=1e-400",
           "terngrad:clip=1e-310", "terngrad:clip=5e-324", "terngrad:clip=1e400",
           "randomk:k=9223372036854775808", "randomk:k=10000000000000000000"]
    for spec in bad:
        with pytest.raises(GczFormatError) as ei:
            ms(*ps(spec), True)
        assert ei.value.rule == "unknown-codec", spec
    exact_tiny = str(Decimal(5e-324))  # 2^-1074 written out exactly (751 digits): no ERANGE
    for spec, clip in (("terngrad:clip=0e-400", 0.0), ("terngrad:clip=2.2250738585072014e-308",
                                                        2.2250738585072014e-308),
                       ("terngrad:clip=" + exact_tiny, 5e-324), ("terngrad:clip=000000001", 1.0)):
        assert ms(*ps(spec), True).params["clip"] == clip
    assert ms(*ps("randomk:k=9223372036854775807"), True).params["k"] == 2 ** 63 - 1


# values strings in an index: rejected by both readers with the same rule, or accepted by both
SPEC_VALUES_REJECTED = ["terngrad:clip=(2.5)", "qsgd:bits=(8)", "topk:ratio=(0.5)", "randomk:k=(3)",
                        "terngrad:clip=(1e+20)", "terngrad:clip=1e-400", "terngrad:clip=1e-310",
                        "randomk:k=10000000000000000000"]


@pytest.mark.parametrize("values", SPEC_VALUES_REJECTED)
def test_spec_values_rejected_like_cpp(tmp_path, param_victims, values):
    path = tmp_path / "v.gcz"
    path.write_bytes(_edit_index(lambda j: T0(j)["codec"][0]["params"].update(values=values))(
        param_victims["topk"]))
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "unknown-codec", str(ei.value)
    assert "unknown-codec:" in _cpp_decode_fails(path, tmp_path)


def test_spec_values_accepted_like_cpp(tmp_path):
    """Words in parentheses, a zero written with a huge exponent, an exact subnormal: gcz accepts
    them; so does gczread, and both decode the same bits."""
    src = tmp_path / "in"
    src.mkdir()
    np.save(src / "m.npy", np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32))
    cases = [("topk:ratio=0.1,values=(qsgd:bits=8)",
              "qsgd:bits=8,group=128,rounding=(stochastic),scale=(max),scale_dtype=(fp32)"),
             ("topk:ratio=0.1,values=(terngrad)",
              "terngrad:clip=0e-400,packing=base3,rounding=stochastic,scale=tensor"),
             ("topk:ratio=0.1,values=(terngrad)",
              "terngrad:clip=" + str(Decimal(5e-324)) + ",packing=base3,rounding=stochastic,"
              "scale=tensor")]
    for i, (spec, values) in enumerate(cases):
        data = encode_seed(tmp_path, src, spec, f"acc{i}").read_bytes()
        path = tmp_path / f"accepted{i}.gcz"
        path.write_bytes(_edit_index(lambda j: T0(j)["codec"][0]["params"].update(values=values))(
            data))
        check_against_cpp(path, tmp_path)


def test_gcz_writes_numbers_without_plus(tmp_path):
    """FORMAT.md §5.3: numbers in a nested spec are written so that they read back exactly, never
    with a '+' (which separates stages): gcz writes clip=1e20, not clip=(1e+20)."""
    path = encode_seed(tmp_path, SAMPLES / "step_0000.safetensors",
                       "topk:ratio=0.01,values=(terngrad:clip=1e20)", "plus")
    data = path.read_bytes()
    off, length, _ = _trailer(data)
    values = T0(json.loads(data[off:off + length]))["codec"][0]["params"]["values"]
    assert values.startswith("terngrad:clip=1e20,") and "+" not in values and "(" not in values
    spec = gczread.make_spec(*gczread.parse_spec(values), True)
    assert spec.params["clip"] == 1e20


def test_codec_spec_is_written_as_gcz_writes_it(tmp_path):
    """TensorInfo.codec_spec writes numbers as gcz does (shortest form that reads back, no '+':
    1e20, 1e-05), so that it is a spec gcz takes back, and the one `gcz info --json` prints (its
    table leaves out the parameters at their defaults)."""
    src = SAMPLES / "step_0000.safetensors"
    tail = ",packing=base3,rounding=stochastic,scale=tensor"
    rules = {"embed.weight": ("terngrad:clip=1e20", "terngrad:clip=1e20" + tail),
             "pos_embed.weight": ("terngrad:clip=0.01", "terngrad:clip=0.01" + tail),
             "head.bias": ("terngrad:clip=1e-5+zstd:level=5",
                           "terngrad:clip=1e-05" + tail + "+zstd:level=5"),
             "head.weight": ("topk:ratio=0.5,values=(terngrad:clip=2.5)",
                             "topk:ratio=0.5,values=(terngrad:clip=2.5" + tail + ")")}
    args = [a for name, (spec, _) in rules.items() for a in ("--rule", f"{name}={spec}")]
    path = encode_seed(tmp_path, src, "fp16", "spec", 0, *args)
    listing = gcz("info", str(path)).stdout
    index = {t["name"]: t for t in json.loads(gcz("info", str(path), "--json").stdout)["tensors"]}
    brief = {"embed.weight": "terngrad:clip=1e20", "pos_embed.weight": "terngrad:clip=0.01",
             "head.bias": "terngrad:clip=1e-05+zstd:level=5", "head.weight": "topk:ratio=0.5,values=terngrad"}
    with GczFile(path) as f:
        for name, (spec, want) in rules.items():
            info = f.info(name)
            assert info.codec_spec == want, name
            assert list(info.codec) == index[name]["codec"], name
            assert f"  {brief[name]}  " in listing, (brief[name], listing)
            again = encode_seed(tmp_path, src, info.codec_spec, "again_" + name.replace(".", "_"))
            with GczFile(again) as g:  # gcz takes it back, and records the same chain
                assert g.info(name).codec == info.codec


# ------------------------------------------------------------------------------------------------
# 8. an error-feedback state file is an ordinary .gcz (CODECS.md, "Error feedback")


def test_a_state_with_a_residual_of_another_dtype_is_refused(tmp_path):
    """A residual is float32 or float64: a state holding a float16 one is refused when it is opened."""
    np.savez(tmp_path / "r.npz", **{"residual/w": np.array([0, -2, 3, 0.5], np.float16)})
    gcz("encode", str(tmp_path / "r.npz"), "-o", str(tmp_path / "r.gcz"), "-c", "none", "-q")

    def as_state(j):
        j["metadata"] = {"gcz.error_feedback": "1", "gcz.ef_steps": "1"}

    (tmp_path / "state.gcz").write_bytes(_edit_index(as_state)((tmp_path / "r.gcz").read_bytes()))
    np.savez(tmp_path / "s.npz", w=np.ones(4, np.float32))
    r = gcz("encode", str(tmp_path / "s.npz"), "-o", str(tmp_path / "o.gcz"), "-c", "topk:k=1", "--ef-state",
            str(tmp_path / "state.gcz"), check=False)
    assert r.returncode != 0 and "tensor 'residual/w': a residual must be float32 or float64" in r.stderr, r.stderr
    assert not (tmp_path / "o.gcz").exists()


def test_error_feedback_state_file(tmp_path):
    steps = [SAMPLES / f"step_000{i}.safetensors" for i in range(3)]
    ef = tmp_path / "ef.gcz"
    residual = {}
    for spec, ef_codec in (("topk:ratio=0.05", "none"), ("powersgd:rank=2", "none"),
                           ("powersgd:rank=2,factors=(bf16)", "bf16")):
        ef.unlink(missing_ok=True)
        residual = {}
        for step, src in enumerate(steps):
            out = encode_seed(tmp_path, src, spec, f"ef{step}", 0, "--ef-state", str(ef),
                              "--ef-codec", ef_codec)
            check_against_cpp(ef, tmp_path)  # the EF file, read by both decoders: same bits
            x = {k: np.frombuffer(v[2], np.float32) for k, v in read_safetensors(src).items()}
            with GczFile(ef) as f, GczFile(out) as g:
                assert f.metadata.get("gcz.error_feedback") == "1"
                assert sorted(n for n in f.tensors if n.startswith("residual/")) == sorted(
                    "residual/" + n for n in g.tensors)
                for name in g.tensors:
                    r = f.read(f"residual/{name}")
                    assert r.dtype == np.float32 and r.shape == g.info(name).shape
                    if ef_codec == "none":  # e <- x' - decode(encode(x')), x' = x + e (float32)
                        xp = x[name] + residual.get(name, np.float32(0))
                        assert np.array_equal(r.reshape(-1), xp - g.read(name).reshape(-1))
                    residual[name] = r.reshape(-1)
                    if g.info(name).element_codec == "powersgd":
                        # state/NAME is the Q handed to the factor codec (powersgd.md, "State")
                        q = f.read(f"state/{name}").reshape(-1)
                        assert f.info(f"state/{name}").element_codec == "none"
                        if "factors" in spec:  # bf16 factors
                            stored = np.frombuffer(g.read_stream(name, "q.values"), "<u2")
                            q = gczread.convert_bits(q.view(np.uint32), "float32", "bfloat16")
                        else:
                            stored = np.frombuffer(g.read_stream(name, "q.values"), "<f4")
                        assert np.array_equal(q, stored)
                if spec.startswith("powersgd"):
                    assert any(n.startswith("state/") for n in f.tensors)


# ------------------------------------------------------------------------------------------------
# 9. hostile or extreme input: no hang, no error but GczFormatError, and the reader's own limits


def _leb128(v: int) -> bytes:
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v >> 7 else 0))
        v >>= 7
        if not v:
            return bytes(out)


def test_rules_are_those_of_format_md():
    """RULES is FORMAT.md §6's table, in order, bad-stream-data included (gcz verify names it)."""
    text = (REPO / "docs" / "FORMAT.md").read_text()
    section = text.split("## 6.")[1].split("\n## ")[0]
    rules = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert list(gczread.RULES) == rules
    assert set(gczread.DECODE_RULES) <= set(gczread.RULES)
    assert not set(gczread.LIMIT_RULES) & set(rules)
    assert "has no §6 rule" not in gczread.__doc__


def test_long_number_in_a_nested_spec_is_rejected_at_once(tmp_path, param_victims):
    """A digit run followed by a letter used to make the number pattern backtrack quadratically
    (a 20 KB file took 19 s to open)."""
    t0 = time.monotonic()
    assert gczread._NUMBER.fullmatch("1" * 20000 + "x") is None
    assert time.monotonic() - t0 < 1.0
    path = tmp_path / "long.gcz"
    path.write_bytes(_edit_index(lambda j: T0(j)["codec"][0]["params"].update(
        values="terngrad:clip=" + "1" * 20000 + "x"))(param_victims["topk"]))
    t0 = time.monotonic()
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert time.monotonic() - t0 < 2.0
    assert ei.value.rule == "unknown-codec"
    assert "unknown-codec:" in _cpp_decode_fails(path, tmp_path)
    for spec in ("qsgd:bits=" + "9" * 5000, "randomk:k=" + "1" * 4400,  # Python's int() limit
                 "terngrad:clip=" + "1" * 5000):
        with pytest.raises(GczFormatError) as ei:
            gczread.make_spec(*gczread.parse_spec(spec), True)
        assert ei.value.rule == "unknown-codec" and "MAX_NUMBER_CHARS" in str(ei.value)


def _nested(depth: int, inner: str = "fp32") -> str:
    """A spec with `depth` value codecs nested in value codecs under a topk element codec."""
    s = inner
    for _ in range(depth - 1):
        s = f"topk:ratio=0.5,values=({s})"
    return f"topk:ratio=0.5,values=({s})"


def test_nested_spec_parentheses_are_matched_once():
    """Each level used to walk its whole parenthesised group again, character by character
    (depth x length); now the parentheses of a spec string are matched once."""
    spec = _nested(60, "qsgd:scale=(" + "m" * 400_000 + ")")
    t0 = time.monotonic()
    with pytest.raises(GczFormatError) as ei:
        gczread.make_spec(*gczread.parse_spec(spec), True)
    assert time.monotonic() - t0 < 1.5
    assert ei.value.rule == "unknown-codec" and "must be one of max, l2" in str(ei.value)
    spec = gczread.make_spec(*gczread.parse_spec(_nested(60, "qsgd:bits=4,scale=(l2)")), True)
    names = [s.name for s in gczread.layout(spec, "float32", (1 << 20,))]
    assert names[-1] == "values." * 60 + "scales" and len(names) == 62
    for bad in ("topk:values=(topk:values=(fp16)", "topk:values=(topk:values=fp16))",
                "topk:values=(topk:values=(fp16)))(", "topk:values=)(fp16("):
        with pytest.raises(GczFormatError) as ei:
            gczread.make_spec(*gczread.parse_spec(bad), True)
        assert ei.value.rule == "unknown-codec"


def _both_refuse_param(path: Path, victim: bytes, key: str, spec: str, reader_says: str, gcz_says: str) -> str:
    """Writes `victim` with its first tensor's codec parameter `key` set to `spec`: both readers
    refuse it as unknown-codec, saying so. Returns what gcz printed."""
    path.write_bytes(_edit_index(lambda j: T0(j)["codec"][0]["params"].update({key: spec}))(victim))
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "unknown-codec" and reader_says in str(ei.value)
    r = gcz("verify", str(path), check=False)
    assert r.returncode == 5 and "unknown-codec" in r.stderr and gcz_says in r.stderr, r.stderr
    return r.stderr


def test_value_codec_nesting_is_limited(tmp_path, param_victims):
    """Value codecs nest at most MAX_SPEC_DEPTH deep; deeper is an invalid codec parameter
    (unknown-codec), not a RecursionError."""
    # CODECS.md's limit: gcz refuses it too, quickly
    _both_refuse_param(tmp_path / "deep.gcz", param_victims["topk"], "values", _nested(300),
                       "nest more than 64 deep", "more than 64")
    limit = gczread.MAX_SPEC_DEPTH
    ps, ms = gczread.parse_spec, gczread.make_spec
    spec = ms(*ps(_nested(limit)), True)
    names = [s.name for s in gczread.layout(spec, "float32", (1000,))]
    assert names[-1] == "values." * limit + "values"
    with pytest.raises(GczFormatError) as ei:
        ms(*ps(_nested(limit + 1)), True)
    assert ei.value.rule == "unknown-codec" and "nest more than 64 deep" in str(ei.value)


def test_value_codecs_write_at_most_1024_streams(tmp_path, param_victims):
    """PowerSGD's factors double the streams at each level, which the depth limit leaves at 2^63:
    a codec writing more than MAX_STREAMS is unknown-codec for both readers, found at once (gcz
    had made each level three times, 3^depth, and listed every name in its message)."""
    def factors(levels: int) -> str:
        s = "fp16"
        for _ in range(levels):
            s = f"powersgd:factors=({s})"
        return s
    ps, ms = gczread.parse_spec, gczread.make_spec
    assert gczread.MAX_STREAMS == 1024
    ms(*ps(factors(10)), True)  # 1024 streams, P's and Q's ten levels deep: valid (no shape fits it)
    for levels in (11, 63):
        with pytest.raises(GczFormatError) as ei:
            ms(*ps(factors(levels)), True)
        assert ei.value.rule == "unknown-codec" and "writes 2048 streams, more than 1024" in str(ei.value)
    with pytest.raises(GczFormatError) as ei:  # Top-K's indices are one more
        ms(*ps(f"topk:values=({factors(10)})"), True)
    assert ei.value.rule == "unknown-codec" and "writes 1025 streams" in str(ei.value)
    stderr = _both_refuse_param(tmp_path / "many.gcz", param_victims["powersgd"], "factors", factors(62),
                                "2048 streams", "more than 1024")
    assert len(stderr) < 10_000, len(stderr)  # each of 63 levels quotes its spec in part


def test_a_bad_streams_message_lists_at_most_16_names(tmp_path, param_victims):
    """Each list of stream names in a bad-streams message stops at 16, saying how many in all."""
    def factors(j):  # 32 streams for gcz, which compares the names before the shape
        T0(j)["codec"][0]["params"]["factors"] = "powersgd:factors=(" * 4 + "fp32" + ")" * 4
    path = tmp_path / "factors.gcz"
    path.write_bytes(_edit_index(factors)(param_victims["powersgd"]))
    r = gcz("verify", str(path), check=False)
    assert r.returncode == 4 and "bad-streams" in r.stderr, r.stderr
    assert "p.q.q.q.q.values, ... (32 in all)]" in r.stderr, r.stderr

    def copies(j):  # 40 listed, where the codec writes 2
        T0(j)["streams"] = T0(j)["streams"] * 20
    path = tmp_path / "copies.gcz"
    path.write_bytes(_edit_index(copies)(param_victims["powersgd"]))
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "bad-streams" and "'q.values', ... (40 in all)]" in str(ei.value), str(ei.value)


def test_numbers_beyond_float64_in_the_index(tmp_path, param_victims):
    """gcz reads JSON numbers as float64 (or 64-bit integers): one beyond float64 anywhere in the
    index is index-json for both readers (it was an OverflowError in gczread for a parameter)."""
    big = str(2 ** 1024).encode()
    cases = {"clip-2^1024": lambda b: b.replace(b'"clip":2.5', b'"clip":' + big),
             "clip-1e400": lambda b: b.replace(b'"clip":2.5', b'"clip":1e400'),
             "metrics-2^1024": lambda b: b.replace(b'"metrics":{',
                                                   b'"metrics":{"x":-' + big + b","),
             "future-key-1e400": lambda b: b.replace(b'"format"', b'"future":[1e400],"format"')}
    for case, fn in cases.items():
        path = tmp_path / f"{case}.gcz"
        data = _raw_index(fn)(param_victims["terngrad"])
        assert data != param_victims["terngrad"]
        path.write_bytes(data)
        with pytest.raises(GczFormatError) as ei:
            GczFile(path)
        assert ei.value.rule == "index-json", case
        r = gcz("verify", str(path), check=False)
        assert r.returncode != 0 and "index-json:" in r.stderr, (case, r.stderr)
    # what gcz accepts: integers up to 2^64 - 1 and beyond (as float64), tiny numbers (as 0)
    for v in (b"18446744073709551616", b"1e-400", big[:-2]):
        path = tmp_path / "ok.gcz"
        path.write_bytes(_raw_index(lambda b: b.replace(
            b'"metrics":{', b'"metrics":{"x":' + v + b","))(param_victims["terngrad"]))
        with GczFile(path) as f:
            f.verify()
        gcz("verify", str(path))
    with pytest.raises(GczFormatError) as ei:  # make_spec on JSON values directly
        gczread.make_spec("terngrad", {"clip": 2 ** 1024})
    assert ei.value.rule == "unknown-codec"


def _empty_victim(tmp: Path, spec: str, dtype: str) -> bytes:
    d = tmp / f"empty_{dtype}_{len(list(tmp.iterdir()))}"
    d.mkdir()
    if dtype == "bfloat16":
        write_safetensors(d / "t.safetensors", {"t": ("BF16", (0, 3), np.zeros((0, 3), np.uint16))})
        return encode_seed(tmp, d / "t.safetensors", spec, "empty").read_bytes()
    np.save(d / "t.npy", np.zeros((0, 3), dtype))
    return encode_seed(tmp, d, spec, "empty").read_bytes()


# Empty tensors at the format's limit: the product of the nonzero dimensions is at most 2^48.
EMPTY_SHAPES = [
    ([0, 2 ** 48], "float32"),
    ([2 ** 20, 0, 2 ** 28], "float32"),
    ([2 ** 24, 2 ** 24, 0], "float64"),
    ([0, 2 ** 48], "float16"),
    ([2 ** 48, 0], "bfloat16"),  # as uint16, and widened to float32
]
# ... and past it (numpy could not make an array of most of them).
EMPTY_SHAPES_PAST = [[0, 2 ** 48 + 1], [0, 2 ** 63], [0, 2 ** 64 - 1], [2 ** 32, 2 ** 32, 0],
                     [2 ** 24, 0, 2 ** 24 + 1]]


@pytest.mark.parametrize("spec", ["fp16", "topk:k=2", "qsgd:bits=4+zstd"])
@pytest.mark.parametrize("shape,dtype", EMPTY_SHAPES, ids=[f"{s[0]}-{s[1]}" for s in EMPTY_SHAPES])
def test_empty_tensors_with_huge_dimensions(tmp_path, spec, shape, dtype):
    path = tmp_path / "empty.gcz"
    path.write_bytes(_edit_index(lambda j: T0(j).update(shape=shape))(
        _empty_victim(tmp_path, spec, dtype)))
    gcz("verify", str(path))  # valid: gcz reads it
    with GczFile(path) as f:
        assert f.info("t").shape == tuple(shape) and f.info("t").numel == 0
        assert f.verify()["tensors"] == 1
        a = f.read("t")
        assert a.shape == tuple(shape) and a.size == 0
        assert f.read_bits("t").shape == tuple(shape)
        if dtype == "bfloat16":
            w = f.read("t", widen=True)
            assert w.shape == tuple(shape) and w.dtype == np.float32


@pytest.mark.parametrize("shape", EMPTY_SHAPES_PAST, ids=[str(s) for s in EMPTY_SHAPES_PAST])
def test_empty_tensors_past_the_shape_limit_are_bad_shape(tmp_path, shape):
    path = tmp_path / "empty.gcz"
    path.write_bytes(_edit_index(lambda j: T0(j).update(shape=shape))(
        _empty_victim(tmp_path, "fp16", "float32")))
    r = gcz("verify", str(path), check=False)
    assert r.returncode == 4 and "the product of its nonzero dimensions exceeds 2^48" in r.stderr, r.stderr
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "bad-shape" and ei.value.tensor == "t"


def _huge_topk(tmp: Path) -> bytes:
    """Top-K k=1 of a [2^40] tensor: a valid file of a few hundred bytes whose decoded tensor takes
    4 TiB."""
    def edit(j, blobs):
        t = j["tensors"][0]
        t["shape"] = [1 << 40]
        new = b"\x00" + _leb128(1 << 40)  # the last index
        t["streams"][0].update(encoding="raw", size=len(new))
        blobs[(0, 0)] = new
    return _relayout(edit)(_victim(tmp, np.arange(10.0), "topk:k=1"))


def _huge_powersgd(tmp: Path) -> bytes:
    """PowerSGD rank 1 of a [2^24, 2^24] tensor: 64 MiB factors, zstd-compressed into a few KB."""
    u = np.linspace(0, 3, 64)
    frame = zstandard.ZstdCompressor().compress(bytes(1 << 26))

    def edit(j, blobs):
        t = j["tensors"][0]
        t["shape"] = [1 << 24, 1 << 24]
        for si, s in enumerate(t["streams"]):
            s.update(encoding="zstd", size=1 << 26)
            blobs[(0, si)] = frame
    return _relayout(edit)(_victim(tmp, np.outer(u, u[:48]), "powersgd:rank=1+zstd"))


@pytest.mark.parametrize("make,nbytes", [(_huge_topk, 4 << 40), (_huge_powersgd, 4 << 48)],
                         ids=["topk-2^40", "powersgd-2^24x2^24"])
def test_tensor_too_large_for_memory(tmp_path, monkeypatch, make, nbytes):
    """A tiny valid file can claim a tensor far larger than memory: decoding it is a GczFormatError
    (rule reader-limit) naming the tensor and the bytes, checked before allocating."""
    monkeypatch.setattr(gczread, "MAX_DECODE_BYTES", 1 << 30, raising=False)
    path = tmp_path / "huge.gcz"
    path.write_bytes(make(tmp_path))
    with GczFile(path) as f:
        assert f.file_size < 64 * 1024
        for run in (lambda: f.read("t"), lambda: f.read_bits("t"), f.verify):
            with pytest.raises(GczFormatError) as ei:
                run()
            assert ei.value.rule == "reader-limit" and ei.value.tensor == "t"
            assert f"{nbytes} bytes" in str(ei.value)


def test_the_limit_counts_the_peak_of_decoding(tmp_path, monkeypatch):
    """MAX_DECODE_BYTES bounds a decode's peak, the element count times the codec's
    PEAK_BYTES_PER_ELEMENT: a kernel that overcommits kills the process before any MemoryError (a
    10 KB qsgd file of 2^28 elements took 7.2 GB), and the peak is as large for a bfloat16 tensor
    as for a float32 one."""
    x = np.linspace(-1, 1, 1 << 16).astype(np.float32)
    monkeypatch.setattr(gczread, "MAX_DECODE_BYTES", 24 << 16, raising=False)  # 24 bytes per element
    for spec, fits in (("none", True), ("qsgd", False)):  # 18 and 36 bytes per element
        path = tmp_path / f"{spec}.gcz"
        path.write_bytes(_victim(tmp_path, x, spec))
        with GczFile(path) as f:
            if fits:
                assert f.read("t").tobytes() == x.tobytes()
                continue
            with pytest.raises(GczFormatError) as ei:
                f.read("t")
            assert ei.value.rule == "reader-limit" and "about 36 bytes per element" in str(ei.value)
    assert set(gczread.PEAK_BYTES_PER_ELEMENT) == set(gczread.CODECS), "a peak for every codec"
    assert gczread._physical_memory() > 0


def test_out_of_memory_while_decoding(tmp_path, monkeypatch):
    """Running out of memory in a decoder is a GczFormatError naming the tensor and its bytes."""
    def no_memory(*args):
        raise MemoryError("Unable to allocate")
    monkeypatch.setattr(gczread, "MAX_DECODE_BYTES", None, raising=False)
    monkeypatch.setattr(gczread, "_scatter", no_memory)
    path = tmp_path / "topk.gcz"
    path.write_bytes(_victim(tmp_path, np.arange(10.0), "topk:k=1"))
    with GczFile(path) as f:
        with pytest.raises(GczFormatError) as ei:
            f.read("t")
    assert ei.value.rule == "reader-limit" and ei.value.tensor == "t"
    assert "out of memory" in str(ei.value) and "40 bytes" in str(ei.value)


def test_out_of_memory_while_reading_the_index(tmp_path, monkeypatch):
    """An index that runs out of memory as it is read (millions of small values) is a reader-limit
    GczFormatError from GczFile(), not a bare MemoryError."""
    real_loads = gczread.json.loads

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate")
    path = tmp_path / "topk.gcz"
    path.write_bytes(_victim(tmp_path, np.arange(10.0), "topk:k=1"))
    monkeypatch.setattr(gczread.json, "loads", no_memory)
    with pytest.raises(GczFormatError) as ei:
        GczFile(path)
    assert ei.value.rule == "reader-limit" and "out of memory reading the index" in str(ei.value)
    monkeypatch.setattr(gczread.json, "loads", real_loads)
    with GczFile(path) as f:
        assert f.read("t").shape == (10,)


def test_command_line_cannot_open(tmp_path):
    """A missing or unreadable file is one line on stderr, exit status 1, no traceback."""
    for path in (tmp_path / "missing.gcz", tmp_path):
        r = subprocess.run([sys.executable, str(REPO / "samples" / "python" / "gczread.py"),
                            str(path)], capture_output=True, text=True)
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith("gczread: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_powersgd_nan_factors(tmp_path):
    """PowerSGD with NaN and Inf factors (a hand-made file): every element has gcz decode's bits,
    each NaN sum the default quiet NaN whichever NaNs met (powersgd.md, "Decoding")."""
    u = np.linspace(0, 3, 64)
    data = _victim(tmp_path, np.outer(np.sin(u), np.cos(u[:48])) + 0.3 * np.outer(u, u[:48] ** 2),
                   "powersgd:rank=2")

    def edit(j, blobs):
        names = [s["name"] for s in j["tensors"][0]["streams"]]
        ip, iq = names.index("p.values"), names.index("q.values")
        P = np.frombuffer(blobs[(0, ip)], "<u4").reshape(64, 2).copy()
        Q = np.frombuffer(blobs[(0, iq)], "<u4").reshape(48, 2).copy()
        P[3] = [0x7FC00001, 0xFFC00002]     # NaNs with payloads, signs
        Q[5] = [0x7FC00003, 0x7FA00004]     # and a signalling NaN
        P[7, 1], Q[9, 0] = 0x7F800000, 0xFFC00005
        blobs[(0, ip)], blobs[(0, iq)] = P.tobytes(), Q.tobytes()
    path = tmp_path / "nan.gcz"
    path.write_bytes(_relayout(edit)(data))
    gcz("decode", str(path), "-o", str(tmp_path / "nan.safetensors"))
    cpp = np.frombuffer(read_safetensors(tmp_path / "nan.safetensors")["t"][2], "<u4")
    with GczFile(path) as f:
        mine = f.read_bits("t").reshape(-1)
    nan = is_nan_bits(cpp, "float32")
    assert nan.sum() > 100 and np.all(cpp[nan] == 0x7FC00000)
    assert np.array_equal(mine, cpp)


# ---- the reader as a library ---------------------------------------------------------------------

def _many_tensors(tmp_path: Path) -> Tuple[Path, dict]:
    rng = np.random.default_rng(11)
    arrays = {f"t{i}": rng.normal(size=(64, 96)).astype(np.float32) for i in range(8)}
    np.savez(tmp_path / "m.npz", **arrays)
    out = tmp_path / "m.gcz"
    subprocess.run([str(GCZ), "encode", str(tmp_path / "m.npz"), "-o", str(out), "-c", "qsgd+zstd", "-q",
                    "--meta", "step=7"], check=True)
    with GczFile(out) as f:
        return out, {n: f.read(n) for n in f.tensors}


def _read_all(f: GczFile, rounds: int) -> dict:
    got = {}
    for _ in range(rounds):
        got = {n: f[n] for n in f}
    return got


def test_one_file_is_read_from_threads_at_once(tmp_path):
    import concurrent.futures
    path, expected = _many_tensors(tmp_path)
    with GczFile(path) as f, concurrent.futures.ThreadPoolExecutor(6) as pool:
        for got in pool.map(lambda _: _read_all(f, 5), range(6)):
            assert got.keys() == expected.keys()
            assert all(np.array_equal(got[n], expected[n]) for n in expected)


def _read_inherited(_):
    return _read_all(_FORKED, 5)


def test_one_file_is_read_from_processes_forked_with_it_open(tmp_path):
    import multiprocessing
    global _FORKED
    path, expected = _many_tensors(tmp_path)
    with GczFile(path) as _FORKED, multiprocessing.get_context("fork").Pool(3) as pool:
        for got in pool.map(_read_inherited, range(6)):
            assert all(np.array_equal(got[n], expected[n]) for n in expected)


def test_a_file_pickles_as_its_path_and_reads_like_a_mapping(tmp_path):
    import pickle
    path, expected = _many_tensors(tmp_path)
    with GczFile(path) as f:
        assert list(f) == f.tensors and f.metadata["step"] == "7"
        assert len({f.info(n) for n in f}) == len(expected)  # TensorInfo is hashable
        with pickle.loads(pickle.dumps(f)) as g:
            assert g.path == f.path and all(np.array_equal(g[n], expected[n]) for n in expected)


def test_opening_a_file_leaves_the_recursion_limit_as_it_found_it(tmp_path):
    path, _ = _many_tensors(tmp_path)
    before, frames, f = sys.getrecursionlimit(), 0, sys._getframe()
    while f is not None:
        frames, f = frames + 1, f.f_back
    for limit in (frames + 20, before, 5000):  # below what the index needs, the default, above it
        sys.setrecursionlimit(limit)
        try:
            GczFile(path).close()
            assert sys.getrecursionlimit() == limit
        finally:
            sys.setrecursionlimit(before)


def test_the_command_line_prints_the_metadata(tmp_path):
    path, _ = _many_tensors(tmp_path)
    r = subprocess.run([sys.executable, str(REPO / "samples" / "python" / "gczread.py"), str(path)],
                       capture_output=True, text=True, check=True)
    assert "metadata  step=7" in r.stdout.splitlines(), r.stdout
