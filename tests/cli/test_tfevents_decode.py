#!/usr/bin/env python3
"""TensorBoard event files written by `trellis train`, checked by an independent decoder.

Runs a 5-step tiny training, then decodes every record of OUT/tb/events.out.tfevents.* with
nothing but the standard library: TFRecord framing (u64 length, masked CRC32C of the length,
payload, masked CRC32C of the payload) and a minimal protobuf reader for Event/Summary. Checks
both CRCs of every record, the leading file_version record, and that the scalars (train/loss,
train/lr, train/grad_norm, train/tokens_per_s, train/mfu, the step-time breakdown, memory, and
val/loss) equal their twins in OUT/metrics.jsonl to float32 precision.

Usage: under ctest (TRELLIS_BIN and TRELLIS_TMP set), or `test_tfevents_decode.py EVENTS_FILE...`
to decode given files and print their records.
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys


class DecodeError(Exception):
    pass


def _make_crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    """Yields the payload of every TFRecord in the file, checking framing and both CRCs."""
    with open(path, "rb") as f:
        data = f.read()
    pos, index = 0, 0
    while pos < len(data):
        where = f"{path}: record {index} at byte {pos}"
        if pos + 12 > len(data):
            raise DecodeError(f"{where}: truncated header ({len(data) - pos} bytes left)")
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        if length_crc != masked_crc32c(data[pos:pos + 8]):
            raise DecodeError(f"{where}: length CRC mismatch (stored {length_crc:#010x}, "
                              f"computed {masked_crc32c(data[pos:pos + 8]):#010x})")
        if pos + 12 + length + 4 > len(data):
            raise DecodeError(f"{where}: payload of {length} bytes runs past the end of the file")
        payload = data[pos + 12:pos + 12 + length]
        (payload_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if payload_crc != masked_crc32c(payload):
            raise DecodeError(f"{where}: payload CRC mismatch (stored {payload_crc:#010x}, "
                              f"computed {masked_crc32c(payload):#010x})")
        yield payload
        pos += 12 + length + 4
        index += 1


def _varint(buf, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def parse_proto(buf):
    """Returns [(field_number, wire_type, value)]: int for varints, bytes otherwise."""
    fields, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise DecodeError(f"field {number}: unsupported wire type {wire}")
        if pos > len(buf):
            raise DecodeError(f"field {number}: runs past the end of the message")
        fields.append((number, wire, value))
    return fields


def decode_event(payload):
    """Event -> dict(wall_time, step, file_version, scalars=[(tag, value)])."""
    event = {"wall_time": None, "step": 0, "file_version": None, "scalars": []}
    for number, wire, value in parse_proto(payload):
        if number == 1:
            if wire != 1:
                raise DecodeError(f"Event.wall_time has wire type {wire}, want 1 (double)")
            (event["wall_time"],) = struct.unpack("<d", value)
        elif number == 2:
            if wire != 0:
                raise DecodeError(f"Event.step has wire type {wire}, want 0 (varint)")
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3:
            event["file_version"] = value.decode("utf-8")
        elif number == 5:
            for vnum, vwire, vbytes in parse_proto(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, simple = None, None
                for fnum, fwire, fval in parse_proto(vbytes):
                    if fnum == 1 and fwire == 2:
                        tag = fval.decode("utf-8")
                    elif fnum == 2:
                        if fwire != 5:
                            raise DecodeError(f"Value.simple_value has wire type {fwire}, want 5")
                        (simple,) = struct.unpack("<f", fval)
                if tag is None or simple is None:
                    raise DecodeError(f"Summary.Value without tag or simple_value: {vbytes!r}")
                event["scalars"].append((tag, simple))
    return event


def decode_file(path):
    events = []
    for index, payload in enumerate(read_records(path)):
        try:
            events.append(decode_event(payload))
        except DecodeError as e:
            raise DecodeError(f"{path}: record {index}: {e}") from None
    return events


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same_float32(tb_value, json_value):
    """tb stores a float32; metrics.jsonl a double. Equal once rounded to float32 (1 ulp slack)."""
    want = float32(json_value)
    if tb_value == want:
        return True
    ulp = 2.0 ** (math.frexp(want)[1] - 24) if want != 0 else 2.0 ** -149
    return abs(tb_value - want) <= ulp


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check_run(out):
    files = sorted(glob.glob(os.path.join(out, "tb", "events.out.tfevents.*")))
    if not files:
        fail(f"no events.out.tfevents.* files in {os.path.join(out, 'tb')}")
    scalars = {}  # tag -> {step: value}
    for path in files:
        events = decode_file(path)
        if not events:
            fail(f"{path}: no records")
        first = events[0]
        if first["file_version"] != "brain.Event:2":
            fail(f"{path}: first record has file_version {first['file_version']!r}, "
                 "want 'brain.Event:2'")
        if first["wall_time"] is None or not first["wall_time"] > 1e9:
            fail(f"{path}: first record has wall_time {first['wall_time']!r}")
        for i, ev in enumerate(events[1:], start=1):
            if ev["wall_time"] is None:
                fail(f"{path}: record {i} has no wall_time")
            for tag, value in ev["scalars"]:
                per_step = scalars.setdefault(tag, {})
                if ev["step"] in per_step:
                    fail(f"{path}: record {i}: tag {tag!r} step {ev['step']} appears twice")
                per_step[ev["step"]] = value
        print(f"{path}: {len(events)} records, CRCs ok")

    metrics_path = os.path.join(out, "metrics.jsonl")
    train = {}  # step -> metrics line with "loss"
    val = {}  # step -> metrics line with "val_loss"
    with open(metrics_path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{metrics_path}:{lineno}: not JSON: {e}")
            if "loss" in obj:
                train[obj["step"]] = obj
            if "val_loss" in obj:
                val[obj["step"]] = obj

    # Validation (at the last step) lands under val/loss.
    got = scalars.get("val/loss", {})
    if sorted(got) != sorted(val) or not val:
        fail(f"'val/loss' has steps {sorted(got)}, metrics.jsonl has val_loss at {sorted(val)}")
    for step, obj in val.items():
        if not same_float32(got[step], obj["val_loss"]):
            fail(f"'val/loss' step {step}: {got[step]!r} vs val_loss {obj['val_loss']!r}")
    print(f"val/loss: steps {sorted(val)} match metrics.jsonl 'val_loss'")

    steps = [1, 2, 3, 4, 5]
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                     ("train/tokens_per_s", "tokens_per_s"), ("train/mfu", "mfu"),
                     ("train/step_ms", "step_ms"), ("train/compute_ms", "compute_ms"),
                     ("train/mem_bytes_max", "mem_bytes_max")):
        got = scalars.get(tag)
        if got is None:
            fail(f"no scalar {tag!r} in the event files (tags: {sorted(scalars)})")
        if sorted(got) != steps:
            fail(f"{tag!r} has steps {sorted(got)}, want {steps}")
        for step in steps:
            if step not in train or key not in train[step]:
                fail(f"{metrics_path}: no {key!r} at step {step}")
            want = train[step][key]
            if not same_float32(got[step], want):
                fail(f"{tag!r} step {step}: events hold {got[step]!r}, metrics.jsonl has "
                     f"{key}={want!r} (float32 {float32(want)!r})")
        print(f"{tag}: steps {steps} match metrics.jsonl {key!r}")


def main(argv):
    if len(argv) > 1:  # debugging aid: decode the given files
        for path in argv[1:]:
            for i, ev in enumerate(decode_file(path)):
                print(i, ev)
        return 0
    binary = os.environ.get("TRELLIS_BIN")
    tmp = os.environ.get("TRELLIS_TMP")
    if not binary or not tmp:
        fail("TRELLIS_BIN and TRELLIS_TMP must be set (run under ctest)")
    out = os.path.join(tmp, "run")
    shutil.rmtree(out, ignore_errors=True)  # stale event files from an earlier run would mix in
    os.makedirs(tmp, exist_ok=True)
    cmd = [binary, "train", "--model", "tiny", "--steps", "5", "--out", out, "--quiet"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    if proc.returncode != 0:
        fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}")
    try:
        check_run(out)
    except DecodeError as e:
        fail(str(e))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
