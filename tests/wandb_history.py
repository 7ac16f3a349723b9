"""Read a W&B offline run back from its ``.wandb`` files, without the network.

A ``.wandb`` file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then 32 KiB
blocks of records, each ``crc32 (4) | length (2) | type (1) | data``; a record split over blocks is
FIRST, MIDDLE..., LAST (type 1 is a FULL record). Every record is a protobuf ``Record`` of wandb's
own schema (``wandb.proto.wandb_internal_pb2``), parsed with it here.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # the block's tail is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == 0:
            continue
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def segments(folder: Path) -> list[Path]:
    """The offline runs under ``folder`` (``RUN_DIR/wandb``) in the order they were made."""
    def order(p: Path):
        m = re.fullmatch(r"offline-run-(\d{8}_\d{6})-(\w+?)(?:-(\d+))?", p.name)
        return m.group(1), int(m.group(3) or 0)
    return sorted((p for p in Path(folder).glob("offline-run-*") if not p.is_symlink()), key=order)


def segment(run: Path) -> dict:
    """One offline run: its id, config, the step it rewinds to (``resume_from``) and its history rows."""
    out = {"id": None, "config": {}, "rewind": None, "rows": []}
    (path,) = run.glob("run-*.wandb")
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["id"] = record.run.run_id
            out["config"] = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            if record.run.HasField("branch_point"):
                out["rewind"] = record.run.branch_point.value
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            out["rows"].append(row)
    return out


def history(folder: Path) -> tuple[list[dict], dict[int, dict]]:
    """The segments, and the run's history as W&B would hold it: step -> the row's numbers (wandb's
    ``_`` keys dropped), a segment's rewind dropping the steps after it."""
    segs, merged = [segment(run) for run in segments(folder)], {}
    for seg in segs:
        if seg["rewind"] is not None:
            merged = {s: r for s, r in merged.items() if s <= seg["rewind"]}
        for row in seg["rows"]:
            numbers = {k: v for k, v in row.items() if not k.startswith("_")}
            merged.setdefault(row["_step"], {}).update(numbers)
    return segs, merged
