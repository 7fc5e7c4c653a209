#!/usr/bin/env python3
"""gczread: an independent reader of `.gcz` files (format version 1), in Python with numpy.

Written from docs/FORMAT.md, docs/CODECS.md and docs/codecs/*.md alone (not from the C++ sources),
as a check that the specification is enough to read the format. It decodes every codec gcz writes:

- the cast codecs ``none``, ``fp32``, ``fp16``, ``bf16`` (CODECS.md, "Cast codecs");
- ``qsgd`` (docs/codecs/qsgd.md) and ``terngrad`` (docs/codecs/terngrad.md);
- ``topk`` (docs/codecs/topk.md), with every rule on a hostile ``indices`` stream checked;
- ``randomk`` (docs/codecs/randomk.md): the kept indices are drawn again from the tensor's seed and
  name with Philox4x32-10 (CODECS.md, "Randomness"), vectorized in numpy;
- ``powersgd`` (docs/codecs/powersgd.md): x = P·Qᵀ summed exactly in float64 in the order of the
  doc, rounded once to the dtype;
- value codecs nested in them (``values=(qsgd:bits=8)``, ``factors=(bf16)``, and deeper), and
  error-feedback state files (ordinary .gcz files, CODECS.md "Error feedback").

All of these come out bit for bit as ``gcz decode`` writes them (tests/python/test_reader.py),
PowerSGD's NaN sums included (from NaN or Inf factors, which only a hand-made file holds: each is
the default quiet NaN, powersgd.md).

Dependencies
------------
- ``numpy`` (required).
- ``xxhash`` (PyPI, ``pip install xxhash``): XXH3-64 of the index and of every stream. Imported lazily
  on the first checksum, i.e. when a file is opened; a clear ``ImportError`` says what to install.
- ``zstandard`` (PyPI, ``pip install zstandard``): imported lazily, only when a stream stored with
  ``encoding: "zstd"`` is read; a clear ``ImportError`` says what to install.

API
---
::

    with GczFile("grads.gcz") as f:          # validates header, trailer, index checksum and schema,
        names = f.tensors                    #   and the stream tiling of FORMAT.md §4/§6
        info = f.info("head.weight")         # TensorInfo: dtype, shape, codec chain, streams, ...
        a = f.read("head.weight")            # numpy array in the original dtype, C order, shape
        arrays = {n: f[n] for n in f}        # every tensor (f[n] is f.read(n))
        f.verify()                           # every stream checksum, zstd frame, padding and decode

    # An error-feedback state (gcz encode --ef-state ef.gcz): residuals, and PowerSGD's Q.
    with GczFile("ef.gcz") as f:
        steps = int(f.metadata.get("gcz.ef_steps", "0"))  # absent: no step yet
        residuals = {n[len("residual/"):]: f[n] for n in f if n.startswith("residual/")}

``GczFile(path)`` (or ``open_gcz(path)``) opens and checks a file; ``close()``, or a ``with`` block,
closes it. Its attributes: ``path``; ``tensors``, the names in file order (also ``len(f)``,
``name in f``, ``iter(f)``); ``metadata``, the index's metadata as a ``dict`` of strings (``--meta``
values, and ``gcz.*`` keys such as ``gcz.ef_steps``); ``producer``; ``version``, ``(major, minor)``;
``file_size``. ``info(name)`` gives a :class:`TensorInfo`: ``name``, ``dtype``, ``shape``, ``codec``
(the chain as in the index), ``codec_spec`` (the chain as one ``-c`` spec, every parameter
given), ``seed``, ``rng``, ``streams`` (:class:`StreamInfo`: ``name``, ``encoding``, ``offset``,
``length``, ``size``, ``xxh3``), ``metrics`` (the dict the encoder stored, or ``None``),
``numel``. ``read_stream(name, stream)`` returns one stream's stored bytes, decompressed. One
``GczFile`` may be read from several threads at once, and from processes forked while it was open
(reads are positional); pickled, it is its path, opened again where it is unpickled.

``read`` returns ``float16``/``float32``/``float64`` arrays for those dtypes. numpy has no bfloat16: a
``bfloat16`` tensor is returned as a ``numpy.uint16`` array holding the bfloat16 bit patterns (the
top 16 bits of the float32 with the same value), or, with ``read(name, widen=True)``, as a
``float32`` array (exact: every bfloat16 is a float32; NaNs get the quiet bit, per CODECS.md).
``read_bits(name)`` returns the raw bit patterns of any tensor as an unsigned integer array of the
dtype's width (uint16/uint32/uint64).

Every rejection raises :class:`GczFormatError` (a ``ValueError``); ``err.rule`` is the FORMAT.md §6
rule name (for instance ``"index-checksum"``; the name ``gcz verify`` prints) and the message starts
with it. Besides it: ``OSError`` (``FileNotFoundError``, ``IsADirectoryError``, ...) where the file
cannot be opened or read, or shrinks while open ("short read"); ``KeyError`` for a tensor or stream
name the file does not have; ``ValueError`` for a read after ``close()``; ``ImportError`` as above. A
stream whose *content* breaks its codec's decoding rules (docs/codecs/*.md: a Top-K index list that
is not strictly ascending, a NaN QSGD scale, a base-3 byte above 242, ...) is found when the tensor
is decoded (``read``, ``read_bits``, ``verify``): §6 rule ``"bad-stream-data"``, with a message
naming the codec, the stream and the doc section (and, for Top-K, the rule number).

Limits:

- Value codecs nest at most ``MAX_SPEC_DEPTH`` (64) deep (``values=(topk:values=(...))``: two), and
  a codec with its value codecs writes at most ``MAX_STREAMS`` (1024) streams, as CODECS.md ("Value
  codecs") fixes; a number in a spec string has at most ``MAX_NUMBER_CHARS`` (4096)
  characters (gcz writes at most 24; a limit of this reader). A spec beyond them is rejected as an
  invalid codec parameter, rule ``"unknown-codec"``.
- A valid file can hold what this reader cannot hand back; it raises ``GczFormatError`` with rule
  ``"reader-limit"`` (not a FORMAT.md rule: the file is valid; ``LIMIT_RULES``), naming the tensor:
  a tensor whose decoding would take more than ``MAX_DECODE_BYTES`` bytes at its peak (its element
  count times the codec's ``PEAK_BYTES_PER_ELEMENT``, 18 to 54; default: the machine's physical
  memory, or the limit of this process's cgroup (v2, or v1's memory controller) or one above it
  where lower; ``None``: no limit), or whose decoding runs out of memory, from
  ``read``, ``read_bits`` and ``verify``, with the bytes its decoded values take; and, from
  ``GczFile()``, an index that runs out of memory as it is read (millions of small values take many
  times their bytes). (A process the kernel lets overcommit does not see a MemoryError: it is
  killed, which the estimate is there to prevent.)

Decoding follows CODECS.md bit-exactly: widening is exact, narrowing rounds to nearest-even in one
step, overflow gives +-Inf, and a NaN keeps its sign, has its payload truncated (or, widening,
shifted) into the destination's top fraction bits and gets the quiet bit set.

Decoding holds the stored streams and a few float64 or float32 working arrays of the tensor's size
at once: a tensor's peak memory is up to about 16 bytes per element for ``none``, 33 for the other
codecs (on a bfloat16 tensor; 8–25 on float32 ones) and 49 for ``powersgd``
(``PEAK_BYTES_PER_ELEMENT``).

Command line: ``python3 gczread.py FILE.gcz [--verify]`` prints the file's metadata and tensors; an
error (a rejected file, or one that cannot be opened) is one line on stderr and exit status 1, a
usage error exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
import sys
import threading
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

__all__ = ["GczFile", "GczFormatError", "TensorInfo", "StreamInfo", "CodecSpec", "RULES",
           "DECODE_RULES", "LIMIT_RULES", "MAX_SPEC_DEPTH", "MAX_STREAMS", "MAX_NUMBER_CHARS",
           "MAX_DECODE_BYTES", "PEAK_BYTES_PER_ELEMENT",
           "convert_bits", "open_gcz", "parse_spec", "make_spec", "layout",
           "philox4x32_10", "rng_bits", "rng_draw16", "rng_uniform", "tensor_key", "randomk_indices",
           "topk_indices", "sparse_k"]

MAGIC = b"\x89GCZ\r\n\x1a\n"
END_MAGIC = b"\x89GCZEND\n"
HEADER_SIZE = 64
TRAILER_SIZE = 32
ALIGN = 64
MAX_INDEX = 64 * 1024 * 1024
MAX_DEPTH = 512  # arrays and objects nested in the index, at most (FORMAT.md §5)
MAX_NAME = 4096
MAX_DIMS = 32
MAX_NUMEL = 1 << 48
U64_MAX = (1 << 64) - 1
RNG = "philox4x32-10"  # the only random generator of format 1 (FORMAT.md §5.2)
ZSTD_MAX_RATIO = 65536
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
SUPPORTED_MAJOR = 1

# The rules of FORMAT.md §6, in its order.
RULES = (
    "too-small", "bad-magic", "bad-version", "reserved-nonzero", "bad-end-magic", "index-too-large",
    "index-out-of-range", "index-checksum", "index-json", "index-schema", "duplicate-name",
    "bad-dtype", "bad-shape", "unknown-codec", "bad-streams", "bad-encoding", "stream-out-of-range",
    "stream-size", "stream-checksum", "zstd-frame", "bad-stream-data", "nonzero-padding",
)
# The §6 rule found only when a tensor is decoded: a stream whose *content* breaks its codec's
# decoding rules (a Top-K index list that is not strictly ascending, a QSGD scale that is NaN, a
# base-3 byte above 242...). The codec documents list these per codec; gcz names the rule too
# (`gcz verify` decodes every tensor).
DECODE_RULES = ("bad-stream-data",)
# Not a FORMAT.md rule: a valid file holds what this reader cannot hand back (see the module
# docstring: a tensor too large for memory).
LIMIT_RULES = ("reader-limit",)

MAX_SPEC_DEPTH = 64      # value codecs nested in value codecs, at most (CODECS.md, "Value codecs")
MAX_STREAMS = 1024       # streams of a codec, its value codecs' included, at most (the same)
MAX_NUMBER_CHARS = 4096  # characters of a number in a spec string, at most (a limit of this reader)


def _physical_memory() -> Optional[int]:
    """The machine's memory, or where lower the memory limit of this process's cgroup or of one
    above it (cgroup v2's memory.max, v1's memory controller's memory.limit_in_bytes)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not a POSIX system
        return None
    try:
        with open("/proc/self/cgroup") as f:  # "ID:CONTROLLERS:/PATH" lines
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return memory
    places = []
    for _, controllers, group in (entry for entry in lines if len(entry) == 3):
        if controllers == "":
            places.append(("/sys/fs/cgroup", group, "memory.max"))
        elif "memory" in controllers.split(","):
            places.append(("/sys/fs/cgroup/memory", group, "memory.limit_in_bytes"))
    for root, group, name in places:
        parts = [part for part in group.split("/") if part]
        for depth in range(len(parts) + 1):  # the cgroup and every one above it
            try:
                with open(os.path.join(root, *parts[:depth], name)) as f:
                    limit = f.read().strip()
            except OSError:
                continue
            if limit.isdigit():  # "max" (v2) is no limit
                memory = min(memory, int(limit))
    return memory


# The most bytes decoding one tensor may take at its peak (None: no limit), its element count times
# the codec's PEAK_BYTES_PER_ELEMENT; read when a tensor is decoded.
MAX_DECODE_BYTES: Optional[int] = _physical_memory()

# The bytes per element a tensor's decoding takes at its peak, the stored streams and the float32
# and float64 working copies (the most over the four dtypes, measured with tracemalloc on 2^20
# elements, and a tenth more): they weigh the same whatever the dtype, so a bfloat16 tensor's peak
# is 16 times its decoded size where a float64 one's is 3.
PEAK_BYTES_PER_ELEMENT = {"none": 18, "fp32": 36, "fp16": 36, "bf16": 36, "qsgd": 36, "terngrad": 36,
                          "topk": 36, "randomk": 36, "powersgd": 54}


class GczFormatError(ValueError):
    """A `.gcz` file breaks a FORMAT.md §6 rule, or holds what this reader cannot hand back (rule
    ``reader-limit``, LIMIT_RULES); ``.rule`` names it."""

    def __init__(self, rule: str, detail: str, tensor: Optional[str] = None):
        assert rule in RULES or rule in LIMIT_RULES, rule
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


def _f64_round(x: np.ndarray, d: _Fmt) -> np.ndarray:
    """float64 values (no NaN) -> `d` bits, one round-to-nearest-even step; past the range: +-Inf.

    float32 is numpy's (IEEE) conversion. For float16/bfloat16 the value is rounded exactly in
    float64 to a multiple of its unit in the last place in `d` (np.rint: ties to even), which is
    then representable in `d` (or overflows to Inf) and converts exactly: no double rounding."""
    if d.name == "float32":
        return x.astype(np.float32).view(np.uint32)
    emin = 2 - (1 << (d.exp_bits - 1))             # the smallest normal exponent
    _, e = np.frexp(x)                             # |x| = f * 2^e, 0.5 <= f < 1
    q = np.maximum(e - 1, emin) - d.frac_bits      # exponent of one ulp of x in `d`
    r = np.ldexp(np.rint(np.ldexp(x, -q)), q)      # exact power-of-two scalings
    if d.name == "float16":
        return r.astype(np.float16).view(np.uint16)
    return (r.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def convert_bits(u: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Convert an array of `src` bit patterns to `dst` bit patterns by the CODECS.md rules.

    Returns a native-endian unsigned array of the destination's width. Any dtype to any dtype:
    widening is exact, narrowing is one round-to-nearest-even step, NaNs keep their sign, move
    their payload and get the quiet bit.
    """
    s, d = FMTS[src], FMTS[dst]
    shape = np.shape(u)
    u = np.asarray(u).astype(np.dtype(s.uint).newbyteorder("="), copy=False).reshape(-1)
    if s is d:
        return u.copy().reshape(shape)
    nan = _nan_mask(u, s)
    if s.name == "float64":  # narrowing (PowerSGD's float64 sums)
        x = np.where(nan, 0.0, u.view(np.float64))
        with np.errstate(over="ignore"):
            out = np.array(_f64_round(x, d), copy=True)
        if nan.any():
            out[nan] = _nan_bits(u[nan], s, d)
        return out.reshape(shape)
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
# Random numbers (CODECS.md, "Randomness"): Philox4x32-10, vectorized over counters

_PHILOX_M0, _PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_U32 = np.uint64(0xFFFFFFFF)
# Purpose numbers of the draws (CODECS.md, "Randomness").
PURPOSE_QSGD, PURPOSE_TERNGRAD, PURPOSE_RANDOMK, PURPOSE_POWERSGD = 1, 2, 3, 4


def philox4x32_10(counters: np.ndarray, key: Tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of each row (c0, c1, c2, c3) of `counters` under `key` = (k0, k1)."""
    c = np.asarray(counters, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (c[:, j] for j in range(4))
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for _ in range(10):
        p0 = c0 * _PHILOX_M0  # 32 x 32 -> 64-bit product: exact in uint64
        p1 = c2 * _PHILOX_M1
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & _U32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & _U32)
        k0, k1 = (k0 + _PHILOX_W0) & 0xFFFFFFFF, (k1 + _PHILOX_W1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def tensor_key(name: str) -> int:
    """CODECS.md "Randomness": XXH3-64 (seed 0) of the tensor name's UTF-8 bytes."""
    return _xxh3_64(name.encode("utf-8"))


_PHILOX_RUN = 1 << 14  # Philox blocks computed at once by rng_bits


def rng_bits(seed: int, key: int, purpose: int, count: int, start: int = 0, sub: int = 0) -> np.ndarray:
    """32-bit draws start .. start+count-1 of `purpose` for (seed, tensor key): draw i is word
    i mod 4 of Philox4x32-10 at counter (lo32(i//4), hi32(i//4), purpose, sub) under key
    (lo32(k), hi32(k)) with k = seed XOR tensor key (CODECS.md, "Randomness"). Sub-stream 0 gives
    the 32-bit draws; the bytes of sub-streams 0 and 1 are the coarse and fine bytes of draw16."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    k = (seed ^ key) & U64_MAX
    b0, b1 = start // 4, (start + count - 1) // 4 + 1
    words = np.empty((b1 - b0, 4), dtype=np.uint32)
    # In runs of blocks whose uint64 temporaries stay in cache: several times faster on large counts
    # than one pass, and the memory stays that of the result.
    for lo in range(b0, b1, _PHILOX_RUN):
        blocks = np.arange(lo, min(lo + _PHILOX_RUN, b1), dtype=np.uint64)
        ctr = np.empty((len(blocks), 4), dtype=np.uint64)
        ctr[:, 0] = blocks & _U32
        ctr[:, 1] = blocks >> np.uint64(32)
        ctr[:, 2] = purpose
        ctr[:, 3] = sub
        words[lo - b0:lo - b0 + len(blocks)] = philox4x32_10(ctr, (k & 0xFFFFFFFF, k >> 32))
    return words.reshape(-1)[start - 4 * b0:start - 4 * b0 + count]


def rng_draw16(seed: int, key: int, purpose: int, count: int, start: int = 0) -> np.ndarray:
    """16-bit draw i = 256 * coarse + fine: byte i mod 16 (little-endian) of block i // 16 of
    sub-stream 0 and of sub-stream 1, as uint16 (format 1.2)."""
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    w0 = start // 4
    nwords = (start + count - 1) // 4 + 1 - w0
    coarse, fine = (rng_bits(seed, key, purpose, nwords, w0, sub).astype("<u4").view(np.uint8)
                    [start - 4 * w0:start - 4 * w0 + count].astype(np.uint16) for sub in (0, 1))
    return (coarse << np.uint16(8)) | fine


def rng_uniform(seed: int, key: int, purpose: int, count: int, start: int = 0) -> np.ndarray:
    """uniform(i) = (draw16(i) + 0.5) * 2^-16, a float32 in (0, 1) (exact)."""
    d = rng_draw16(seed, key, purpose, count, start)
    return (d.astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -16)


# ----------------------------------------------------------------------------------------------
# Codec specs and parameters (FORMAT.md §5.3; each codec's parameter table in docs/codecs/*.md)


def _bad_param(tensor: Optional[str], msg: str):
    raise GczFormatError("unknown-codec", msg, tensor)


def _show(v: Any, limit: int = 80) -> str:
    """A parameter value for a message (repr), cut short; a value in parentheses keeps them."""
    r = repr(f"({v})" if isinstance(v, _Span) else v)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


class _Span:
    """Characters start .. end-1 of a spec string, and where the ')' that matches each '(' of the
    whole string is. A nested spec is parsed in place from it: the parentheses of a spec string
    are matched once, in one vectorized pass, however deep its value codecs nest."""

    __slots__ = ("text", "start", "end", "_opens", "_closes")

    def __init__(self, text: str, start: int, end: int, opens: np.ndarray, closes: np.ndarray):
        self.text, self.start, self.end, self._opens, self._closes = text, start, end, opens, closes

    @classmethod
    def of(cls, text: str, tensor: Optional[str]) -> "_Span":
        if not text.isascii():  # the grammar is ASCII: an error anyway
            bad = re.search(r"[^\x00-\x7f]", text)
            _bad_param(tensor, f"codec spec {_show(text)}: unexpected character {bad.group()!r} "
                       f"(position {bad.start() + 1})")
        b = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        pos = np.flatnonzero((b == ord("(")) | (b == ord(")")))
        is_open = b[pos] == ord("(")
        depth = np.cumsum(np.where(is_open, 1, -1))
        # A '(' that takes the depth to d is matched by the first ')' after it that takes it back
        # to d - 1. Give both the level d (a ')': the depth before it); among the parentheses of
        # one level, in order, a '(' is followed by its ')', if it has one.
        level = np.where(is_open, depth, depth + 1)
        order = np.argsort(level, kind="stable")      # by level, then by position
        lv, op, ps = level[order], is_open[order], pos[order]
        matched = np.zeros(len(pos), dtype=bool)
        matched[:-1] = op[:-1] & ~op[1:] & (lv[:-1] == lv[1:])
        closes = np.full(len(pos), -1, dtype=np.int64)
        closes[order[matched]] = ps[1:][matched[:-1]]
        return cls(text, 0, len(text), pos[is_open], closes[is_open])

    def sub(self, start: int, end: int) -> "_Span":
        return _Span(self.text, start, end, self._opens, self._closes)

    def close(self, pos: int) -> int:
        """Where the ')' matching the '(' at `pos` is; -1: none."""
        return int(self._closes[np.searchsorted(self._opens, pos)])

    def __str__(self) -> str:
        return self.text[self.start:self.end]


class _Group(str):
    """A parameter value parse_spec found in parentheses: the text between them, marked as such
    (gcz reads it as a word, never as a number), with where it lies in its spec string."""
    span: _Span


_SPEC_NAME = re.compile(r"[a-z0-9_]+")
_SPEC_KEY = re.compile(r"([a-z0-9_]+)=")
_SPEC_WORD = re.compile(r"[A-Za-z0-9_.-]+")


def _parse_stage(span: _Span, tensor: Optional[str]) -> Tuple[str, Dict[str, Any]]:
    """parse_spec on a span: a value in parentheses comes back as a _Span (not copied)."""
    text, start, end = span.text, span.start, span.end

    def fail(what: str, pos: int):
        _bad_param(tensor, f"codec spec {_show(str(span))}: {what} (position {pos - start + 1})")

    m = _SPEC_NAME.match(text, start, end)
    if not m:
        fail("expected a codec name", start)
    name, pos, params = m.group(0), m.end(), {}
    if pos < end:
        if text[pos] != ":":
            fail("a value codec is one stage" if text[pos] == "+" else "expected ':'", pos)
        pos += 1
        while True:
            m = _SPEC_KEY.match(text, pos, end)
            if not m:
                fail("expected key=value", pos)
            key, pos = m.group(1), m.end()
            if pos < end and text[pos] == "(":
                close = span.close(pos)
                if not pos < close < end:
                    fail("unbalanced parentheses", pos)
                value, pos = span.sub(pos + 1, close), close + 1
            else:
                m = _SPEC_WORD.match(text, pos, end)
                if not m:
                    fail("empty value", pos)
                value, pos = m.group(0), m.end()
            if key in params:
                fail(f"parameter {key!r} given twice", pos)
            params[key] = value
            if pos == end:
                break
            if text[pos] != ",":
                fail("a value codec is one stage" if text[pos] == "+" else "expected ','", pos)
            pos += 1
    return name, params


def parse_spec(text: str, tensor: Optional[str] = None) -> Tuple[str, Dict[str, str]]:
    """Split a one-stage spec string ``name[:key=value,...]`` into its name and raw string values.

    The grammar is docs/CLI.md's ("Codec specs", which FORMAT.md §5.3 refers to), read as gcz reads
    it: a value is a bare word (``max``, ``128``, ``0.01``, ``1e20``, ``9.9999999999999995e-08``) or
    anything in balanced parentheses, returned without them (as a str marked as having had them): a
    nested spec (``values=(qsgd:bits=8,...)``). gcz takes a parenthesised value for a word, never
    for a number: ``values=(fp16)`` and ``scale=(max)`` are valid, ``clip=(2.5)`` and ``bits=(8)``
    are not (make_spec rejects them). gcz writes numbers without a ``+`` (``clip=1e20``)."""
    name, params = _parse_stage(_Span.of(text, tensor), tensor)
    out: Dict[str, str] = {}
    for k, v in params.items():
        if isinstance(v, _Span):
            g = _Group(str(v))
            g.span = v
            v = g
        out[k] = v
    return name, out


@dataclass(frozen=True)
class CodecSpec:
    """An element codec with validated parameters (defaults filled in); a value-codec parameter
    (``values``, ``factors``, ``fallback``) holds a nested CodecSpec."""
    name: str
    params: Dict[str, Any]


# A decimal number (docs/CLI.md, "Codec specs": a hex float, inf and nan are words for gcz too).
# Unambiguous: a string matches in one way only, so a failed match does not backtrack (linear time).
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_DIGITS = re.compile(r"[0-9]+")
_MIN_NORMAL = 2.2250738585072014e-308
INT64_MAX = (1 << 63) - 1


def _spec_number(s: str) -> Optional[float]:
    """A number written in a spec string, as gcz reads it: C strtod on a decimal literal, and a value
    that overflows, or underflows (a subnormal or 0 that the literal is not exactly), is not a number
    (strtod sets ERANGE, and gcz then keeps the word as a string). None: not a number."""
    if len(s) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(s):
        return None
    x = float(s)
    if math.isinf(x):
        return None
    if abs(x) < _MIN_NORMAL:
        mantissa = re.split("[eE]", s)[0]
        exact = (not re.search("[1-9]", mantissa)) if x == 0.0 else Decimal(s) == Decimal(x)
        if not exact:
            return None
    return x


class _Params:
    """Typed access to a codec's parameters, from the index (JSON values) or from a spec string
    (strings; _Span for a value in parentheses); every problem is an `unknown-codec` error, as
    FORMAT.md §6 says. `depth`: how deep in value codecs this codec is (0: the element codec)."""

    def __init__(self, codec: str, raw: Dict[str, Any], from_string: bool, tensor: Optional[str],
                 depth: int = 0):
        self.codec, self.from_string, self.tensor, self.depth = codec, from_string, tensor, depth
        self.raw = {k: v.span if isinstance(v, _Group) else v for k, v in raw.items()}
        self.used: set = set()

    def fail(self, msg: str):
        _bad_param(self.tensor, f"codec {self.codec!r}: {msg}")

    def has(self, key: str) -> bool:
        return key in self.raw

    def _get(self, key: str):
        self.used.add(key)
        return self.raw[key]

    def _check_length(self, key: str, v: str) -> None:
        if len(v) > MAX_NUMBER_CHARS:
            self.fail(f"parameter {key!r} has {len(v)} characters, more than a number may have "
                      f"here ({MAX_NUMBER_CHARS}: MAX_NUMBER_CHARS, a limit of this reader)")

    def int(self, key: str, default: Optional[int], lo: int, hi: int = U64_MAX) -> Optional[int]:
        if key not in self.raw:
            return default
        v = self._get(key)
        if self.from_string and type(v) is str:
            self._check_length(key, v)
            if _DIGITS.fullmatch(v):
                v = int(v)
                if v > INT64_MAX:  # gcz reads an integer as a C long long (strtoll), else a float
                    self.fail(f"parameter {key!r} must be an integer of at most 2^63 - 1, got {v}")
        if type(v) is not int:
            self.fail(f"parameter {key!r} must be an integer, got {_show(v)}")
        if not lo <= v <= hi:
            self.fail(f"parameter {key!r} must be {lo}..{hi}, got {_show(v)}")
        return v

    def num(self, key: str, default: Optional[float], lo: float, hi: float = math.inf,
            lo_open: bool = False) -> Optional[float]:
        if key not in self.raw:
            return default
        v = self._get(key)
        if self.from_string and type(v) is str:
            self._check_length(key, v)
            x = _spec_number(v)
            if x is None:
                why = (" (beyond float64: it overflows or underflows)" if _NUMBER.fullmatch(v)
                       else "")
                self.fail(f"parameter {key!r} must be a number, got {_show(v)}{why}")
            v = x
        if type(v) not in (int, float):
            self.fail(f"parameter {key!r} must be a number, got {_show(v)}")
        try:
            x = float(v)
        except OverflowError:  # an integer beyond float64
            x = math.inf
        if not (math.isfinite(x) and (lo < x if lo_open else lo <= x) and x <= hi):
            self.fail(f"parameter {key!r} = {_show(v)} is out of range")
        return x

    def word(self, key: str, default: str, choices: Tuple[str, ...]) -> str:
        if key not in self.raw:
            return default
        v = self._get(key)
        if isinstance(v, _Span):  # gcz takes a word in parentheses as the word
            v = str(v)
        if v not in choices:
            self.fail(f"parameter {key!r} must be one of {', '.join(choices)}, got {_show(v)}")
        return v

    def spec(self, key: str, default: str) -> CodecSpec:
        v = self._get(key) if key in self.raw else default
        if self.depth >= MAX_SPEC_DEPTH:
            self.fail(f"parameter {key!r}: value codecs nest more than {MAX_SPEC_DEPTH} deep "
                      "(CODECS.md, \"Value codecs\")")
        if isinstance(v, str):
            v = _Span.of(v, self.tensor)
        elif not isinstance(v, _Span):
            self.fail(f"parameter {key!r} must be a codec spec string, got {_show(v)}")
        name, raw = _parse_stage(v, self.tensor)
        return _make_spec(name, raw, True, self.tensor, self.depth + 1)

    def done(self, params: Dict[str, Any]) -> Dict[str, Any]:
        extra = sorted(set(self.raw) - self.used)
        if extra:
            self.fail(f"has no parameter {extra[0]!r}")
        return params


def _sparse_k_params(p: _Params) -> Dict[str, Any]:
    """`ratio` or `k` (topk.md "k", shared by randomk.md)."""
    if p.has("ratio") and p.has("k"):
        p.fail("give 'ratio' or 'k', not both")
    if p.has("k"):
        return {"k": p.int("k", None, 1)}
    return {"ratio": p.num("ratio", 0.01, 0.0, 1.0, lo_open=True)}


def _value_spec(p: _Params, key: str, default: str, no_powersgd: bool = False) -> CodecSpec:
    s = p.spec(key, default)
    if no_powersgd and s.name == "powersgd":
        p.fail(f"{key}={s.name!r}: the fallback cannot be powersgd itself")
    return s


def _params_none(p: _Params) -> Dict[str, Any]:
    return p.done({})


def _params_qsgd(p: _Params) -> Dict[str, Any]:  # qsgd.md, parameter table
    return p.done({
        "bits": p.int("bits", 8, 2, 8),
        "group": p.int("group", 128, 1, 1 << 24),
        "scale": p.word("scale", "max", ("max", "l2")),
        "rounding": p.word("rounding", "stochastic", ("stochastic", "nearest")),
        "scale_dtype": p.word("scale_dtype", "fp32", ("fp32", "fp16", "bf16")),
    })


def _params_terngrad(p: _Params) -> Dict[str, Any]:  # terngrad.md, parameter table
    out = {
        "clip": p.num("clip", 2.5, 0.0),
        "scale": p.word("scale", "tensor", ("tensor", "group")),
        "rounding": p.word("rounding", "stochastic", ("stochastic", "deterministic")),
        "packing": p.word("packing", "base3", ("base3", "2bit")),
    }
    if out["scale"] == "group":
        out["group"] = p.int("group", 128, 1, 1 << 24)
    elif p.has("group"):
        p.fail("parameter 'group' applies only with scale=group")
    return p.done(out)


def _params_topk(p: _Params) -> Dict[str, Any]:  # topk.md, parameter table
    out = _sparse_k_params(p)
    out["values"] = _value_spec(p, "values", "fp32")
    return p.done(out)


def _params_randomk(p: _Params) -> Dict[str, Any]:  # randomk.md, parameter table
    out = _sparse_k_params(p)
    out["scale"] = p.word("scale", "none", ("none", "unbiased"))
    out["values"] = _value_spec(p, "values", "fp32")
    return p.done(out)


def _params_powersgd(p: _Params) -> Dict[str, Any]:  # powersgd.md, parameter table
    return p.done({
        "rank": p.int("rank", 4, 1, 1024),
        "iters": p.int("iters", 1, 1, 64),
        "view": p.word("view", "first", ("first", "last")),
        "factors": _value_spec(p, "factors", "fp32"),
        "min_rate": p.num("min_rate", 2.0, 1.0),
        "fallback": _value_spec(p, "fallback", "fp16", no_powersgd=True),
    })


def make_spec(name: str, raw: Dict[str, Any], from_string: bool = False,
              tensor: Optional[str] = None) -> CodecSpec:
    """Validate an element codec and its parameters (from the index, or a spec string parsed by
    parse_spec)."""
    return _make_spec(name, raw, from_string, tensor, 0)


def _make_spec(name: str, raw: Dict[str, Any], from_string: bool, tensor: Optional[str],
               depth: int) -> CodecSpec:
    codec = CODECS.get(name)
    if codec is None:
        _bad_param(tensor, f"unknown element codec {_show(name)}")
    spec = CodecSpec(name, codec.params(_Params(name, raw, from_string, tensor, depth)))
    n = _stream_count(spec)
    if n > MAX_STREAMS:
        _bad_param(tensor, f"codec {name!r} with its value codecs writes {n} streams, more than "
                   f"{MAX_STREAMS} (CODECS.md, \"Value codecs\")")
    return spec


def _first_names(streams: List[Any], most: int = 16) -> str:
    """The streams' names for a message: the first `most`, and how many in all."""
    shown = repr([s.name for s in streams[:most]])
    return shown if len(streams) <= most else f"{shown[:-1]}, ... ({len(streams)} in all)]"


def _stream_count(spec: CodecSpec) -> int:
    """How many streams `spec` writes, whatever the tensor (layout() names them)."""
    p = spec.params
    if spec.name == "topk":
        return 1 + _stream_count(p["values"])  # indices, values.*
    if spec.name == "randomk":
        return _stream_count(p["values"])
    if spec.name == "powersgd":
        return 2 * _stream_count(p["factors"])  # p.*, q.*
    return 1 if spec.name in CAST_CODECS else 2  # values; codes or trits, and scales


# ----------------------------------------------------------------------------------------------
# Stream layouts: the streams each codec writes, in order, and their sizes


@dataclass(frozen=True)
class _Stream:
    name: str
    size: int
    exact: bool = True  # False: `size` is an upper bound (Top-K's indices)


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _prefixed(prefix: str, streams: List[_Stream]) -> List[_Stream]:
    return [_Stream(prefix + s.name, s.size, s.exact) for s in streams]


def _layout_cast(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    stored = FMTS[CAST_CODECS[spec.name] or dtype]
    return [_Stream("values", _numel(shape) * stored.itemsize)]


def _layout_qsgd(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    n, p = _numel(shape), spec.params
    scale_bytes = 4 if p["scale_dtype"] == "fp32" else 2
    return [_Stream("codes", _ceil_div(n * p["bits"], 8)),
            _Stream("scales", _ceil_div(n, p["group"]) * scale_bytes)]


def _layout_terngrad(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    n, p = _numel(shape), spec.params
    trits = _ceil_div(n, 5 if p["packing"] == "base3" else 4)
    scales = (4 if n else 0) if p["scale"] == "tensor" else _ceil_div(n, p["group"]) * 4
    return [_Stream("trits", trits), _Stream("scales", scales)]


def sparse_k(params: Dict[str, Any], n: int) -> int:
    """topk.md "k" (also randomk.md): min(n, max(1, floor(ratio * n))) with one float64
    multiplication, or min(n, K); 0 for an empty tensor."""
    if n == 0:
        return 0
    if "k" in params:
        return min(n, params["k"])
    return min(n, max(1, math.floor(params["ratio"] * float(n))))


def _leb128_len(v: int) -> int:
    return max(1, _ceil_div(v.bit_length(), 7))


def _layout_topk(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    n = _numel(shape)
    k = sparse_k(spec.params, n)
    bound = 1 + min(k * _leb128_len(n), _ceil_div(n, 8)) if n else 0
    return [_Stream("indices", bound, exact=False)] + _prefixed(
        "values.", layout(spec.params["values"], "float32", (k,), tensor))


def _layout_randomk(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    k = sparse_k(spec.params, _numel(shape))
    return _prefixed("values.", layout(spec.params["values"], "float32", (k,), tensor))


def powersgd_matrix(spec: CodecSpec, dtype: str, shape: Tuple[int, ...],
                    tensor: Optional[str] = None) -> Tuple[int, int, int]:
    """(n, m, r) of the matrix view (powersgd.md, `view`), after checking the tensor is eligible
    (powersgd.md, "Fallback (planning)"); an ineligible tensor is an error (gcz: `stream-size`)."""
    p = spec.params
    r = p["rank"]
    if len(shape) < 2:
        why = "it has fewer than 2 dimensions"
        n = m = 0
    else:
        if p["view"] == "first":
            n, m = shape[0], _numel(shape[1:])
        else:
            n, m = _numel(shape[:-1]), shape[-1]
        lhs = float(r) * float(n + m) * 4.0
        rhs = float(n) * float(m) * float(FMTS[dtype].itemsize) / p["min_rate"]
        if n > 2 ** 31 - 1 or m > 2 ** 31 - 1:
            why = f"its {n} x {m} matrix has a dimension above 2^31 - 1"
        elif lhs >= rhs:
            why = (f"rank-{r} factors of its {n} x {m} matrix would not make it "
                   f"min_rate={p['min_rate']:g} times smaller")
        else:
            return n, m, r
    raise GczFormatError("stream-size", f"codec 'powersgd' does not take shape {list(shape)}: "
                         f"{why}; such tensors are encoded with its fallback", tensor)


def _layout_powersgd(spec: CodecSpec, dtype: str, shape, tensor) -> List[_Stream]:
    n, m, r = powersgd_matrix(spec, dtype, shape, tensor)
    f = spec.params["factors"]
    return (_prefixed("p.", layout(f, "float32", (n, r), tensor))
            + _prefixed("q.", layout(f, "float32", (m, r), tensor)))


def layout(spec: CodecSpec, dtype: str, shape: Tuple[int, ...],
           tensor: Optional[str] = None) -> List[_Stream]:
    """The streams `spec` writes for a tensor of `dtype` and `shape`, in order, with sizes."""
    return CODECS[spec.name].layout(spec, dtype, tuple(shape), tensor)


# ----------------------------------------------------------------------------------------------
# Decoders. Each returns (format, bits): the decoded elements, flat, as bit patterns of `format`;
# the caller converts them to the tensor's dtype (round to nearest even, CODECS.md).


@dataclass(frozen=True)
class _Ctx:
    """What a decoder may use: the tensor's seed and key, and its streams (under `prefix`)."""
    tensor: str
    seed: int
    key: int
    read: Any  # callable: full stream name -> bytes
    prefix: str = ""
    codec: str = ""

    def stream(self, name: str) -> np.ndarray:
        return np.frombuffer(self.read(self.prefix + name), dtype=np.uint8)

    def inner(self, param: str) -> "_Ctx":
        """A value codec's context: key XOR XXH3-64(param name), streams prefixed `param.`."""
        return _Ctx(self.tensor, self.seed, self.key ^ _xxh3_64(param.encode("utf-8")), self.read,
                    self.prefix + param + ".")

    def fail(self, stream: str, msg: str, doc: str):
        raise GczFormatError("bad-stream-data", f"{self.codec}: stream {self.prefix + stream!r}: "
                             f"{msg} ({doc})", self.tensor)


def decode(spec: CodecSpec, dtype: str, shape: Tuple[int, ...],
           ctx: _Ctx) -> Tuple[str, np.ndarray]:
    """Decode the streams of codec `spec` for a tensor of `dtype` and `shape`: (format, bits)."""
    return CODECS[spec.name].decode(spec, dtype, tuple(shape), replace(ctx, codec=spec.name))


def decode_values(spec: CodecSpec, shape: Tuple[int, ...], ctx: _Ctx) -> np.ndarray:
    """A value codec's decoding of a float32 tensor of `shape` (CODECS.md, "Value codecs")."""
    fmt, bits = decode(spec, "float32", shape, ctx)
    return convert_bits(bits, fmt, "float32").view(np.float32).reshape(shape)


def _decode_cast(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """CODECS.md "Cast codecs": the stored values, converted by the caller."""
    stored = FMTS[CAST_CODECS[spec.name] or dtype]
    return stored.name, ctx.stream("values").view(stored.uint)


def _checked_scales(ctx: _Ctx, raw: np.ndarray, scale_dtype: str, doc: str) -> np.ndarray:
    """float32 scales (float16/bfloat16 ones widened exactly); negative, NaN or Inf is an error."""
    if scale_dtype == "fp32":
        s = raw.view("<f4").astype(np.float32)
    elif scale_dtype == "fp16":
        s = raw.view("<f2").astype(np.float32)
    else:
        s = (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    bad = ~np.isfinite(s) | (s < 0)
    if bad.any():
        g = int(np.flatnonzero(bad)[0])
        ctx.fail("scales", f"scale {g} is {float(s[g])!r}: a scale must be finite and >= 0", doc)
    return s


def unpack_codes(data: np.ndarray, n: int, bits: int) -> np.ndarray:
    """qsgd.md "Streams": code i in bits i*B .. i*B+B-1 of the stream, LSB first."""
    if bits == 8:
        return data[:n].astype(np.uint16)
    # Eight codes fill `bits` bytes: each such run is read as one little-endian integer and cut into
    # its eight codes (one pass per byte and per code, not a gather per code).
    runs = -(-n // 8)
    buf = np.zeros(runs * bits, dtype=np.uint8)
    used = min(len(data), runs * bits)
    buf[:used] = data[:used]
    by_run = buf.reshape(runs, bits)
    word = np.zeros(runs, dtype=np.uint64)
    for j in range(bits):
        word |= by_run[:, j].astype(np.uint64) << np.uint64(8 * j)
    codes = np.empty((runs, 8), dtype=np.uint16)
    for j in range(8):
        codes[:, j] = (word >> np.uint64(bits * j)) & np.uint64((1 << bits) - 1)
    return codes.reshape(-1)[:n]


def _decode_qsgd(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """docs/codecs/qsgd.md, "Decoding" (stream layout: "Streams")."""
    p, n = spec.params, _numel(shape)
    B, G = p["bits"], p["group"]
    s = (1 << (B - 1)) - 1
    codes_raw = ctx.stream("codes")
    if (n * B) % 8 and codes_raw[-1] >> ((n * B) % 8):
        ctx.fail("codes", "the last byte has a nonzero unused bit", "qsgd.md, Decoding")
    S = _checked_scales(ctx, ctx.stream("scales"), p["scale_dtype"], "qsgd.md, Decoding")
    codes = unpack_codes(codes_raw, n, B)
    level = codes & np.uint16(s)
    step = S / np.float32(s)  # float32 division, once per group
    mag = level.astype(np.float32)
    whole = n // G * G  # the whole groups, as rows of G; then the last, partial one
    with np.errstate(over="ignore"):  # level * step is computed for level = s too, then replaced
        mag[:whole].reshape(-1, G)[...] *= step[:whole // G, None]
        mag[whole:] *= step[whole // G:][:1]
    top = level == s
    np.copyto(mag[:whole].reshape(-1, G), S[:whole // G, None], where=top[:whole].reshape(-1, G))
    np.copyto(mag[whole:], S[whole // G:][:1], where=top[whole:])
    bits = mag.view(np.uint32)  # x̂ = -mag where the sign bit is set: the float's sign bit flipped
    bits ^= (codes >> np.uint16(B - 1)).astype(np.uint32) << np.uint32(31)  # (-0 scale: mag is -0)
    return "float32", bits


def unpack_trits(data: np.ndarray, n: int, packing: str, ctx: Optional[_Ctx] = None) -> np.ndarray:
    """terngrad.md "Streams": base3 (5 trits a byte, t0 + 3 t1 + ... + 81 t4) or 2bit (4 a byte)."""
    def fail(msg):
        if ctx is None:
            raise ValueError(msg)
        ctx.fail("trits", msg, "terngrad.md, Decoding")
    if packing == "base3":
        if (data > 242).any():
            fail(f"byte {int(np.flatnonzero(data > 242)[0])} is above 242")
        t = np.empty((len(data), 5), dtype=np.uint8)
        v = data.copy()
        for k in range(5):
            t[:, k], v = v % 3, v // 3
    else:
        t = np.stack([(data >> np.uint8(2 * k)) & np.uint8(3) for k in range(4)], axis=1)
        if (t == 3).any():
            fail(f"element {int(np.flatnonzero(t.reshape(-1) == 3)[0])} has the invalid code 3")
    t = t.reshape(-1)
    if t[n:].any():
        fail("a place past the end of the tensor holds a nonzero trit")
    return t[:n]


def _decode_terngrad(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """docs/codecs/terngrad.md, "Decoding" (stream layout: "Streams")."""
    p, n = spec.params, _numel(shape)
    trits = unpack_trits(ctx.stream("trits"), n, p["packing"], ctx)
    S = _checked_scales(ctx, ctx.stream("scales"), "fp32", "terngrad.md, Decoding")
    if p["scale"] == "tensor":
        s = np.broadcast_to(S[:1], (n,)) if n else S
    else:
        s = S[np.arange(n, dtype=np.int64) // p["group"]]
    x = np.where(trits == 1, s, np.where(trits == 2, -s, np.float32(0))).astype(np.float32)
    return "float32", x.view(np.uint32)


def topk_indices(data: np.ndarray, n: int, k: int, ctx: Optional[_Ctx] = None) -> np.ndarray:
    """Decode and check a Top-K `indices` stream (topk.md, "Stream indices", rules 1-11): the k
    kept indices, strictly ascending. A hostile stream is a GczFormatError (ValueError without
    ctx), never garbage."""
    doc = "topk.md, Stream indices"

    def fail(rule: int, msg: str):
        if ctx is None:
            raise ValueError(f"{msg} (rule {rule})")
        ctx.fail("indices", msg, f"{doc}, rule {rule}")

    bound = 1 + min(k * _leb128_len(n), _ceil_div(n, 8)) if n else 0
    if len(data) > bound:
        fail(1, f"{len(data)} bytes, more than the bound {bound}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if len(data) == 0:
        fail(2, "missing its tag byte")
    tag, body = int(data[0]), data[1:]
    if tag == 1:  # bitmap
        if len(body) != _ceil_div(n, 8):
            fail(9, f"a bitmap body of {len(body)} bytes, not ceil(n/8) = {_ceil_div(n, 8)}")
        bitmap = np.unpackbits(body, bitorder="little")
        if bitmap[n:].any():
            fail(10, f"the bitmap sets a bit for an index >= n = {n}")
        idx = np.flatnonzero(bitmap)
        if len(idx) != k:
            fail(11, f"the bitmap sets {len(idx)} bits, expected k = {k}")
        return idx.astype(np.int64)
    if tag != 0:
        fail(3, f"unknown encoding tag {tag} (0 = varint, 1 = bitmap)")
    # Varint body, checked as a sequential decoder would: the first bad varint is reported.
    ends = np.flatnonzero(body < 0x80)            # the last byte of each complete varint
    truncated = len(body) > 0 and bool(body[-1] & 0x80)
    m = min(len(ends), k)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)[:m]
    ends = ends[:m]
    lengths = ends - starts + 1
    last = body[ends]
    overlong = (lengths > 10) | ((lengths == 10) & (last > 1)) | ((lengths > 1) & (last == 0))
    used = body[:int(ends[-1]) + 1] if m else body[:0]
    place = np.arange(len(used), dtype=np.int64) - np.repeat(starts, lengths)
    shift = np.minimum(place, 9).astype(np.uint64) * np.uint64(7)
    groups = (used.astype(np.uint64) & np.uint64(0x7F)) << shift
    deltas = np.add.reduceat(groups, starts) if m else groups  # disjoint bits: sum = value
    deltas[overlong] = 1
    # Every delta is checked <= n (<= 2^48) first, so the running sum can wrap around 2^64 only
    # after passing n; "strictly ascending and <= n" is therefore exact.
    big = deltas > np.uint64(n)
    idx = np.cumsum(np.where(big, np.uint64(1), deltas), dtype=np.uint64)
    out = big | (idx > np.uint64(n))
    out[1:] |= idx[1:] <= idx[:-1]
    for j in np.flatnonzero(overlong | (deltas == 0) | out)[:1]:
        at = int(starts[j]) + 1
        if overlong[j]:
            fail(5, f"overlong varint at byte {at} (over 64 bits, or a redundant final 0x00)")
        if deltas[j] == 0:
            fail(6, f"delta 0 at byte {at}: indices must be strictly ascending")
        fail(7, f"index out of range at byte {at} (n = {n})")
    if m < k:
        if truncated:
            fail(4, f"truncated varint at byte {int(ends[m - 1]) + 2 if m else 1}")  # where it starts
        fail(8, f"holds {m} indices, expected k = {k}")
    if (int(ends[-1]) + 1 if m else 0) != len(body):
        fail(8, f"bytes left after {k} indices")
    return idx.astype(np.int64) - 1


def _scatter(n: int, idx: np.ndarray, w: np.ndarray):
    x = np.zeros(n, dtype=np.float32)  # +0 for every element not kept
    x[idx] = w
    return "float32", x.view(np.uint32)


def _decode_topk(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """docs/codecs/topk.md, "Decoding": x = 0 except x[i_j] = w_j."""
    n = _numel(shape)
    k = sparse_k(spec.params, n)
    idx = topk_indices(ctx.stream("indices"), n, k, ctx)
    w = decode_values(spec.params["values"], (k,), ctx.inner("values"))
    return _scatter(n, idx, w)


def randomk_indices(seed: int, key: int, n: int, k: int) -> np.ndarray:
    """randomk.md "Selection": the k indices with the smallest 32-bit keys bits(i) of purpose 3,
    ties to the lower index, in ascending order."""
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    return _smallest_k(rng_bits(seed, key, PURPOSE_RANDOMK, n), k)


def _smallest_k(keys: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k smallest of `keys` (1 <= k <= len(keys)), ties to the lower index, in
    ascending order: np.sort(np.lexsort((np.arange(n), keys))[:k]), in O(n) rather than a sort.
    Every key below the k-th smallest t is kept, and as many of those equal to t as fill k, the
    lowest indices first."""
    t = np.partition(keys, k - 1)[k - 1]
    keep = keys < t
    ties = np.flatnonzero(keys == t)
    keep[ties[:k - int(np.count_nonzero(keep))]] = True
    return np.flatnonzero(keep).astype(np.int64)


def _decode_randomk(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """docs/codecs/randomk.md, "Decoding": indices redrawn from (seed, tensor key)."""
    n = _numel(shape)
    k = sparse_k(spec.params, n)
    idx = randomk_indices(ctx.seed, ctx.key, n, k)
    w = decode_values(spec.params["values"], (k,), ctx.inner("values"))
    return _scatter(n, idx, w)


def _decode_powersgd(spec: CodecSpec, dtype: str, shape, ctx: _Ctx):
    """docs/codecs/powersgd.md, "Decoding": x[i*m + j] = sum_c P[i][c] * Q[j][c], exact products
    summed in float64 from +0 in the order c = 0..r-1, rounded once (by the caller) to the dtype."""
    n, m, r = powersgd_matrix(spec, dtype, shape, ctx.tensor)
    f = spec.params["factors"]
    with np.errstate(invalid="ignore"):  # a signalling NaN factor is quietened, as in gcz
        P = decode_values(f, (n, r), ctx.inner("p")).astype(np.float64)
        Q = decode_values(f, (m, r), ctx.inner("q")).astype(np.float64)
    # A block of rows at a time (about 512 KiB of float64), so that its r passes stay in cache and no
    # n x m temporary is made per rank: the same sums in the same order as a whole-matrix loop.
    acc = np.empty((n, m), dtype=np.float64)
    rows = max(1, (1 << 16) // max(m, 1))
    term = np.empty((min(rows, n), m), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for a in range(0, n, rows):
            block, t = acc[a:a + rows], term[:min(rows, n - a)]
            block.fill(0.0)
            for c in range(r):
                np.multiply(P[a:a + rows, c, None], Q[None, :, c], out=t)
                block += t
    acc[np.isnan(acc)] = np.nan  # the default quiet NaN, whichever NaN the sums made
    return "float64", acc.reshape(-1).view(np.uint64)


@dataclass(frozen=True)
class _CodecDef:
    params: Any
    layout: Any
    decode: Any


CODECS: Dict[str, _CodecDef] = {
    **{name: _CodecDef(_params_none, _layout_cast, _decode_cast) for name in CAST_CODECS},
    "qsgd": _CodecDef(_params_qsgd, _layout_qsgd, _decode_qsgd),
    "terngrad": _CodecDef(_params_terngrad, _layout_terngrad, _decode_terngrad),
    "topk": _CodecDef(_params_topk, _layout_topk, _decode_topk),
    "randomk": _CodecDef(_params_randomk, _layout_randomk, _decode_randomk),
    "powersgd": _CodecDef(_params_powersgd, _layout_powersgd, _decode_powersgd),
}


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
    spec: Optional[CodecSpec] = field(default=None, compare=False, repr=False)  # codec[0], checked

    def __hash__(self) -> int:  # the codec chain holds dicts: hashed by the fields that are not
        return hash((self.name, self.dtype, self.shape, self.seed, self.rng, self.streams))

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
    def stored_dtype(self) -> Optional[str]:
        """The dtype a cast codec stores; None for the other codecs."""
        if self.element_codec not in CAST_CODECS:
            return None
        return CAST_CODECS[self.element_codec] or self.dtype

    @property
    def codec_spec(self) -> str:
        """The chain written as one spec string in the syntax of ``gcz encode -c`` (docs/CLI.md), every
        parameter given (``gcz info`` shows the codecs' names alone), e.g. ``fp16+zstd:level=3``,
        ``terngrad:clip=1e20,...``, ``topk:ratio=0.01,values=fp16``,
        ``topk:ratio=0.01,values=(qsgd:bits=8,group=128,...)+zstd:level=3``."""
        parts = []
        for st in self.codec:
            params = ",".join(f"{k}={_spec_value(v)}" for k, v in st["params"].items())
            parts.append(st["name"] + (":" + params if params else ""))
        return "+".join(parts)

    @property
    def stored_bytes(self) -> int:
        return sum(s.length for s in self.streams)


def _spec_value(v: Any) -> str:
    """A parameter value as gcz writes it in a spec string: an integer in decimal; a number in the
    shortest %g form that reads back exactly, without the '+' of an exponent ('+' separates stages:
    ``1e20``, ``1e-05``, ``0.01``, ``2.5``); a string as it is, in parentheses if it holds one of
    ``:+,=()`` (a nested spec)."""
    if type(v) is float:
        for precision in range(1, 18):
            text = "%.*g" % (precision, v)
            if float(text) == v:
                break
        return text.replace("e+", "e")
    if isinstance(v, str):
        return f"({v})" if any(c in v for c in ":+,=()") else v
    return str(v)


_HEX16 = re.compile(r"[0-9a-f]{16}\Z")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _is_uint(v: Any) -> bool:
    return type(v) is int and 0 <= v <= U64_MAX


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """FORMAT.md §5: an object with a key twice is refused (JSON leaves which one counts open)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"an object of the index has the key {twice!r} twice")
    return obj


def _check_values(obj: Any) -> None:
    """Reject strings that cannot be UTF-8 (lone surrogates written as \\uD800 escapes), numbers
    beyond float64 (gcz reads a JSON number as a float64 or a 64-bit integer), and arrays and objects
    nested more than MAX_DEPTH deep. Depth first, holding one iterator per level."""
    def members(o: Any):
        if isinstance(o, dict):
            for k in o:
                k.encode("utf-8")
            return iter(o.values())
        return iter(o)

    if not isinstance(obj, (dict, list)):
        return  # refused later: the index is no object
    stack = [members(obj)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, (dict, list)):
                if len(stack) + 1 > MAX_DEPTH:
                    raise _TooDeep()
                stack.append(members(v))
                break
            if isinstance(v, str):
                v.encode("utf-8")
            elif type(v) is float:
                if math.isinf(v):  # json reads a number beyond float64, such as 1e400, as +-inf
                    raise ValueError("a number is beyond float64")
            elif type(v) is int and not -(1 << 63) <= v <= U64_MAX:
                try:
                    float(v)  # read as a float64 (rounded), if it is one
                except OverflowError:
                    raise ValueError(f"the integer {str(v)[:20]}... is beyond float64") from None
        else:
            stack.pop()


class _TooDeep(ValueError):
    pass


_RECURSION_LIMIT = threading.Lock()  # _parse_index raises the process's recursion limit for a while


def _parse_index(raw: bytes) -> Dict[str, Any]:
    # json's parser recurses once per level of nesting, counted against Python's recursion limit (to
    # 3.11) together with the caller's frames: the limit is raised so that MAX_DEPTH levels always fit.
    frames, f = 0, sys._getframe()
    while f is not None:
        frames, f = frames + 1, f.f_back
    needed = frames + MAX_DEPTH + 100
    with _RECURSION_LIMIT:
        limit = sys.getrecursionlimit()
        if limit >= needed:
            return _parse_index_text(raw)
        sys.setrecursionlimit(needed)
        try:
            return _parse_index_text(raw)
        finally:
            if sys.getrecursionlimit() == needed:  # unless another thread has set its own meanwhile
                sys.setrecursionlimit(limit)


def _parse_index_text(raw: bytes) -> Dict[str, Any]:
    try:
        if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM is tolerated (as gcz does)
            raw = raw[3:]
        text = raw.decode("utf-8")  # strict: invalid UTF-8 is rejected
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
        _check_values(obj)
    except (_TooDeep, RecursionError):
        raise GczFormatError("index-json",
                             f"arrays and objects in the index nest more than {MAX_DEPTH} deep") from None
    except (ValueError, UnicodeError) as e:
        raise GczFormatError("index-json", f"the index is not valid UTF-8 JSON ({e})") from None
    except MemoryError:  # an index of millions of small values takes many times its size to hold
        raise GczFormatError("reader-limit", f"out of memory reading the index ({len(raw)} bytes of JSON)") from None
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


def _validate_chain(chain: List[Any], tname: str) -> Tuple[Tuple[Dict[str, Any], ...], CodecSpec]:
    if len(chain) == 0:
        raise GczFormatError("index-schema", "'codec' has no stage", tname)
    stages = []
    for i, st in enumerate(chain):
        if not isinstance(st, dict):
            raise GczFormatError("index-schema", f"codec stage {i} is not an object", tname)
        sname = _req(st, "name", str, f"codec stage {i}", tname)
        params = _req(st, "params", dict, f"codec stage {i}", tname)
        if len(st) != 2:  # FORMAT.md §5.3: a key beside these could change what the bytes mean
            raise GczFormatError("unknown-codec", f"codec stage {sname!r} has a key other than 'name' and "
                                 "'params'", tname)
        for k, v in params.items():  # FORMAT.md §5.3: integers, numbers or strings
            if type(v) not in (int, float, str):
                raise GczFormatError("index-schema", f"codec parameter {k!r} has an unsupported "
                                     "type", tname)
        if i == 0:
            if sname == "zstd":
                raise GczFormatError("unknown-codec", "a zstd stage cannot be the first", tname)
            spec = make_spec(sname, params, False, tname)
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
    return tuple(stages), spec


class GczFile:
    """A `.gcz` file opened for reading. Opening validates everything but the stream bytes."""

    def __init__(self, path: "str | os.PathLike[str]"):
        self.path = os.fspath(path)
        self._lock = threading.Lock()  # where there is no os.pread: a seek and a read as one step
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

    def __reduce__(self):  # pickled as its path: another process opens (and checks) the file again
        return (GczFile, (self.path,))

    # -- structure -------------------------------------------------------------------------------
    def _pread(self, offset: int, length: int) -> bytes:
        # Positional reads share no file position: threads, and processes forked with the file open,
        # can read at once.
        if hasattr(os, "pread"):
            parts, done = [], 0
            while done < length:
                part = os.pread(self._f.fileno(), length - done, offset + done)
                if not part:
                    break
                parts.append(part)
                done += len(part)
            data = b"".join(parts)
        else:
            with self._lock:
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
        nonzero = 1  # bounded even for an empty tensor, whose numel is 0
        for d in shape:
            nonzero *= d or 1
        if nonzero > MAX_NUMEL:
            why = (f"shape {shape}: the product of its nonzero dimensions exceeds 2^48"
                   if 0 in shape else f"shape {shape} has more than 2^48 elements")
            raise GczFormatError("bad-shape", why, name)
        if rng != RNG:
            raise GczFormatError("unknown-codec", f"unknown rng {rng!r} (the format has {RNG})", name)
        stages, spec = _validate_chain(chain, name)
        has_zstd = len(stages) > 1
        ecodec = stages[0]["name"]
        want = layout(spec, dtype, tuple(shape), name)
        expected = {w.name: w for w in want}

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
        if [s.name for s in sinfos] != [w.name for w in want]:
            raise GczFormatError(
                "bad-streams", f"codec {ecodec!r} writes streams {_first_names(want)}, the "
                f"index lists {_first_names(sinfos)}", name)
        for s in sinfos:
            if s.encoding not in ("raw", "zstd"):
                raise GczFormatError("bad-encoding",
                                     f"stream {s.name!r} has unknown encoding {s.encoding!r}", name)
            if s.encoding == "zstd" and not has_zstd:
                raise GczFormatError(
                    "bad-encoding", f"stream {s.name!r} is zstd but the chain has no zstd stage",
                    name)
            w = expected[s.name]
            if (s.size != w.size) if w.exact else (s.size > w.size):
                raise GczFormatError(
                    "stream-size", f"stream {s.name!r} size {s.size} does not match the codec's "
                    f"{'' if w.exact else 'bound '}{w.size}", name)
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
                          metrics=metrics if isinstance(metrics, dict) else None, spec=spec)
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

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

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

    def _decode_flat(self, info: TensorInfo) -> np.ndarray:
        """The decoded elements of a tensor, flat, as bit patterns of its dtype; a tensor too large
        for MAX_DECODE_BYTES, or for the memory there is, raises `reader-limit`."""
        need = info.numel * FMTS[info.dtype].itemsize
        limit, per = MAX_DECODE_BYTES, PEAK_BYTES_PER_ELEMENT.get(info.spec.name, 54)
        if limit is not None and info.numel * per > limit:
            raise GczFormatError(
                "reader-limit", f"its decoded values take {need} bytes ({info.numel} {info.dtype} "
                f"elements), and decoding {info.spec.name} takes about {per} bytes per element at its "
                f"peak, {info.numel * per} in all, more than MAX_DECODE_BYTES = {limit} (default: "
                "this machine's or this cgroup's memory)", info.name)
        streams = {s.name: s for s in info.streams}
        ctx = _Ctx(info.name, info.seed, tensor_key(info.name), lambda sname: self._read_stream(
            info, streams[sname]))
        with _memory_guard(info, need):
            fmt, bits = decode(info.spec, info.dtype, info.shape, ctx)
            return convert_bits(bits, fmt, info.dtype)

    def read_bits(self, name: str) -> np.ndarray:
        """The decoded tensor as raw bit patterns: uint16 (float16/bfloat16), uint32, uint64. A
        tensor too large to decode raises rule ``reader-limit``."""
        info = self.info(name)
        return self._decode_flat(info).reshape(info.shape)

    def read(self, name: str, widen: bool = False) -> np.ndarray:
        """The decoded tensor in its original dtype (C order, its shape).

        float16/float32/float64 tensors come back as those numpy dtypes. bfloat16 tensors come back
        as uint16 bit patterns, or as float32 values (exact) with ``widen=True``.
        """
        info = self.info(name)
        if info.dtype == "bfloat16" and widen:
            flat = self._decode_flat(info)
            with _memory_guard(info, info.numel * 4):
                wide = convert_bits(flat, "bfloat16", "float32").view(np.float32)
                return wide.reshape(info.shape)
        bits = self.read_bits(name)
        if info.dtype == "bfloat16":
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
            self._decode_flat(info)
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


@contextlib.contextmanager
def _memory_guard(info: TensorInfo, need: int):
    """Turns running out of memory while decoding a tensor into a `reader-limit` error."""
    try:
        yield
    except MemoryError:
        raise GczFormatError(
            "reader-limit", f"out of memory decoding it: its decoded values alone take {need} "
            f"bytes ({info.numel} {info.dtype} elements), and decoding needs working copies "
            "besides", info.name) from None


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

    ap = argparse.ArgumentParser(prog="gczread.py", description="List the tensors of a .gcz file.",
                                 epilog="Exit status: 0 ok, 1 a rejected or unreadable file, 2 a usage error.")
    ap.add_argument("file", help="the .gcz file to read")
    ap.add_argument("--verify", action="store_true", help="also check every stream and decode")
    args = ap.parse_args(argv)
    try:
        with GczFile(args.file) as f:
            print(f"{args.file}: gcz {f.version[0]}.{f.version[1]}, written by {f.producer}, "
                  f"{len(f)} tensors, {f.file_size} bytes")
            for k, v in f.metadata.items():
                print(f"metadata  {k}={v}")
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
    except OSError as e:  # a missing or unreadable file
        why = f"{args.file}: {e.strerror}" if e.strerror else str(e)
        print(f"gczread: error: {why}", file=sys.stderr)
        return 1
    except ImportError as e:  # xxhash or zstandard missing: the message says what to install
        print(f"gczread: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
