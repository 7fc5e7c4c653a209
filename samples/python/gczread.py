#!/usr/bin/env python3
"""gczread: an independent, pure-numpy reader of `.gcz` files (format version 1).

Written from docs/FORMAT.md and docs/CODECS.md alone (not from the C++ sources), as a check that the
specification is enough to read the format.

Dependencies
------------
- ``numpy`` (required).
- ``xxhash`` (PyPI, ``pip install xxhash``): XXH3-64 of the index and of every stream. Imported lazily
  on the first checksum, i.e. when a file is opened; a clear ``ImportError`` says what to install.
- ``zstandard`` (PyPI, ``pip install zstandard``): imported lazily, only when a stream stored with
  ``encoding: "zstd"`` is read; a clear ``ImportError`` says what to install.

API
---
>>> with GczFile("grads.gcz") as f:          # validates header, trailer, index checksum and schema,
...     f.tensors                            #   and the stream tiling of FORMAT.md §4/§6
...     f.info("head.weight")                # TensorInfo: dtype, shape, codec chain, streams, ...
...     a = f.read("head.weight")            # numpy array in the original dtype, C order, shape
...     f.verify()                           # every stream checksum, zstd frame, padding and decode

``read`` returns ``float16``/``float32``/``float64`` arrays for those dtypes. numpy has no bfloat16: a
``bfloat16`` tensor is returned as a ``numpy.uint16`` array holding the bfloat16 bit patterns (the
top 16 bits of the float32 with the same value), or, with ``read(name, widen=True)``, as a
``float32`` array (exact: every bfloat16 is a float32; NaNs get the quiet bit, per CODECS.md).
``read_bits(name)`` returns the raw bit patterns of any tensor as an unsigned integer array of the
dtype's width (uint16/uint32/uint64).

Every rejection raises :class:`GczFormatError`; ``err.rule`` is the FORMAT.md §6 rule name (for
instance ``"index-checksum"``) and the message starts with it.

Decoding follows CODECS.md bit-exactly: widening is exact, narrowing rounds to nearest-even in one
step, overflow gives +-Inf, and a NaN keeps its sign, has its payload truncated (or, widening,
shifted) into the destination's top fraction bits and gets the quiet bit set.

Command line: ``python3 gczread.py FILE.gcz [--verify]`` prints the tensors of the file.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["GczFile", "GczFormatError", "TensorInfo", "StreamInfo", "RULES", "convert_bits", "open_gcz"]

MAGIC = b"\x89GCZ\r\n\x1a\n"
END_MAGIC = b"\x89GCZEND\n"
HEADER_SIZE = 64
TRAILER_SIZE = 32
ALIGN = 64
MAX_INDEX = 64 * 1024 * 1024
MAX_NAME = 4096
MAX_DIMS = 32
MAX_NUMEL = 1 << 48
U64_MAX = (1 << 64) - 1
ZSTD_MAX_RATIO = 65536
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
SUPPORTED_MAJOR = 1

RULES = (
    "too-small", "bad-magic", "bad-version", "reserved-nonzero", "bad-end-magic", "index-too-large",
    "index-out-of-range", "index-checksum", "index-json", "index-schema", "duplicate-name",
    "bad-dtype", "bad-shape", "unknown-codec", "bad-streams", "bad-encoding", "stream-out-of-range",
    "stream-size", "stream-checksum", "zstd-frame", "nonzero-padding",
)


class GczFormatError(ValueError):
    """A `.gcz` file breaks a FORMAT.md §6 rule; ``.rule`` names it."""

    def __init__(self, rule: str, detail: str, tensor: Optional[str] = None):
        assert rule in RULES, rule
        self.rule = rule
        self.detail = detail
        self.tensor = tensor
        where = f"tensor {tensor!r}: " if tensor is not None else ""
        super().__init__(f"{rule}: {where}{detail}")


# ----------------------------------------------------------------------------------------------
# Lazy optional dependencies

_xxh3 = None


def _xxh3_64(data) -> int:
    global _xxh3
    if _xxh3 is None:
        try:
            import xxhash  # noqa: PLC0415
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "gczread needs the 'xxhash' package for XXH3-64 checksums: pip install xxhash"
            ) from e
        _xxh3 = xxhash.xxh3_64_intdigest
    return _xxh3(data)


def _zstd_module():
    try:
        import zstandard  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "this .gcz file has zstd-compressed streams; reading them needs the 'zstandard' "
            "package: pip install zstandard"
        ) from e
    return zstandard


# ----------------------------------------------------------------------------------------------
# Element formats and conversions (CODECS.md, "Element conversions")


@dataclass(frozen=True)
class _Fmt:
    name: str
    bits: int
    exp_bits: int
    frac_bits: int
    uint: str            # little-endian unsigned dtype of the stored bits
    float: Optional[str]  # numpy float dtype, None for bfloat16

    @property
    def itemsize(self) -> int:
        return self.bits // 8


FMTS: Dict[str, _Fmt] = {
    "float16": _Fmt("float16", 16, 5, 10, "<u2", "<f2"),
    "bfloat16": _Fmt("bfloat16", 16, 8, 7, "<u2", None),
    "float32": _Fmt("float32", 32, 8, 23, "<u4", "<f4"),
    "float64": _Fmt("float64", 64, 11, 52, "<u8", "<f8"),
}

# Cast codecs: the dtype each stores (None: the original dtype).
CAST_CODECS: Dict[str, Optional[str]] = {
    "none": None, "fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
}
# Streams each element codec writes, in order, and each stream's decoded size in bytes.
CODEC_STREAMS: Dict[str, Tuple[str, ...]] = {name: ("values",) for name in CAST_CODECS}


def _nan_mask(u: np.ndarray, f: _Fmt) -> np.ndarray:
    exp_mask = ((1 << f.exp_bits) - 1) << f.frac_bits
    frac_mask = (1 << f.frac_bits) - 1
    return ((u & exp_mask) == exp_mask) & ((u & frac_mask) != 0)


def _nan_bits(u: np.ndarray, src: _Fmt, dst: _Fmt) -> np.ndarray:
    """NaN -> NaN: sign kept, payload moved to the destination's top fraction bits, quiet bit set."""
    u = u.astype(np.uint64)
    sign = (u >> np.uint64(src.bits - 1)) & np.uint64(1)
    frac = u & np.uint64((1 << src.frac_bits) - 1)
    if dst.frac_bits >= src.frac_bits:
        payload = frac << np.uint64(dst.frac_bits - src.frac_bits)
    else:
        payload = frac >> np.uint64(src.frac_bits - dst.frac_bits)
    exp_mask = ((1 << dst.exp_bits) - 1) << dst.frac_bits
    quiet = 1 << (dst.frac_bits - 1)
    out = (sign << np.uint64(dst.bits - 1)) | np.uint64(exp_mask | quiet) | payload
    return out.astype(np.dtype(dst.uint).newbyteorder("="))


def _to_float32(u: np.ndarray, src: _Fmt) -> np.ndarray:
    """Exact widening of float16/bfloat16/float32 bits to float32 values (NaN payloads: see caller)."""
    if src.name == "float32":
        return u.astype(np.uint32).view(np.float32)
    if src.name == "bfloat16":
        return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if src.name == "float16":
        return u.astype(np.uint16).view(np.float16).astype(np.float32)
    raise AssertionError(src.name)


def _f32_to_bf16_rne(x: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 bits, round to nearest even (non-NaN inputs; overflow -> Inf)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return r.astype(np.uint16)


def convert_bits(u: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Convert an array of `src` bit patterns to `dst` bit patterns by the CODECS.md rules.

    Returns a native-endian unsigned array of the destination's width. Supports every conversion a
    cast codec's decoder needs (any stored dtype to any original dtype, except narrowing *from*
    float64, which only an encoder does).
    """
    s, d = FMTS[src], FMTS[dst]
    shape = np.shape(u)
    u = np.asarray(u).astype(np.dtype(s.uint).newbyteorder("="), copy=False).reshape(-1)
    if s is d:
        return u.copy().reshape(shape)
    if s.name == "float64":
        raise NotImplementedError("narrowing from float64 is done by the encoder only")
    nan = _nan_mask(u, s)
    with np.errstate(over="ignore", invalid="ignore"):
        x = _to_float32(u, s)  # exact
        if d.name == "float32":
            out = x.view(np.uint32).copy()
        elif d.name == "float64":
            out = x.astype(np.float64).view(np.uint64)  # exact
        elif d.name == "float16":
            out = x.astype(np.float16).view(np.uint16)  # one RNE rounding from the exact value
        elif d.name == "bfloat16":
            out = _f32_to_bf16_rne(x)  # one RNE rounding from the exact value
        else:  # pragma: no cover
            raise AssertionError(d.name)
    out = np.array(out, copy=True)
    if nan.any():
        out[nan] = _nan_bits(u[nan], s, d)
    return out.reshape(shape)


# ----------------------------------------------------------------------------------------------
# Index model


@dataclass(frozen=True)
class StreamInfo:
    name: str
    encoding: str
    offset: int
    length: int
    size: int
    xxh3: str


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                   # original dtype: float16, bfloat16, float32, float64
    shape: Tuple[int, ...]
    codec: Tuple[Dict[str, Any], ...]  # the chain, as in the index: {"name": ..., "params": {...}}
    seed: int
    rng: str
    streams: Tuple[StreamInfo, ...]
    metrics: Optional[Dict[str, Any]] = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def element_codec(self) -> str:
        return self.codec[0]["name"]

    @property
    def stored_dtype(self) -> str:
        return CAST_CODECS[self.element_codec] or self.dtype

    @property
    def codec_spec(self) -> str:
        """The chain written as a spec string, e.g. ``fp16+zstd:level=3``."""
        parts = []
        for st in self.codec:
            params = ",".join(f"{k}={v}" for k, v in st["params"].items())
            parts.append(st["name"] + (":" + params if params else ""))
        return "+".join(parts)

    @property
    def stored_bytes(self) -> int:
        return sum(s.length for s in self.streams)


_HEX16 = re.compile(r"[0-9a-f]{16}\Z")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _is_uint(v: Any) -> bool:
    return type(v) is int and 0 <= v <= U64_MAX


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _check_strings(obj: Any) -> None:
    """Reject strings that cannot be UTF-8 (lone surrogates written as \\uD800 escapes)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            o.encode("utf-8")
        elif isinstance(o, dict):
            for k, v in o.items():
                k.encode("utf-8")
                stack.append(v)
        elif isinstance(o, list):
            stack.extend(o)


def _parse_index(raw: bytes) -> Dict[str, Any]:
    try:
        if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM is tolerated (as gcz does)
            raw = raw[3:]
        text = raw.decode("utf-8")  # strict: invalid UTF-8 is rejected
        obj = json.loads(text, parse_constant=_reject_constant)
        _check_strings(obj)
    except (ValueError, RecursionError, UnicodeError) as e:
        raise GczFormatError("index-json", f"the index is not valid UTF-8 JSON ({e})") from None
    if not isinstance(obj, dict):
        raise GczFormatError("index-json", "the index is not a JSON object")
    return obj


def _req(obj: Dict[str, Any], key: str, typ, what: str, tensor: Optional[str] = None):
    if key not in obj:
        raise GczFormatError("index-schema", f"{what} is missing key {key!r}", tensor)
    v = obj[key]
    ok = _is_uint(v) if typ is int else isinstance(v, typ)
    if not ok:
        raise GczFormatError("index-schema", f"{what} key {key!r} has the wrong type", tensor)
    return v


def _validate_chain(chain: List[Any], tname: str) -> Tuple[Dict[str, Any], ...]:
    if len(chain) == 0:
        raise GczFormatError("index-schema", "'codec' has no stage", tname)
    stages = []
    for i, st in enumerate(chain):
        if not isinstance(st, dict):
            raise GczFormatError("index-schema", f"codec stage {i} is not an object", tname)
        sname = _req(st, "name", str, f"codec stage {i}", tname)
        params = _req(st, "params", dict, f"codec stage {i}", tname)
        if i == 0:
            if sname not in CAST_CODECS:
                raise GczFormatError("unknown-codec", f"unknown element codec {sname!r}", tname)
            if params:
                raise GczFormatError(
                    "unknown-codec", f"codec {sname!r} takes no parameters, got {sorted(params)}",
                    tname)
        else:
            if i > 1:
                raise GczFormatError("unknown-codec", "more than one stage after the element codec",
                                     tname)
            if sname != "zstd":
                raise GczFormatError("unknown-codec", f"unknown stage {sname!r} after the first",
                                     tname)
            if set(params) != {"level"}:
                raise GczFormatError(
                    "unknown-codec", f"zstd stage params must be exactly {{level}}, got "
                    f"{sorted(params)}", tname)
            lv = params["level"]
            if type(lv) is not int or not 1 <= lv <= 22:
                raise GczFormatError("unknown-codec", f"zstd level {lv!r} is not an integer 1-22",
                                     tname)
        stages.append({"name": sname, "params": dict(params)})
    return tuple(stages)


class GczFile:
    """A `.gcz` file opened for reading. Opening validates everything but the stream bytes."""

    def __init__(self, path: "str | os.PathLike[str]"):
        self.path = os.fspath(path)
        self._f = open(self.path, "rb")
        try:
            self._load()
        except BaseException:
            self._f.close()
            raise

    # -- context manager -------------------------------------------------------------------------
    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "GczFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- structure -------------------------------------------------------------------------------
    def _pread(self, offset: int, length: int) -> bytes:
        self._f.seek(offset)
        data = self._f.read(length)
        if len(data) != length:  # the file changed under us
            raise OSError(f"{self.path}: short read at offset {offset}")
        return data

    def _load(self) -> None:
        size = os.fstat(self._f.fileno()).st_size
        self.file_size = size
        if size < HEADER_SIZE + TRAILER_SIZE:
            raise GczFormatError("too-small", f"the file has {size} bytes, fewer than 96")
        header = self._pread(0, HEADER_SIZE)
        if header[0:8] != MAGIC:
            raise GczFormatError("bad-magic", f"header magic is {header[0:8].hex()}")
        major, minor, flags = struct.unpack_from("<HHI", header, 8)
        if major != SUPPORTED_MAJOR:
            raise GczFormatError("bad-version", f"version_major {major} is not implemented "
                                 f"(this reader implements {SUPPORTED_MAJOR})")
        if flags != 0 or any(header[16:64]):
            raise GczFormatError("reserved-nonzero", "header flags or reserved bytes are not zero")
        self.version = (major, minor)

        trailer = self._pread(size - TRAILER_SIZE, TRAILER_SIZE)
        index_offset, index_length, index_xxh3 = struct.unpack_from("<QQQ", trailer, 0)
        if trailer[24:32] != END_MAGIC:
            raise GczFormatError("bad-end-magic", f"trailer end_magic is {trailer[24:32].hex()}")
        if index_length == 0 or index_length > MAX_INDEX:
            raise GczFormatError("index-too-large",
                                 f"index_length {index_length} is 0 or above 64 MiB")
        if (index_offset % ALIGN or index_offset < HEADER_SIZE
                or index_offset + index_length + TRAILER_SIZE != size):
            raise GczFormatError(
                "index-out-of-range", f"index at {index_offset}+{index_length} does not fit a "
                f"{size}-byte file (must be a multiple of 64, >= 64, and end at the trailer)")
        self.index_offset = index_offset
        raw = self._pread(index_offset, index_length)
        got = _xxh3_64(raw)
        if got != index_xxh3:
            raise GczFormatError("index-checksum",
                                 f"index XXH3 is {got:016x}, the trailer says {index_xxh3:016x}")
        self._index = _parse_index(raw)
        self._validate_index()

    def _validate_index(self) -> None:
        idx = self._index
        fmt = _req(idx, "format", str, "the index")
        if fmt != "gcz":
            raise GczFormatError("index-schema", f"'format' is {fmt!r}, not \"gcz\"")
        version = _req(idx, "version", int, "the index")
        if version != self.version[0]:
            raise GczFormatError("index-schema", f"index 'version' {version} differs from the "
                                 f"header's version_major {self.version[0]}")
        self.producer = _req(idx, "producer", str, "the index")
        meta = idx.get("metadata", {})
        if not isinstance(meta, dict):
            raise GczFormatError("index-schema", "'metadata' is not an object")
        for k, v in meta.items():
            if not isinstance(v, str):
                raise GczFormatError("index-schema", f"metadata value {k!r} is not a string")
        self.metadata: Dict[str, str] = dict(meta)
        tensors = _req(idx, "tensors", list, "the index")

        infos: Dict[str, TensorInfo] = {}
        pos = HEADER_SIZE  # end of the previous stream
        for ti, t in enumerate(tensors):
            if not isinstance(t, dict):
                raise GczFormatError("index-schema", f"tensor {ti} is not an object")
            name = _req(t, "name", str, f"tensor {ti}")
            nbytes = len(name.encode("utf-8"))
            if not 1 <= nbytes <= MAX_NAME:
                raise GczFormatError("duplicate-name",
                                     f"tensor {ti}: a name must be 1-4096 bytes, got {nbytes}")
            if name in infos:
                raise GczFormatError("duplicate-name", f"two tensors are named {name!r}")
            info, pos = self._validate_tensor(t, name, pos)
            infos[name] = info
        if _align(pos) != self.index_offset:
            raise GczFormatError(
                "stream-out-of-range", f"the data section has {self.index_offset - _align(pos)} "
                "bytes no stream accounts for")
        self._infos = infos

    def _validate_tensor(self, t: Dict[str, Any], name: str, pos: int):
        dtype = _req(t, "dtype", str, "tensor", name)
        shape = _req(t, "shape", list, "tensor", name)
        chain = _req(t, "codec", list, "tensor", name)
        seed = _req(t, "seed", int, "tensor", name)
        rng = _req(t, "rng", str, "tensor", name)
        streams = _req(t, "streams", list, "tensor", name)
        if not all(_is_uint(d) for d in shape):
            raise GczFormatError("index-schema", "a shape dimension is not a non-negative integer",
                                 name)
        if dtype not in FMTS:
            raise GczFormatError("bad-dtype", f"unknown dtype {dtype!r}", name)
        if len(shape) > MAX_DIMS:
            raise GczFormatError("bad-shape", f"{len(shape)} dimensions, more than 32", name)
        numel = 1
        for d in shape:
            numel *= d
        if numel > MAX_NUMEL:
            raise GczFormatError("bad-shape", f"shape {shape} has more than 2^48 elements", name)
        stages = _validate_chain(chain, name)
        has_zstd = len(stages) > 1
        ecodec = stages[0]["name"]
        stored = FMTS[CAST_CODECS[ecodec] or dtype]
        expected_sizes = {"values": numel * stored.itemsize}

        sinfos = []
        for si, s in enumerate(streams):
            if not isinstance(s, dict):
                raise GczFormatError("index-schema", f"stream {si} is not an object", name)
            what = f"stream {si}"
            sname = _req(s, "name", str, what, name)
            enc = _req(s, "encoding", str, what, name)
            off = _req(s, "offset", int, what, name)
            length = _req(s, "length", int, what, name)
            size = _req(s, "size", int, what, name)
            xx = _req(s, "xxh3", str, what, name)
            if not _HEX16.match(xx):
                raise GczFormatError("index-schema",
                                     f"stream {sname!r} xxh3 is not 16 lowercase hex digits", name)
            sinfos.append(StreamInfo(sname, enc, off, length, size, xx))
        want = CODEC_STREAMS[ecodec]
        if tuple(s.name for s in sinfos) != want:
            raise GczFormatError(
                "bad-streams", f"codec {ecodec!r} writes streams {list(want)}, the index lists "
                f"{[s.name for s in sinfos]}", name)
        for s in sinfos:
            if s.encoding not in ("raw", "zstd"):
                raise GczFormatError("bad-encoding",
                                     f"stream {s.name!r} has unknown encoding {s.encoding!r}", name)
            if s.encoding == "zstd" and not has_zstd:
                raise GczFormatError(
                    "bad-encoding", f"stream {s.name!r} is zstd but the chain has no zstd stage",
                    name)
            if s.size != expected_sizes[s.name]:
                raise GczFormatError(
                    "stream-size", f"stream {s.name!r} size {s.size} does not match the codec's "
                    f"{expected_sizes[s.name]}", name)
            if s.encoding == "raw" and s.length != s.size:
                raise GczFormatError(
                    "stream-size", f"raw stream {s.name!r} has length {s.length} != size {s.size}",
                    name)
            if s.encoding == "zstd" and s.size > ZSTD_MAX_RATIO * s.length:
                raise GczFormatError(
                    "stream-size", f"zstd stream {s.name!r} size {s.size} exceeds 65536 x length "
                    f"{s.length}", name)
            expect = _align(pos)
            if s.offset != expect:
                raise GczFormatError(
                    "stream-out-of-range", f"stream {s.name!r} is at offset {s.offset}, expected "
                    f"{expect}", name)
            end = s.offset + s.length
            if end > self.index_offset:
                raise GczFormatError(
                    "stream-out-of-range", f"stream {s.name!r} ends at {end}, past the index at "
                    f"{self.index_offset}", name)
            pos = end
        metrics = t.get("metrics")
        info = TensorInfo(name=name, dtype=dtype, shape=tuple(shape), codec=stages, seed=seed,
                          rng=rng, streams=tuple(sinfos),
                          metrics=metrics if isinstance(metrics, dict) else None)
        return info, pos

    # -- public API ------------------------------------------------------------------------------
    @property
    def tensors(self) -> List[str]:
        """Tensor names, in file order."""
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def read_stream(self, name: str, stream: str) -> bytes:
        """The decoded bytes (``size`` of them) of one stream, after checking its checksum."""
        info = self.info(name)
        for s in info.streams:
            if s.name == stream:
                return self._read_stream(info, s)
        raise KeyError(f"tensor {name!r} has no stream {stream!r}")

    def _read_stream(self, info: TensorInfo, s: StreamInfo) -> bytes:
        stored = self._pread(s.offset, s.length)
        got = "%016x" % _xxh3_64(stored)
        if got != s.xxh3:
            raise GczFormatError(
                "stream-checksum", f"stream {s.name!r} XXH3 is {got}, the index says {s.xxh3}",
                info.name)
        if s.encoding == "raw":
            return stored
        return _zstd_decode(stored, s.size, info.name, s.name)

    def read_bits(self, name: str) -> np.ndarray:
        """The decoded tensor as raw bit patterns: uint16 (float16/bfloat16), uint32, uint64."""
        info = self.info(name)
        ecodec = info.element_codec
        if ecodec in CAST_CODECS:
            values = self._read_stream(info, info.streams[0])
            stored = FMTS[info.stored_dtype]
            u = np.frombuffer(values, dtype=stored.uint, count=info.numel)
            out = convert_bits(u, stored.name, info.dtype)
        else:  # pragma: no cover - rejected at open
            raise GczFormatError("unknown-codec", f"unknown element codec {ecodec!r}", name)
        return out.reshape(info.shape)

    def read(self, name: str, widen: bool = False) -> np.ndarray:
        """The decoded tensor in its original dtype (C order, its shape).

        float16/float32/float64 tensors come back as those numpy dtypes. bfloat16 tensors come back
        as uint16 bit patterns, or as float32 values (exact) with ``widen=True``.
        """
        info = self.info(name)
        bits = self.read_bits(name)
        if info.dtype == "bfloat16":
            if widen:
                return convert_bits(bits, "bfloat16", "float32").view(np.float32)
            return bits
        return bits.view(np.dtype(FMTS[info.dtype].float).newbyteorder("="))

    def verify(self) -> Dict[str, int]:
        """Check everything: every stream's checksum and zstd frame, zero padding, and that every
        tensor decodes. Raises GczFormatError on the first problem; returns a small summary."""
        pos = HEADER_SIZE
        nstreams = 0
        for name, info in self._infos.items():
            for s in info.streams:
                self._check_padding(pos, s.offset, name)
                self._read_stream(info, s)
                pos = s.offset + s.length
                nstreams += 1
            self.read_bits(name)
        self._check_padding(pos, self.index_offset, None)
        return {"tensors": len(self._infos), "streams": nstreams, "bytes": self.file_size}

    def _check_padding(self, start: int, end: int, tensor: Optional[str]) -> None:
        if end > start:
            pad = self._pread(start, end - start)
            if any(pad):
                first = next(i for i, b in enumerate(pad) if b)
                raise GczFormatError("nonzero-padding",
                                     f"padding byte at offset {start + first} is not zero", tensor)

    def __repr__(self) -> str:
        return f"GczFile({self.path!r}, {len(self._infos)} tensors)"


def _zstd_decode(stored: bytes, size: int, tensor: str, stream: str) -> bytes:
    """Exactly one zstd frame (no skippable frame, nothing after it) of exactly `size` bytes."""
    if len(stored) < 4 or stored[:4] != ZSTD_FRAME_MAGIC:
        raise GczFormatError("zstd-frame", f"stream {stream!r} does not start with a zstd frame",
                             tensor)
    zstd = _zstd_module()
    try:
        params = zstd.get_frame_parameters(stored)
        declared = params.content_size
        if declared != zstd.CONTENTSIZE_UNKNOWN and declared != size:
            raise GczFormatError(
                "zstd-frame", f"stream {stream!r}: the frame declares {declared} bytes, the index "
                f"says {size}", tensor)
        # Feed the frame in chunks so that a frame holding far more than `size` is stopped early:
        # a zstd block expands at most ~32768x, so one chunk yields at most ~max(2*size, 32 MiB).
        dobj = zstd.ZstdDecompressor().decompressobj()
        chunk = max(1024, size // 16384)
        parts, total, pos = [], 0, 0
        view = memoryview(stored)
        while pos < len(stored) and not dobj.eof:
            part = dobj.decompress(view[pos:pos + chunk])
            pos += chunk
            total += len(part)
            if total > size:
                raise GczFormatError("zstd-frame", f"stream {stream!r}: the frame holds more than "
                                     f"{size} bytes", tensor)
            parts.append(part)
        if not dobj.eof:
            raise GczFormatError("zstd-frame", f"stream {stream!r}: the zstd frame is incomplete",
                                 tensor)
        if dobj.unused_data or pos < len(stored):
            raise GczFormatError("zstd-frame", f"stream {stream!r}: bytes follow the zstd frame",
                                 tensor)
        out = b"".join(parts)
    except zstd.ZstdError as e:
        raise GczFormatError("zstd-frame", f"stream {stream!r}: {e}", tensor) from None
    if len(out) != size:
        raise GczFormatError(
            "zstd-frame", f"stream {stream!r}: the frame holds {len(out)} bytes, the index says "
            f"{size}", tensor)
    return out


def open_gcz(path: "str | os.PathLike[str]") -> GczFile:
    return GczFile(path)


def _main(argv: List[str]) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="gczread.py", description="List the tensors of a .gcz file.")
    ap.add_argument("file")
    ap.add_argument("--verify", action="store_true", help="also check every stream and decode")
    args = ap.parse_args(argv)
    try:
        with GczFile(args.file) as f:
            print(f"{args.file}: gcz {f.version[0]}.{f.version[1]}, written by {f.producer}, "
                  f"{len(f)} tensors, {f.file_size} bytes")
            rows = [("tensor", "dtype", "shape", "codec", "streams", "stored")]
            for n in f.tensors:
                i = f.info(n)
                rows.append((n, i.dtype, "[" + ", ".join(map(str, i.shape)) + "]", i.codec_spec,
                             " ".join(f"{s.name}:{s.encoding}" for s in i.streams),
                             str(i.stored_bytes)))
            widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
            for r in rows:
                print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
            if args.verify:
                summary = f.verify()
                print(f"verify: ok ({summary['tensors']} tensors, {summary['streams']} streams)")
    except GczFormatError as e:
        print(f"gczread: {args.file}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
