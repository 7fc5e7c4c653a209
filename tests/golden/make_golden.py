#!/usr/bin/env python3
"""Writes the golden .gcz files: tests/golden/input.safetensors (fixed values of every dtype, with
NaN/Inf/subnormals, 0-d and empty tensors), one <codec>.gcz per codec spec made by `gcz encode`, and
<codec>.expected.safetensors made by `gcz decode` at the time the golden file was written.

tests/unit/test_golden.cpp checks that today's gcz still decodes every golden file to the expected
tensors and still encodes the input to the same stream bytes. Regenerate only on a deliberate format
or codec change (with a format version bump):  python3 tests/golden/make_golden.py [path/to/gcz]
Before regenerating, copy the files whose bytes change into a v<old version>/ folder (v1.0/ and v1.1/
hold the stochastic codecs as formats 1.0 and 1.1 wrote them), so that their decoding stays tested.
"""
import json
import pathlib
import struct
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SPECS = {
    "none": "none",
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp16_zstd": "fp16+zstd",
    "bf16_zstd19": "bf16+zstd:level=19",
    "none_zstd": "none+zstd:level=1",
    "qsgd": "qsgd",
    "qsgd4_l2_nearest": "qsgd:bits=4,group=16,scale=l2,rounding=nearest,scale_dtype=bf16",
    "terngrad": "terngrad+zstd",
    "terngrad_group_2bit": "terngrad:scale=group,group=10,packing=2bit,rounding=deterministic",
    "topk": "topk:ratio=0.1",
    "topk_qsgd_values": "topk:k=20,values=(qsgd:bits=8)+zstd",
    "randomk": "randomk:ratio=0.2,scale=unbiased,values=(fp16)",
    "powersgd": "powersgd:rank=2,iters=2,factors=(bf16)",
}
# Encoders whose bytes may legitimately differ on another machine (PowerSGD's GEMMs depend on the
# BLAS kernel): their golden files are still decoded and compared, but not re-encoded.
ENCODE_EXACT = {name: not spec.startswith("powersgd") for name, spec in SPECS.items()}
SEED = 20261129


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, round to nearest even, NaN kept quiet."""
    b = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    r[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def tensors():
    rng = np.random.default_rng(1234)
    specials = np.array([0.0, -0.0, 1.0, -1.5, 65504.0, 65520.0, 1e-7, -3e-8, 1e38, 6e-8, np.inf, -np.inf, np.nan])
    w = (rng.standard_normal(33 * 7) * 10.0 ** rng.integers(-6, 2, 33 * 7)).astype(np.float32)
    w[: specials.size] = specials.astype(np.float32)
    h = (rng.standard_normal(65) * 1e-3).astype(np.float16)
    h[:4] = np.array([np.float16(6e-8), np.float16(-np.inf), np.float16(np.nan), np.float16(65504)])
    b = to_bf16_bits((rng.standard_normal(25) * 1e-2).astype(np.float32))
    d = rng.standard_normal(10) * 1e-4
    d[0] = 1.0 + 2.0 ** -11 + 2.0 ** -40  # rounds differently through float32
    return [
        ("layer.weight", "F32", [33, 7], w.tobytes()),
        ("layer.half", "F16", [65], h.tobytes()),
        ("layer.brain", "BF16", [5, 5], b.tobytes()),
        ("layer.double", "F64", [10], d.tobytes()),
        ("scalar", "F32", [], np.array([3.25], np.float32).tobytes()),
        ("empty", "F32", [0, 3], b""),
    ]


def write_safetensors(path, items):
    header, off = {}, 0
    for name, dtype, shape, data in items:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in items))


def main():
    gcz = sys.argv[1] if len(sys.argv) > 1 else str(HERE.parents[1] / "build" / "gcz")
    src = HERE / "input.safetensors"
    write_safetensors(src, tensors())
    for name, spec in SPECS.items():
        out = HERE / f"{name}.gcz"
        subprocess.run([gcz, "encode", str(src), "-o", str(out), "-c", spec, "-q", "--meta", "golden=1",
                        "--seed", str(SEED)], check=True, stderr=subprocess.DEVNULL)
        subprocess.run([gcz, "decode", str(out), "-o", str(HERE / f"{name}.expected.safetensors")], check=True)
    specs = {name: {"spec": spec, "seed": SEED, "encode_exact": ENCODE_EXACT[name]} for name, spec in SPECS.items()}
    (HERE / "specs.json").write_text(json.dumps(specs, indent=2) + "\n")
    print(f"wrote {len(SPECS)} golden files to {HERE}")


if __name__ == "__main__":
    main()
