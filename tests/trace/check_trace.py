"""Checks a run folder's trace.json (framework/experiment/callbacks/trace_writer.hpp).

usage: check_trace.py TRACE_JSON WORLD FIRST_STEP LAST_STEP [--overlap]

Exits 1 with one line per failed check. --overlap: with DDP's overlap on,
some bucket's collective must start before the backward span of its step
ends, on every rank.
"""
import json
import sys

path, world, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
want_overlap = "--overlap" in sys.argv[5:]
problems = []

with open(path) as f:
    doc = json.load(f)  # a parse error fails the test with its traceback
events = doc.get("traceEvents")
if not isinstance(events, list) or not events:
    sys.exit(f"{path}: no traceEvents")
spans = [e for e in events if e.get("ph") == "X"]
meta = [e for e in events if e.get("ph") == "M"]
for e in spans:
    for key, kind in (("name", str), ("pid", int), ("tid", int), ("ts", (int, float)), ("dur", (int, float))):
        if not isinstance(e.get(key), kind):
            problems.append(f"span without a valid {key}: {e}")
    if e.get("ts", -1) < 0 or e.get("dur", -1) < 0:
        problems.append(f"negative time: {e}")
    if not first <= e.get("args", {}).get("step", -1) <= last:
        problems.append(f"span outside steps {first}-{last}: {e}")
names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
if names != {(r, f"rank {r}") for r in range(world)}:
    problems.append(f"process names {sorted(names)}, expected rank 0..{world - 1}")
if doc.get("otherData", {}).get("world_size") != world:
    problems.append(f"otherData.world_size is {doc.get('otherData', {}).get('world_size')}, expected {world}")

for rank in range(world):
    mine = [e for e in spans if e["pid"] == rank]
    for step in range(first, last + 1):
        kinds = {e["name"] for e in mine if e["args"]["step"] == step and e["tid"] == 0}
        for needed in ("data", "forward", "backward", "optimizer step"):
            if needed not in kinds:
                problems.append(f"rank {rank} step {step}: no {needed} span (has {sorted(kinds)})")
    comm = sorted((e for e in mine if e["tid"] == 1), key=lambda e: e["ts"])
    if world > 1 and not comm:
        problems.append(f"rank {rank}: no communication spans")
    if world == 1 and comm:
        problems.append(f"rank {rank}: communication spans at world size 1")
    # One stream: its spans do not overlap.
    for a, b in zip(comm, comm[1:]):
        if b["ts"] < a["ts"] + a["dur"] - 0.002:
            problems.append(f"rank {rank}: communication spans overlap: {a} / {b}")
    if want_overlap:
        overlapped = False
        for step in range(first, last + 1):
            backward = [e for e in mine if e["args"]["step"] == step and e["name"] == "backward"]
            buckets = [e for e in comm if e["args"]["step"] == step]
            if backward and any(b["ts"] < backward[0]["ts"] + backward[0]["dur"] for b in buckets):
                overlapped = True
        if not overlapped:
            problems.append(f"rank {rank}: no bucket's collective started before its step's backward ended")

for p in problems[:20]:
    print(f"check_trace: {path}: {p}")
sys.exit(1 if problems else 0)
