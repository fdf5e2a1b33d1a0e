"""Reads a TensorBoard log folder as TensorBoard does and prints what it sees as JSON.

    read_tensorboard.py LOG_DIR

"scalars" and "texts" are what TensorBoard's EventAccumulator shows (after its purge of the
steps a resumed run wrote again); "files" is every record of every event file, each one's CRCs
checked strictly (the accumulator only logs a bad record and stops reading that file).
Exits 77 if tensorboard cannot be imported (the C++ test then skips), 1 on a corrupt file.
"""
import glob
import json
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as error:
    print(f"tensorboard is not importable: {error}", file=sys.stderr)
    sys.exit(77)


def number(x):
    # JSON has no NaN or infinity: name them.
    return x if math.isfinite(x) else repr(x)


def strict_records(path):
    """The serialized records of one event file; raises on a bad CRC or a torn record."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: torn header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if masked_crc32c(header) != header_crc:
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12 : pos + 12 + length]
        if len(body) < length or pos + 16 + length > len(data):
            raise ValueError(f"{path}: torn record at byte {pos}")
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        if masked_crc32c(body) != body_crc:
            raise ValueError(f"{path}: bad data CRC at byte {pos}")
        yield body
        pos += 16 + length


def describe(record):
    event = event_pb2.Event.FromString(record)
    out = {"step": event.step, "wall_time": event.wall_time}
    if event.HasField("file_version"):
        out["file_version"] = event.file_version
    if event.HasField("session_log"):
        out["session_log"] = event_pb2.SessionLog.SessionStatus.Name(event.session_log.status)
    if event.HasField("summary"):
        out["tags"] = [value.tag for value in event.summary.value]
    return out


def main():
    log_dir = sys.argv[1]
    files = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*tfevents*"))):
        try:
            events = [describe(r) for r in strict_records(path)]
        except ValueError as error:
            print(error, file=sys.stderr)
            return 1
        files.append({"name": os.path.basename(path), "events": events})

    accumulator = event_accumulator.EventAccumulator(
        log_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {
        tag: [{"step": e.step, "value": number(e.value), "wall_time": e.wall_time}
              for e in accumulator.Scalars(tag)]
        for tag in tags["scalars"]
    }
    texts = {
        tag: [{"step": e.step, "text": e.tensor_proto.string_val[0].decode("utf-8")}
              for e in accumulator.Tensors(tag)]
        for tag in tags["tensors"]
    }
    print(json.dumps({"scalars": scalars, "texts": texts, "files": files}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
