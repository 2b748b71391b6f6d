#!/usr/bin/env python3
"""Writes malformed GGUF files for the bad-model tests: python3 make_bad_ggufs.py GOOD.gguf OUTDIR."""
import struct
import sys
from pathlib import Path

GGUF_MAGIC = b"GGUF"
T_UINT32, T_STRING, T_ARRAY, T_UINT64 = 4, 8, 9, 10


def s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def kv_str(key: bytes, val: bytes) -> bytes:
    return s(key) + struct.pack("<I", T_STRING) + s(val)


def kv_u32(key: bytes, val: int) -> bytes:
    return s(key) + struct.pack("<I", T_UINT32) + struct.pack("<I", val)


def header(n_tensors: int, n_kv: int) -> bytes:
    return GGUF_MAGIC + struct.pack("<IQQ", 3, n_tensors, n_kv)


def main() -> None:
    good, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    data = good.read_bytes()
    # 1. a real model cut short, inside its tensor data
    (out / "truncated.gguf").write_bytes(data[: len(data) // 3])
    # 2. a key count no file can hold
    (out / "huge_n_kv.gguf").write_bytes(header(0, 1 << 62) + kv_str(b"general.architecture", b"qwen2"))
    # 3. a string that claims a terabyte
    (out / "oversized_string.gguf").write_bytes(
        header(0, 1) + struct.pack("<Q", 1 << 40) + b"general.architecture")
    # 4. an architecture with more layers than any model has
    kvs = [kv_str(b"general.architecture", b"qwen2"), kv_u32(b"qwen2.block_count", 100000),
           kv_u32(b"qwen2.context_length", 4096), kv_u32(b"qwen2.embedding_length", 64),
           kv_u32(b"qwen2.feed_forward_length", 128), kv_u32(b"qwen2.attention.head_count", 2)]
    (out / "block_count.gguf").write_bytes(header(0, len(kvs)) + b"".join(kvs))
    # 5. a tensor whose data starts far past the end of the file
    kvs = [kv_str(b"general.architecture", b"qwen2")]
    tensor = s(b"token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 64, 100) + \
        struct.pack("<I", 0) + struct.pack("<Q", 1 << 40)
    body = header(1, len(kvs)) + b"".join(kvs) + tensor
    body += b"\0" * ((32 - len(body) % 32) % 32) + b"\0" * 64
    (out / "tensor_past_eof.gguf").write_bytes(body)
    # 6. not a GGUF at all
    (out / "not_gguf.gguf").write_bytes(b"PK\x03\x04 this is a zip file, not a model")


if __name__ == "__main__":
    main()
