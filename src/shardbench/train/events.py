"""Scalar logs: TensorBoard event files (written directly, no TensorFlow needed) and a JSON-lines twin.

An event file is a sequence of TFRecords (length, masked CRC-32C, payload, masked CRC-32C) whose
payloads are `Event` protocol buffers; the few fields needed for scalars are encoded by hand here.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path
from typing import IO

_CRC_TABLE: list[int] = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord framing requires."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                 scalars: dict[str, float] | None = None) -> bytes:
    """Event{wall_time=1 (double), step=2 (int64), file_version=3, summary=5{value=1{tag=1, simple_value=2}}}."""
    out = bytearray(_varint(1 << 3 | 1) + struct.pack("<d", wall_time))
    out += _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, values)
    return bytes(out)


def frame_record(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked_crc(header)) + payload + struct.pack("<I", masked_crc(payload))


class ScalarWriter:
    """Writes scalars to `<logdir>/events.out.tfevents.*` and `<logdir>/metrics.jsonl`."""

    def __init__(self, logdir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._events: IO[bytes] | None = None
        self._jsonl: IO[str] | None = None
        if not enabled:
            return
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._events = open(logdir / name, "ab")
        self._events.write(frame_record(encode_event(time.time(), 0, file_version="brain.Event:2")))
        self._jsonl = open(logdir / "metrics.jsonl", "a")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled or self._events is None or self._jsonl is None:
            return
        now = time.time()
        clean = {k: float(v) for k, v in scalars.items()}
        self._events.write(frame_record(encode_event(now, step, scalars=clean)))
        self._jsonl.write(json.dumps({"step": step, "time": now, **clean}) + "\n")
        self.flush()  # a few records a minute: cheap, and a killed run keeps its curves

    def flush(self) -> None:
        for f in (self._events, self._jsonl):
            if f is not None:
                f.flush()

    def close(self) -> None:
        for f in (self._events, self._jsonl):
            if f is not None:
                f.close()
        self._events = self._jsonl = None
