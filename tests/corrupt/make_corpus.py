#!/usr/bin/env python3
"""Writes the hostile-file corpus of tests/corrupt/ (see README.md there).

    python3 tests/corrupt/make_corpus.py            # rewrite tests/corrupt/gcz/ and tests/corrupt/inputs/
    python3 tests/corrupt/make_corpus.py --table    # print the README table of every file

Every `.gcz` file is written byte by byte from docs/FORMAT.md (header, 64-aligned streams, compact
JSON index, trailer), not by gcz, so the corpus does not inherit the writer's mistakes. Each file
breaks exactly one rule of FORMAT.md §6 and is otherwise valid: its other checksums (index and
streams) are right, its streams tile the data section, its zstd frames are real frames (written by
hand from RFC 8878, so no zstd library is needed and the bytes never change between versions).
A file is named after the rule it breaks: `RULE.gcz` or `RULE-VARIANT.gcz`; `valid*.gcz` are correct
files that a reader must accept.

`tests/corrupt/inputs/` holds hostile tensor dumps (.npy, .safetensors, .npz, raw .bin) that
`gcz encode`/`gcz eval` must refuse cleanly.

Needs numpy and xxhash (`pip install xxhash`, for XXH3-64). The output is deterministic: rerunning
gives the same bytes.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

try:
    import xxhash
except ImportError:  # pragma: no cover
    sys.exit("make_corpus.py needs xxhash for XXH3-64: pip install xxhash")

HERE = Path(__file__).resolve().parent
MAGIC = b"\x89GCZ\r\n\x1a\n"
END_MAGIC = b"\x89GCZEND\n"
HEADER = 64
TRAILER = 32
ALIGN = 64
RNG = "philox4x32-10"
PRODUCER = "make_corpus.py"
MIB = 1 << 20


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def xxh3(b: bytes) -> int:
    return xxhash.xxh3_64_intdigest(b)  # seed 0


# ------------------------------------------------------------------------------------------------
# Zstandard frames by hand (RFC 8878 §3.1.1): raw and RLE blocks only. Such frames are as valid as
# the ones libzstd writes, and an RLE block really compresses.


def _block(last: bool, kind: int, size: int) -> bytes:
    assert size < (1 << 21)
    return (int(last) | (kind << 1) | (size << 3)).to_bytes(3, "little")


def zstd_frame(parts: List[tuple], content_size: bool = True, checksum: bool = False) -> bytes:
    """parts: ('raw', bytes) or ('rle', byte value, count). Returns one frame holding their content."""
    content = b"".join(p[1] if p[0] == "raw" else bytes([p[1]]) * p[2] for p in parts)
    n = len(content)
    out = bytearray(b"\x28\xb5\x2f\xfd")
    if content_size:  # Single_Segment: the window is the content size, Frame_Content_Size follows
        if n < 256:
            out += bytes([0x20 | (checksum << 2)]) + bytes([n])
        elif n < 65536 + 256:
            out += bytes([0x60 | (checksum << 2)]) + (n - 256).to_bytes(2, "little")
        else:
            out += bytes([0xA0 | (checksum << 2)]) + n.to_bytes(4, "little")
    else:  # no content size: a Window_Descriptor (1 KiB << exponent) instead
        biggest = max([len(p[1]) if p[0] == "raw" else p[2] for p in parts] + [1])
        exponent = 0
        while (1024 << exponent) < biggest:
            exponent += 1
        out += bytes([checksum << 2]) + bytes([exponent << 3])
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if p[0] == "raw":
            out += _block(last, 0, len(p[1])) + p[1]
        else:
            out += _block(last, 1, p[2]) + bytes([p[1]])
    if not parts:
        out += _block(True, 0, 0)
    if checksum:
        out += (xxhash.xxh64_intdigest(content) & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(out)


# ------------------------------------------------------------------------------------------------
# A .gcz file from a description.


def stream(stored: bytes, size: Optional[int] = None, encoding: str = "raw", name: str = "values",
           **over) -> dict:
    """A stream: its stored bytes, its decoded size (default: len(stored)) and index overrides
    (offset, length, size, xxh3 as int or str) and `at`, where its bytes are put in the file."""
    return {"stored": bytes(stored), "size": len(stored) if size is None else size, "encoding": encoding,
            "name": name, "over": over}


def tensor(name: str, dtype: str, shape: list, codec: list, streams: list, **extra) -> dict:
    t = {"name": name, "dtype": dtype, "shape": list(shape), "codec": codec, "seed": 0, "rng": RNG,
         "streams": streams}
    t.update(extra)
    return t


def fp16(zstd_level: Optional[int] = None, name: str = "fp16") -> list:
    chain = [{"name": name, "params": {}}]
    if zstd_level is not None:
        chain.append({"name": "zstd", "params": {"level": zstd_level}})
    return chain


def build(tensors: List[dict], *, metadata: Optional[dict] = None, index_at: Optional[int] = None,
          edit: Optional[Callable[[dict], None]] = None, raw_index: Optional[Callable[[bytes], bytes]] = None,
          magic: bytes = MAGIC, major: int = 1, minor: int = 0, flags: int = 0, reserved: bytes = bytes(48),
          trailer_offset: Optional[int] = None, trailer_length: Optional[int] = None,
          trailer_xxh3: Optional[Callable[[int], int]] = None, end_magic: bytes = END_MAGIC,
          gap_before_index: int = 0, patches: Optional[Dict[int, int]] = None) -> bytes:
    """The bytes of a .gcz file. Streams are laid out as FORMAT.md §4 says unless a stream says
    `at`; the index records each stream's real offset, length and checksum unless overridden. The
    checksum of a stream is taken over the bytes the index points at, in the final file."""
    data = bytearray(HEADER)
    for t in tensors:
        for s in t["streams"]:
            off = s["over"].get("at", align(len(data)))
            if off > len(data):
                data += bytes(off - len(data))
            data[off:off + len(s["stored"])] = s["stored"]
            s["_off"], s["_len"] = off, len(s["stored"])
    idx_off = align(len(data)) if index_at is None else index_at
    if idx_off >= len(data):
        data += bytes(idx_off - len(data))
    else:
        del data[idx_off:]  # the index overwrites what a stream would have there
    data += bytes(gap_before_index)

    def index_obj(hashes: Dict[int, int]) -> dict:
        obj = {"format": "gcz", "version": 1, "producer": PRODUCER}
        if metadata is not None:
            obj["metadata"] = metadata
        obj["tensors"] = []
        for t in tensors:
            jt = {k: v for k, v in t.items() if k != "streams"}
            jt["streams"] = []
            for s in t["streams"]:
                o = s["over"]
                xx = o.get("xxh3", hashes.get(id(s), 0))
                jt["streams"].append({"name": s["name"], "encoding": s["encoding"],
                                      "offset": o.get("offset", s["_off"]), "length": o.get("length", s["_len"]),
                                      "size": o.get("size", s["size"]),
                                      "xxh3": xx if isinstance(xx, str) else "%016x" % xx})
            obj["tensors"].append(jt)
        if edit is not None:
            edit(obj)
        return obj

    def serialize(obj: dict) -> bytes:
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return raw_index(text) if raw_index is not None else text

    def hashes_over(body: bytes) -> Dict[int, int]:
        out = {}
        for t in tensors:
            for s in t["streams"]:
                off = s["over"].get("offset", s["_off"])
                length = s["over"].get("length", s["_len"])
                out[id(s)] = xxh3(body[off:off + length])
        return out

    # Stream checksums cover the final file; a stream that runs into the index (stream-out-of-range)
    # covers only the index's first bytes, `{"format":"gcz",`, which no checksum changes.
    first = serialize(index_obj({}))
    hashes = hashes_over(bytes(data) + first)
    index = serialize(index_obj(hashes))
    assert hashes_over(bytes(data) + index) == hashes, "a stream checksum covers itself"

    body = bytearray(data) + index
    body[0:HEADER] = magic + struct.pack("<HHI", major, minor, flags) + reserved
    toff = len(data) if trailer_offset is None else trailer_offset
    tlen = len(index) if trailer_length is None else trailer_length
    covered = bytes(body[toff:toff + tlen]) if toff + tlen <= len(body) else index
    txx = xxh3(covered) if trailer_xxh3 is None else trailer_xxh3(xxh3(covered))
    out = body + struct.pack("<QQQ", toff % (1 << 64), tlen, txx) + end_magic
    for pos, value in (patches or {}).items():
        out[pos] = value
    return bytes(out)


# ------------------------------------------------------------------------------------------------
# The base file: valid.gcz, and the pieces the corrupt files are made of.

A_VALUES = np.array([0.5, -1.25, 2.0, 0.0, -0.0, 65504.0], dtype=np.float16).tobytes()  # fp16 of float32 [2,3]
B_HEAD = np.array([1.0, -2.0, 0.25, 3.5, -0.125, 7.0, 1e-3, -1e4], dtype=np.float16).tobytes()
B_CONTENT = B_HEAD + bytes(64)  # float16 [40]: 8 values then 32 zeros
B_FRAME = zstd_frame([("raw", B_HEAD), ("rle", 0, 64)])  # 29 bytes for 80
C_VALUE = np.array(0.125, dtype="<f8").tobytes()  # float64 0-d tensor, codec none


def base_tensors(**overrides) -> List[dict]:
    """Three tensors: float32 [2,3] fp16 (raw stream), float16 [40] fp16+zstd (a zstd stream) and a
    0-d float64 stored with none+zstd whose stream stayed raw. Streams at 64, 128 and 192, index at 256.
    overrides: a=..., b=..., c=... replace a tensor (None drops it)."""
    ts = {
        "a": tensor("layer0.weight", "float32", [2, 3], fp16(), [stream(A_VALUES)],
                    metrics={"numel": 6, "bytes_in": 24, "ratio": 0.1}),
        "b": tensor("layer0.bias", "float16", [40], fp16(3), [stream(B_FRAME, 80, "zstd")]),
        "c": tensor("scale", "float64", [], [{"name": "none", "params": {}}, {"name": "zstd", "params": {"level": 19}}],
                    [stream(C_VALUE)]),
    }
    ts.update(overrides)
    return [t for t in ts.values() if t is not None]


def base(**kw) -> bytes:
    tensor_overrides = {k: kw.pop(k) for k in ("a", "b", "c") if k in kw}
    kw.setdefault("metadata", {"step": "0", "note": "tests/corrupt"})
    return build(base_tensors(**tensor_overrides), **kw)


def a_with(**kw) -> dict:
    """Tensor a with its stream overridden (stored=..., and index overrides)."""
    stored = kw.pop("stored", A_VALUES)
    size = kw.pop("size", None)
    t_over = kw.pop("tensor", {})
    t = tensor("layer0.weight", "float32", [2, 3], fp16(), [stream(stored, size, **kw)])
    t.update(t_over)
    return t


def b_with(frame: bytes, size: int = 80, **t_over) -> dict:
    t = tensor("layer0.bias", "float16", [40], fp16(3), [stream(frame, size, "zstd")])
    t.update(t_over)
    return t


def edit_tensor(i: int, fn: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda obj: fn(obj["tensors"][i])


def set_key(d: dict, k, v):
    d[k] = v


def pop_key(d: dict, k):
    d.pop(k)


# ------------------------------------------------------------------------------------------------
# The corpus: name -> (bytes, what is wrong, where a reader notices: open | read | verify).

CORPUS: Dict[str, tuple] = {}


def add(name: str, data: bytes, what: str, when: str = "open") -> None:
    assert name not in CORPUS
    CORPUS[name] = (data, what, when)


def make_gcz_corpus() -> None:
    valid = base()
    add("valid", valid, "correct: fp16 raw stream, fp16+zstd zstd stream, 0-d none+zstd raw stream", "ok")
    add("valid-empty", build([]), "correct: no tensors (index at 64)", "ok")
    add("valid-minor-version",
        base(minor=7, b=b_with(zstd_frame([("raw", B_HEAD), ("rle", 0, 64)], content_size=False, checksum=True)),
             edit=lambda o: (o.update(future_key={"x": [1, 2.5]}), o["tensors"][0].update(future_tensor_key=1),
                             o["tensors"][0]["streams"][0].update(future_stream_key="y"))),
        "correct: version_minor 7, unknown keys, zstd frame without content size and with a content checksum", "ok")
    add("valid-name-4096", base(c=tensor("n" * 4096, "float64", [], [{"name": "none", "params": {}}],
                                         [stream(C_VALUE)])),
        "correct: a 4096-byte tensor name (the longest allowed)", "ok")
    add("valid-empty-tensor", base(c=tensor("empty", "float32", [0, 5], fp16(3), [stream(b"")])),
        "correct: a tensor with no elements, its empty raw stream at an aligned offset", "ok")
    add("valid-deep", base(raw_index=lambda b: b.replace(b'"producer":', b'"x":' + b"[" * 511 + b"]" * 511 + b',"producer":', 1)),
        "correct: an unknown key holding arrays 511 deep, so the index nests 512 deep (the most allowed)", "ok")

    # -- header and trailer ----------------------------------------------------------------------
    add("too-small", valid[:HEADER] + bytes(TRAILER - 9) + END_MAGIC,
        "95 bytes: a header and a trailer end magic, one byte short of the smallest .gcz")
    add("too-small-empty", b"", "an empty file")
    add("bad-magic", base(magic=b"\x89PNG\r\n\x1a\n"), "header magic is PNG's")
    add("bad-version", base(major=2), "version_major 2")
    add("bad-version-0", base(major=0), "version_major 0")
    add("reserved-nonzero", base(flags=1), "flags = 1")
    add("reserved-nonzero-reserved", base(reserved=bytes(47) + b"\x80"), "last reserved byte (63) is 0x80")
    add("bad-end-magic", base(end_magic=b"\x89GCZEND\r"), "trailer end_magic ends in \\r")
    add("index-too-large", base(trailer_length=64 * MIB + 1), "index_length 64 MiB + 1")
    add("index-too-large-zero", base(trailer_length=0), "index_length 0")
    add("index-out-of-range", base(gap_before_index=4, trailer_offset=260),
        "index_offset 260 (not a multiple of 64); the index is really there")
    add("index-out-of-range-below-64", base(trailer_offset=0, trailer_length=len(valid) - TRAILER),
        "index_offset 0 with index_length covering header and data, so the sum fits the file")
    add("index-out-of-range-length", base(trailer_length=len(valid) - TRAILER - 256 + 1),
        "index_offset + index_length + 32 = file size + 1")
    add("index-out-of-range-overflow", base(trailer_offset=(1 << 64) - 64),
        "index_offset 2^64 - 64: index_offset + index_length overflows 64 bits")
    add("index-checksum", base(trailer_xxh3=lambda h: h ^ 1), "index_xxh3 has its lowest bit flipped")

    # -- index JSON and schema -------------------------------------------------------------------
    add("index-json", base(raw_index=lambda b: b[:-1]), "the index lacks its closing brace")
    add("index-json-not-object", base(raw_index=lambda b: b"[" + b + b"]"), "the index is a JSON array")
    add("index-json-utf8", base(raw_index=lambda b: b.replace(b'"make_corpus.py"', b'"make_corpus\xff.py"')),
        "invalid UTF-8 (0xFF) inside the producer string")
    add("index-json-trailing", base(raw_index=lambda b: b + b"}"), "a second '}' after the index object")
    add("index-json-nan", base(raw_index=lambda b: b.replace(b'"seed":0', b'"seed":NaN', 1)),
        "NaN (not JSON) as a seed")
    add("index-json-duplicate-key", base(raw_index=lambda b: b.replace(b'"seed":0', b'"seed":0,"seed":0', 1)),
        "a tensor object has the key 'seed' twice (RFC 8259 leaves which one counts to the parser)")
    add("unknown-codec-stage-key", base(edit=edit_tensor(0, lambda t: t["codec"][0].update(scale=2))),
        "the element codec's stage has a key 'scale' beside 'name' and 'params'")
    add("index-json-deep", base(raw_index=lambda b: b.replace(b'"producer":', b'"x":' + b"[" * 512 + b"]" * 512 + b',"producer":', 1)),
        "an unknown key holding arrays 512 deep: the index nests 513 deep, one more than allowed")
    add("index-schema", base(edit=lambda o: pop_key(o, "producer")), "the required key 'producer' is missing")
    add("index-schema-missing-seed", base(edit=edit_tensor(0, lambda t: pop_key(t, "seed"))),
        "a tensor lacks 'seed'")
    add("index-schema-missing-xxh3", base(edit=edit_tensor(1, lambda t: pop_key(t["streams"][0], "xxh3"))),
        "a stream lacks 'xxh3'")
    add("index-schema-missing-tensors", build([], edit=lambda o: pop_key(o, "tensors")),
        "no 'tensors' key (a file without streams)")
    add("index-schema-format", base(edit=lambda o: set_key(o, "format", "gzc")), "'format' is \"gzc\"")
    add("index-schema-version", base(edit=lambda o: set_key(o, "version", 2)),
        "index 'version' 2, header version_major 1")
    add("index-schema-version-below", base(edit=lambda o: set_key(o, "version", 0)),
        "index 'version' 0, header version_major 1")
    add("index-schema-version-string", base(edit=lambda o: set_key(o, "version", "1")), "'version' is a string")
    add("index-schema-shape-string", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", "2x3"))),
        "'shape' is a string")
    add("index-schema-shape-float", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [2.0, 3.0]))),
        "shape dimensions written as 2.0 and 3.0")
    add("index-schema-shape-negative", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [-2, -3]))),
        "shape [-2, -3] (its product would be the right 6)")
    add("index-schema-seed-exponent", base(raw_index=lambda b: b.replace(b'"seed":0', b'"seed":0e0', 1)),
        "seed written as 0e0 (integers have no exponent)")
    add("index-schema-seed-2-64", base(edit=edit_tensor(0, lambda t: set_key(t, "seed", 1 << 64))),
        "seed 2^64, one more than the largest integer")
    add("index-schema-seed-negative", base(edit=edit_tensor(0, lambda t: set_key(t, "seed", -1))),
        "seed -1 (not 2^64 - 1)")
    add("index-schema-offset-string",
        base(edit=edit_tensor(0, lambda t: set_key(t["streams"][0], "offset", "64"))), "a stream offset is \"64\"")
    add("index-schema-xxh3-uppercase",
        base(edit=edit_tensor(0, lambda t: t["streams"][0].update(xxh3=t["streams"][0]["xxh3"].upper()))),
        "the right xxh3 in uppercase hex")
    add("index-schema-metadata", base(metadata={"step": 0}), "a metadata value is a number")
    add("index-schema-codec-empty", base(edit=edit_tensor(0, lambda t: set_key(t, "codec", []))),
        "an empty codec chain")
    add("duplicate-name", base(c=tensor("layer0.weight", "float64", [], [{"name": "none", "params": {}}],
                                        [stream(C_VALUE)])), "two tensors named 'layer0.weight'")
    add("duplicate-name-empty", base(edit=edit_tensor(2, lambda t: set_key(t, "name", ""))), "an empty name")
    add("duplicate-name-too-long", base(edit=edit_tensor(2, lambda t: set_key(t, "name", "n" + "\u00e9" * 2048))),
        "a 4097-byte name, two bytes a character after the first")
    add("bad-dtype", base(edit=edit_tensor(0, lambda t: set_key(t, "dtype", "int32"))), "dtype 'int32'")
    add("bad-dtype-alias", base(edit=edit_tensor(0, lambda t: set_key(t, "dtype", "f32"))),
        "dtype 'f32' (a CLI spelling, not a FORMAT.md dtype)")
    add("bad-dtype-case", base(edit=edit_tensor(0, lambda t: set_key(t, "dtype", "Float32"))), "dtype 'Float32'")
    add("bad-shape", base(a=a_with(tensor={"shape": [1] * 31 + [2, 3]})),
        "33 dimensions (1 x ... x 2 x 3: the stream fits its 6 elements)")
    add("bad-shape-numel", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [1 << 24, (1 << 24) + 1]))),
        "2^48 + 2^24 elements")
    add("bad-shape-overflow", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [1 << 32] * 3))),
        "shape [2^32, 2^32, 2^32]: the element count overflows 64 bits")
    add("bad-shape-overflow-wrap", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [1 << 32, 1 << 32, 6]))),
        "shape [2^32, 2^32, 6]: the element count wraps to 0 in 64 bits")
    add("bad-shape-empty-huge-dim", base(edit=edit_tensor(0, lambda t: set_key(t, "shape", [0, (1 << 48) + 1]))),
        "shape [0, 2^48 + 1]: no elements, but a dimension past 2^48")

    # -- codec chain, streams --------------------------------------------------------------------
    add("unknown-codec", base(a=a_with(tensor={"codec": fp16(name="fp17")})), "element codec 'fp17'")
    add("unknown-codec-params", base(a=a_with(tensor={"codec": [{"name": "fp16", "params": {"level": 3}}]})),
        "fp16 with a parameter 'level'")
    add("unknown-codec-stage", base(a=a_with(tensor={"codec": fp16() + [{"name": "gzip", "params": {}}]})),
        "stage 'gzip' after fp16")
    add("unknown-codec-zstd-first", base(a=a_with(tensor={"codec": [{"name": "zstd", "params": {"level": 3}}]})),
        "the chain is only a zstd stage")
    add("unknown-codec-two-stages", base(a=a_with(tensor={"codec": fp16(3) + [{"name": "zstd", "params": {"level": 3}}]})),
        "fp16+zstd+zstd")
    add("unknown-codec-zstd-level", base(b=b_with(B_FRAME, codec=fp16(99))), "zstd level 99")
    add("unknown-codec-zstd-level-0", base(b=b_with(B_FRAME, codec=fp16(0))), "zstd level 0")
    add("unknown-codec-zstd-no-level", base(b=b_with(B_FRAME, codec=fp16() + [{"name": "zstd", "params": {}}])),
        "zstd stage without 'level'")
    add("unknown-codec-zstd-level-string", base(b=b_with(B_FRAME, codec=fp16() + [{"name": "zstd", "params": {"level": "3"}}])),
        "zstd level \"3\"")
    add("unknown-codec-rng", base(a=a_with(tensor={"rng": "mt19937"})), "rng 'mt19937', not philox4x32-10")
    add("unknown-codec-zstd-extra-param",
        base(b=b_with(B_FRAME, codec=fp16() + [{"name": "zstd", "params": {"level": 3, "window": 20}}])),
        "zstd stage with a second parameter")
    add("bad-streams", base(a=tensor("layer0.weight", "float32", [2, 3], fp16(), [stream(A_VALUES, name="data")])),
        "the fp16 stream is named 'data'")
    add("bad-streams-extra", base(a=tensor("layer0.weight", "float32", [2, 3], fp16(),
                                           [stream(A_VALUES), stream(b"", name="extra")])),
        "an extra (empty) stream after 'values'")
    add("bad-streams-none", base(c=tensor("scale", "float64", [], [{"name": "none", "params": {}}], [])),
        "a tensor with no streams")
    add("bad-encoding", base(a=a_with(encoding="lz4")), "encoding 'lz4'")
    add("bad-encoding-zstd-without-stage",
        base(a=a_with(stored=zstd_frame([("raw", A_VALUES)]), size=12, encoding="zstd")),
        "a zstd stream (a valid frame) in a tensor whose chain is only fp16")
    add("stream-out-of-range", base(b=tensor("layer0.bias", "float16", [40], fp16(3),
                                             [stream(B_FRAME, 80, "zstd", offset=64)])),
        "the second stream claims offset 64, overlapping the first")
    add("stream-out-of-range-hole", base(b=tensor("layer0.bias", "float16", [40], fp16(3),
                                                  [stream(B_FRAME, 80, "zstd", at=192)])),
        "a 64-byte hole: the second stream at 192 instead of 128")
    add("stream-out-of-range-misaligned", base(b=tensor("layer0.bias", "float16", [40], fp16(3),
                                                        [stream(B_FRAME, 80, "zstd", at=76)])),
        "the second stream right after the first, at 76 (not a multiple of 64)")
    add("stream-out-of-range-first", base(a=a_with(at=128)), "the first stream at 128, not 64")
    add("stream-out-of-range-past-end",
        base(c=tensor("scale", "float32", [40], fp16(), [stream(bytes(80))]), index_at=256),
        "the last (raw, 80-byte) stream starts at 192 and runs 16 bytes into the index at 256")
    add("stream-out-of-range-unindexed", base(index_at=320),
        "64 zero bytes after the last stream that no stream accounts for (index at 320, not 256)")
    add("stream-size", base(a=a_with(stored=A_VALUES[:10])), "fp16 of 6 elements stored in 10 bytes (size 10)")
    add("stream-size-raw-length", base(a=a_with(stored=A_VALUES + bytes(4), size=12)),
        "a raw stream of size 12 but length 16")
    add("stream-size-zstd-ratio",
        base(b=tensor("layer0.bias", "float16", [65537], fp16(3), [stream(b"\x00", 131074, "zstd")])),
        "a 1-byte zstd stream of size 131074 (more than 65536 x length)")
    add("stream-size-zstd-ratio-by-2",
        base(b=tensor("layer0.bias", "float16", [32769], fp16(3), [stream(b"\x00", 65538, "zstd")])),
        "a 1-byte zstd stream of size 65538, 2 bytes more than 65536 x length")
    add("stream-checksum", base(a=a_with(xxh3=xxh3(A_VALUES) ^ (1 << 63))),
        "the raw stream's xxh3 has its top bit flipped", "read")
    add("stream-checksum-empty", base(a=tensor("layer0.weight", "float32", [0, 3], fp16(), [stream(b"", xxh3=xxh3(b"") ^ 1)])),
        "an empty tensor's stream of no bytes, its xxh3 one bit off that of no bytes", "read")
    add("stream-checksum-zstd", base(b=tensor("layer0.bias", "float16", [40], fp16(3),
                                              [stream(B_FRAME, 80, "zstd", xxh3=xxh3(B_FRAME) ^ 1)])),
        "the zstd stream's xxh3 has its lowest bit flipped", "read")
    add("zstd-frame-at-ratio",
        base(b=tensor("layer0.bias", "float16", [32768], fp16(3), [stream(b"\x00", 65536, "zstd")])),
        "a 1-byte zstd stream of size 65536, 65536 x length, as far as the sizes may go: a byte is no frame",
        "read")
    add("zstd-frame", base(b=b_with(bytes(range(0x41, 0x41 + 29)))),
        "29 bytes of ASCII instead of a zstd frame", "read")
    add("zstd-frame-short", base(b=b_with(zstd_frame([("raw", B_HEAD), ("rle", 0, 62)], content_size=False))),
        "a valid frame (no content size) of 78 bytes for size 80", "read")
    add("zstd-frame-short-declared", base(b=b_with(zstd_frame([("raw", B_HEAD), ("rle", 0, 62)]))),
        "a valid frame declaring and holding 78 bytes, for size 80", "read")
    add("zstd-frame-long", base(b=b_with(zstd_frame([("raw", B_HEAD), ("rle", 0, 66)], content_size=False))),
        "a valid frame of 82 bytes for size 80", "read")
    add("zstd-frame-trailing", base(b=b_with(B_FRAME + b"\x00\x00\x00")),
        "a valid 80-byte frame followed by 3 zero bytes", "read")
    add("zstd-frame-two-frames", base(b=b_with(zstd_frame([("raw", B_HEAD)]) + zstd_frame([("rle", 0, 64)]))),
        "two valid frames of 16 and 64 bytes", "read")
    add("zstd-frame-skippable", base(b=b_with(bytes.fromhex("505e2a18") + struct.pack("<I", 2) + b"ab" + B_FRAME)),
        "a skippable frame before the real one", "read")
    add("zstd-frame-truncated", base(b=b_with(B_FRAME[:-5])), "the frame cut 5 bytes short", "read")
    add("zstd-frame-bad-checksum",
        base(b=b_with(zstd_frame([("raw", B_HEAD), ("rle", 0, 64)], checksum=True)[:-1] + b"\x00")),
        "a frame whose content checksum is wrong", "read")
    add("zstd-frame-empty",
        base(c=tensor("empty", "float32", [0], fp16(3), [stream(b"", 0, "zstd")])),
        "a zstd stream of length 0 (size 0: a tensor with no elements)")
    add("zstd-frame-empty-tensor",
        base(c=tensor("empty", "float32", [0], fp16(3), [stream(b"NOTZSTD!", 0, "zstd")])),
        "8 bytes that are not a zstd frame, for a tensor with no elements (size 0)", "read")
    add("zstd-frame-empty-tensor-long",
        base(c=tensor("empty", "float32", [0], fp16(3), [stream(zstd_frame([("rle", 0, 4)]), 0, "zstd")])),
        "a valid frame of 4 bytes for a tensor with no elements (size 0)", "read")
    qsgd = [{"name": "qsgd", "params": {"bits": 8, "group": 128, "scale": "max", "rounding": "nearest",
                                        "scale_dtype": "fp32"}}]
    add("bad-stream-data",
        base(c=tensor("q", "float32", [4], qsgd, [stream(bytes(4), name="codes"),
                                                 stream(struct.pack("<f", float("nan")), name="scales")])),
        "a qsgd tensor whose checksummed scale is NaN (only the codec's decoder can see it)", "read")
    add("nonzero-padding", base(patches={100: 0x01}), "a padding byte between the first two streams is 1", "verify")
    add("nonzero-padding-tail", base(patches={255: 0x80}), "the padding byte just before the index is 0x80",
        "verify")


# ------------------------------------------------------------------------------------------------
# Hostile tensor inputs.

INPUTS: Dict[str, tuple] = {}  # name -> (bytes, what, expected exit code of gcz encode/eval, extra args)


def npy_header(descr: str, shape: tuple, version: int = 1) -> bytes:
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    pre = 10 if version == 1 else 12
    pad = -(pre + len(d) + 1) % 64
    text = (d + " " * pad + "\n").encode("latin1")
    head = b"\x93NUMPY" + bytes([version, 0])
    return head + (struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))) + text


def safetensors(header: bytes, data: bytes, declared: Optional[int] = None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header + data


def make_inputs() -> None:
    full = npy_header("<f4", (4, 4))
    INPUTS["npy-truncated-header.npy"] = (full[:30], "the header length says %d bytes; the file ends 20 bytes into it" % (len(full) - 10), 4, [])
    INPUTS["npy-short-payload.npy"] = (full + bytes(20), "shape (4, 4) of `<f4` needs 64 payload bytes; 20 follow", 4, [])
    INPUTS["npy-overflow-shape.npy"] = (npy_header("<f4", (1 << 40, 1 << 40, 1 << 40)),
                                        "shape (2^40, 2^40, 2^40): the element count overflows", 4, [])
    INPUTS["npy-empty-huge-dim.npy"] = (npy_header("<f4", (0, (1 << 64) - 1)),
                                        "shape (0, 2^64 - 1): no elements, but a dimension numpy cannot hold", 4, [])
    one = np.ones((1,) * 32, dtype="<f4").tobytes()
    INPUTS["npy-one-byte-short.npy"] = (npy_header("<f4", (1,) * 32) + one[:-1],
                                        "shape (1,) * 32 of `<f4` needs 4 payload bytes; 3 follow", 4, [])
    INPUTS["npy-rank-33.npy"] = (npy_header("<f4", (1,) * 33) + one,
                                 "33 dimensions, one more than a `.gcz` holds (numpy reads it)", 4, [])
    v11 = bytearray(npy_header("<f4", (1,)) + one)
    v11[7] = 1
    INPUTS["npy-version-1-1.npy"] = (bytes(v11), "format version 1.1 (numpy knows 1.0, 2.0 and 3.0)", 5, [])
    INPUTS["npy-int-dtype.npy"] = (npy_header("<i8", (2,)) + np.arange(2, dtype="<i8").tobytes(),
                                   "an int64 (`<i8`) array: not floating", 5, [])
    INPUTS["st-header-too-long.safetensors"] = (safetensors(b"{}", b"", declared=1000),
                                                "the header length says 1000 bytes in a 10-byte file", 4, [])
    h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 400]}}).encode()
    INPUTS["st-offsets-out-of-range.safetensors"] = (safetensors(h, bytes(8)), "data_offsets [0, 400] with 8 data bytes", 4, [])
    h = json.dumps({"__metadata__": {"step": 100}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    INPUTS["st-metadata-not-string.safetensors"] = (safetensors(h, bytes(8)),
                                                    "`__metadata__` holds the number 100 (safetensors allows strings)",
                                                    4, [])
    h = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
    INPUTS["st-offsets-wrong-length.safetensors"] = (safetensors(h, bytes(16)),
                                                     "data_offsets [0, 12] for shape [2, 2] of F32 (16 bytes)", 4, [])
    h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}}).encode()
    INPUTS["st-offsets-not-pair.safetensors"] = (safetensors(h, bytes(8)), "data_offsets [0, 4, 8]: not a pair", 4, [])
    h = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    INPUTS["st-offsets-gap.safetensors"] = (safetensors(h, bytes(12)),
                                            "data_offsets [0, 4] and [8, 12]: bytes 4..7 belong to no tensor", 4, [])
    h = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    INPUTS["st-trailing-bytes.safetensors"] = (safetensors(h, bytes(7)),
                                               "data_offsets [0, 4] in a 7-byte data section", 4, [])
    INPUTS["st-bad-json.safetensors"] = (safetensors(b'{"w": {"dtype": "F32", ', bytes(8)),
                                         "the header is not valid JSON", 4, [])
    INPUTS["empty.npz"] = (b"", "an empty file named .npz (no zip central directory)", 4, [])
    # A stored member (as numpy's savez writes them) whose data changed after its CRC-32 was taken.
    member = bytearray(npy_header("<f4", (4,)) + np.arange(4, dtype="<f4").tobytes())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(zipfile.ZipInfo("a.npy", date_time=(1980, 1, 1, 0, 0, 0)), bytes(member))
    data = bytearray(buf.getvalue())
    at = bytes(data).index(bytes(member)) + len(member) - 2
    data[at] ^= 0x40
    INPUTS["npz-stored-bad-crc.npz"] = (bytes(data), "a stored member whose data no longer matches its CRC-32", 4, [])
    # The same member, intact, whose local header names it b.npy where the central directory says a.npy.
    data = bytearray(buf.getvalue())
    at = bytes(data).index(b"a.npy")  # the local header comes first
    data[at] = ord("b")
    INPUTS["npz-local-name-differs.npz"] = (bytes(data), "the member's local header names it b.npy, the central "
                                            "directory a.npy", 4, [])

    def npz(members, method=zipfile.ZIP_STORED) -> bytes:
        out = io.BytesIO()
        with warnings.catch_warnings(), zipfile.ZipFile(out, "w", method) as z:
            warnings.simplefilter("ignore")  # a name twice
            for name, data in members:
                z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data, compress_type=method)
        return out.getvalue()

    INPUTS["npz-member-trailing-bytes.npz"] = (npz([("a.npy", bytes(member) + b"junk")]),
                                               "a member holds 4 bytes past what its npy header needs (numpy "
                                               "reads it)", 4, [])
    INPUTS["npz-duplicate-member.npz"] = (npz([("a.npy", bytes(member))] * 2), "member a.npy twice (numpy "
                                          "reads one)", 4, [])
    crc = struct.pack("<I", zipfile.crc32(bytes(member)))
    data = npz([("a.npy", bytes(member))], zipfile.ZIP_DEFLATED)
    assert data.count(crc) == 2  # the local header's and the central directory's
    INPUTS["npz-deflated-bad-crc.npz"] = (data.replace(crc, struct.pack("<I", zipfile.crc32(bytes(member)) ^ 1)),
                                          "a deflated member whose CRC-32 does not match its data", 4, [])
    INPUTS["raw-size-mismatch.bin"] = (np.arange(5, dtype="<f4").tobytes(),
                                       "20 bytes, where f32 of shape 3,3 needs 36", 4,
                                       ["--dtype", "f32", "--shape", "3,3"])


# ------------------------------------------------------------------------------------------------

EXIT = {"bad-version": 5, "unknown-codec": 5, "index-checksum": 6, "stream-checksum": 6}


def rule_of(name: str) -> str:
    from_spec = [r for r in RULES if name == r or name.startswith(r + "-")]
    return max(from_spec, key=len) if from_spec else ""


RULES = ("too-small", "bad-magic", "bad-version", "reserved-nonzero", "bad-end-magic", "index-too-large",
         "index-out-of-range", "index-checksum", "index-json", "index-schema", "duplicate-name", "bad-dtype",
         "bad-shape", "unknown-codec", "bad-streams", "bad-encoding", "stream-out-of-range", "stream-size",
         "stream-checksum", "zstd-frame", "bad-stream-data", "nonzero-padding")


def table() -> str:
    lines = ["| File | Rule | What is wrong | verify | info | decode |", "|---|---|---|---:|---:|---:|"]
    for name, (_, what, when) in CORPUS.items():
        if when == "ok":
            lines.append(f"| `gcz/{name}.gcz` | (none: valid) | {what} | 0 | 0 | 0 |")
            continue
        rule = rule_of(name)
        code = EXIT.get(rule, 4)
        info = code if when == "open" else 0
        decode = 0 if when == "verify" else code
        lines.append(f"| `gcz/{name}.gcz` | `{rule}` | {what} | {code} | {info} | {decode} |")
    lines += ["", "| File | What is wrong | encode / eval |", "|---|---|---:|"]
    for name, (_, what, code, args) in INPUTS.items():
        extra = f" (with `{' '.join(args)}`)" if args else ""
        lines.append(f"| `inputs/{name}` | {what}{extra} | {code} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", action="store_true", help="print the README table instead of writing files")
    ap.add_argument("--out", type=Path, default=HERE, help="where gcz/ and inputs/ go (default: next to this script)")
    args = ap.parse_args()
    make_gcz_corpus()
    make_inputs()
    for name in CORPUS:
        assert name.startswith("valid") or rule_of(name), name
    missing = [r for r in RULES if not any(rule_of(n) == r for n in CORPUS)]
    assert not missing, missing
    if args.table:
        print(table())
        return 0
    for sub, files in (("gcz", {f"{n}.gcz": v[0] for n, v in CORPUS.items()}),
                       ("inputs", {n: v[0] for n, v in INPUTS.items()})):
        d = args.out / sub
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            if old.name not in files:
                old.unlink()
        for fname, data in files.items():
            (d / fname).write_bytes(data)
    print(f"wrote {len(CORPUS)} .gcz files and {len(INPUTS)} inputs under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
