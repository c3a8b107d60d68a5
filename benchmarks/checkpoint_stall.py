#!/usr/bin/python3
"""How long training stands still per checkpoint, each rank's peak RSS and the
bytes written, for consolidated, sharded and sharded asynchronous saves
(docs/performance.md, "Sharded and asynchronous checkpoints"): the 51.9M gpt
(experiments/char_gpt.json at 13 layers x 576) under fsdp on 2 ranks, three
epochs of a 6 KB corpus, a checkpoint after each; the modes are taken in turn,
ROUNDS times, and one JSON record per run is printed (and all of them written
to OUT_DIR/results.json). Peak RSS is each rank's VmHWM, read every 50 ms.

usage (from the source folder): /usr/bin/python3 benchmarks/checkpoint_stall.py BUILD_DIR OUT_DIR ROUNDS"""
import json, os, re, subprocess, sys, time, glob, shutil

if len(sys.argv) != 4 or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
    sys.exit("usage: benchmarks/checkpoint_stall.py BUILD_DIR OUT_DIR ROUNDS (ROUNDS >= 1; run from the source folder)")
build, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not os.access(f"{build}/ddp-run", os.X_OK):
    sys.exit(f"checkpoint_stall.py: no ddp-run in {build}. HINT: give the build folder, e.g. build")
os.makedirs(out, exist_ok=True)
modes = {
    "none": ["training.save_every=0"],
    "consolidated": ["training.checkpoint_format=consolidated"],
    "sharded": ["training.checkpoint_format=sharded"],
    "sharded+async": ["training.checkpoint_format=sharded", "training.async_checkpoint=true"],
}
base = ["model.n_layer=13", "model.n_embd=576", "model.n_head=9", "model.dropout=0",
        "distributed.strategy=fsdp", "dataset.max_bytes=6000", "training.epochs=3",
        "training.batch_size=8", "training.save_every=1", "training.eval_every=100"]

def hwm(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

def children(pid):
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []

results = []
for r in range(rounds):
    for mode, sets in modes.items():
        run = f"{out}/{mode}-{r}"
        shutil.rmtree(run, ignore_errors=True)
        args = [f"{build}/ddp-run", "experiments/char_gpt.json", "--nproc-per-node", "2", "--out", run]
        for s in base + sets:
            args += ["--set", s]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peaks = {}
        while p.poll() is None:
            for c in children(p.pid):
                peaks[c] = max(peaks.get(c, 0), hwm(c))
            time.sleep(0.05)
        output = p.stdout.read()
        if p.returncode != 0:
            print(output[-3000:]); sys.exit(f"{mode}: exit {p.returncode}")
        log = open(f"{run}/train.log").read()
        stalls = [float(x) for x in re.findall(r"stood still ([0-9.]+) s", log)]
        files = {}
        for f in glob.glob(f"{run}/checkpoints/**/*", recursive=True):
            if os.path.isfile(f):
                files[os.path.relpath(f, run)] = os.path.getsize(f)
        rec = {"mode": mode, "round": r, "stalls_s": stalls, "rank_peak_rss": sorted(peaks.values(), reverse=True),
               "files": len(files), "bytes": sum(files.values()),
               "largest_files": sorted(files.items(), key=lambda kv: -kv[1])[:4]}
        print(json.dumps(rec), flush=True)
        results.append(rec)
json.dump(results, open(f"{out}/results.json", "w"), indent=1)
