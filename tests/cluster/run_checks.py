#!/usr/bin/env python3
"""Checks on ddp-run's run folders, for the cluster tests (standard library only).

  run_checks.py final DIR [--min-accuracy A]
      DIR/metrics.jsonl exists, its last record has test_accuracy >= A, and
      DIR/checkpoints holds the checkpoint of the last epoch.

  run_checks.py same DIR_A DIR_B
      Both runs are the same training: metrics.jsonl identical record by
      record except the wall-clock "seconds", and every checkpoint
      identical tensor by tensor (name, dtype, shape, stride and bytes).

  run_checks.py elastic DIR --worlds W1,W2,... [--first N] [--epochs E]
                [--like PLAIN_DIR] [--min-accuracy A]
      An in-place recovery: DIR/steps.jsonl has every step 1..N once; the
      world size, run by run, changes as W1,W2,... says (4,2: 4 then 2);
      --first: steps 1..N all at W1; --epochs: metrics.jsonl has epochs
      1..E; --like: the epochs of PLAIN_DIR, and a final test_accuracy
      within 0.05 of its.

A checkpoint is LibTorch's zip archive: data.pkl (a pickle of modules whose
tensors point at data/<key>) plus the data files. The data files are numbered
in an order that depends on memory addresses, and optimizer state is keyed
by parameter addresses (strings that param_groups/0/params/N repeat), so the
archives are compared by name, not byte for byte: optimizer state is renamed
after the parameter's index in param_groups/0/params.
"""
import collections
import json
import os
import pickle
import re
import sys
import zipfile


class _Module:
    """Stands in for the archive's __torch__.* classes; BUILD fills __dict__."""


class _Tensor:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return lambda storage, offset, size, stride, *rest: _Tensor(storage, offset, size, stride)
        if module == "torch" and name.endswith("Storage"):
            return name
        if module.startswith("__torch__"):
            return type(name, (_Module,), {})
        raise pickle.UnpicklingError("unexpected class %s.%s in checkpoint" % (module, name))

    def persistent_load(self, pid):
        # ('storage', <type>, key, location, numel)
        return (pid[1], pid[2], pid[4])


def load_checkpoint(path):
    """name -> value (scalars as repr, tensors as (dtype, size, stride, offset, bytes))."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise SystemExit("%s: not a LibTorch archive (no data.pkl)" % path)
        prefix = pkl[0][: -len("data.pkl")]
        root = _Unpickler(z.open(pkl[0])).load()

        # Pass 1: the state keys (parameter addresses, as strings) from param_groups/*/params/N.
        param_name = {}

        def find_params(obj):
            if isinstance(obj, _Module):
                for k, v in vars(obj).items():
                    m = re.fullmatch(r"params/(\d+)", k)
                    if m:
                        param_name[v] = "param%s" % m.group(1)
                    find_params(v)

        find_params(root)

        leaves = {}

        def walk(obj, path):
            if isinstance(obj, _Tensor):
                dtype, key, numel = obj.storage
                leaves[path] = (dtype, obj.size, obj.stride, obj.offset, z.read(prefix + "data/" + key))
            elif isinstance(obj, (_Module, dict)):
                items = vars(obj).items() if isinstance(obj, _Module) else obj.items()
                for k, v in items:
                    if re.fullmatch(r"params/\d+", k):
                        leaves[path + "/" + k] = param_name[v]
                        continue
                    if re.fullmatch(r"0x[0-9a-f]+", k):
                        if k not in param_name:
                            raise SystemExit("%s: optimizer state %s belongs to no parameter" % (path, k))
                        k = param_name[k]
                    walk(v, path + "/" + k)
            elif isinstance(obj, (list, tuple)):
                for i, v in enumerate(obj):
                    walk(v, "%s[%d]" % (path, i))
            else:
                leaves[path] = repr(obj)

        walk(root, "")
        return leaves


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise SystemExit("%s is missing" % path)
    records = []
    with open(path) as f:
        for line in f:
            if line.strip():
                # The numbers as text: json would round-trip them, the text is stricter still.
                # Times (each rank's compute and wait too) and the peak resident memory depend on the
                # machine, not the training.
                records.append(re.sub(r',\s*"((data_)?seconds|peak_rss_bytes|rank_\d+_(compute|comm_wait)_s)":\s*[-+0-9.eE]+',
                                      "", line.strip()))
    if not records:
        raise SystemExit("%s is empty" % path)
    return records


def checkpoints(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return sorted(n for n in os.listdir(d) if n.endswith(".pt")) if os.path.isdir(d) else []


def cmd_final(run_dir, min_accuracy):
    records = read_metrics(run_dir)
    last = json.loads(records[-1])
    acc = last.get("test_accuracy")
    if acc is None or acc < min_accuracy:
        raise SystemExit("%s: final test_accuracy %s is below %s" % (run_dir, acc, min_accuracy))
    want = "epoch_%06d.pt" % last["epoch"]
    if want not in checkpoints(run_dir):
        raise SystemExit("%s: no checkpoint %s (have %s)" % (run_dir, want, checkpoints(run_dir)))
    print("final: epoch %d, train_loss %s, test_accuracy %s, checkpoint %s" %
          (last["epoch"], last["train_loss"], acc, want))


def cmd_same(a, b):
    ma, mb = read_metrics(a), read_metrics(b)
    if len(ma) != len(mb):
        raise SystemExit("metrics differ: %d records in %s, %d in %s" % (len(ma), a, len(mb), b))
    for ra, rb in zip(ma, mb):
        if ra != rb:
            raise SystemExit("metrics differ:\n  %s: %s\n  %s: %s" % (a, ra, b, rb))
    ca, cb = checkpoints(a), checkpoints(b)
    if not ca or ca != cb:
        raise SystemExit("checkpoints differ: %s has %s, %s has %s" % (a, ca, b, cb))
    tensors = elements = 0
    for name in ca:
        la = load_checkpoint(os.path.join(a, "checkpoints", name))
        lb = load_checkpoint(os.path.join(b, "checkpoints", name))
        if sorted(la) != sorted(lb):
            raise SystemExit("%s: entries differ: %s" % (name, sorted(set(la) ^ set(lb))))
        for key in sorted(la):
            if la[key] != lb[key]:
                raise SystemExit("%s: %s differs between %s and %s" % (name, key, a, b))
            if isinstance(la[key], tuple):
                tensors += 1
                elements += len(la[key][4])
    print("same: %d metrics records identical (all but seconds); %d checkpoints, %d tensors, %d bytes identical" %
          (len(ma), len(ca), tensors, elements))


def read_jsonl(path):
    if not os.path.isfile(path):
        raise SystemExit("%s is missing" % path)
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cmd_elastic(run_dir, worlds, first, epochs, like, min_accuracy):
    steps = read_jsonl(os.path.join(run_dir, "steps.jsonl"))
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    failures = []
    numbers = [s["step"] for s in steps]
    if not numbers or numbers != list(range(1, len(numbers) + 1)):
        failures.append("steps not 1..N once: %s" % numbers[:40])
    sizes = [s["world_size"] for s in steps]
    changes = [w for i, w in enumerate(sizes) if i == 0 or w != sizes[i - 1]]
    if changes != worlds:
        failures.append("world sizes %s as they changed, expected %s" % (changes, worlds))
    if first and sizes[:first] != [worlds[0]] * first:
        failures.append("steps 1-%d not all at world %d: %s" % (first, worlds[0], sizes[:first]))
    got = [m["epoch"] for m in metrics]
    if epochs and got != list(range(1, epochs + 1)):
        failures.append("epochs %s, expected 1..%d" % (got[:5], epochs))
    accuracy = metrics[-1].get("test_accuracy") if metrics else None
    reference = ""
    if like:
        plain = read_jsonl(os.path.join(like, "metrics.jsonl"))
        if got != [m["epoch"] for m in plain]:
            failures.append("epochs %s against the unfailed run's %s" % (got, [m["epoch"] for m in plain]))
        b = plain[-1].get("test_accuracy")
        reference = " (unfailed %s)" % b
        if accuracy is None or b is None or abs(accuracy - b) > 0.05:
            failures.append("final test accuracy %s not within 0.05 of the unfailed run's %s" % (accuracy, b))
    if min_accuracy is not None and (accuracy is None or accuracy < min_accuracy):
        failures.append("final test accuracy %s below %s" % (accuracy, min_accuracy))
    for f in failures:
        print("  not so:", f)
    if failures:
        raise SystemExit("%s: not an in-place recovery as expected" % run_dir)
    switch = " after step %d" % sizes.index(changes[1]) if len(changes) > 1 else ""
    print("elastic: %d steps once, world %s%s; %d epochs, final test_accuracy %s%s" %
          (len(numbers), " -> ".join(map(str, changes)), switch, len(metrics), accuracy, reference))


def option(argv, name, convert, default=None):
    return convert(argv[argv.index(name) + 1]) if name in argv else default


def main(argv):
    if len(argv) >= 4 and argv[0] == "elastic" and "--worlds" in argv:
        cmd_elastic(argv[1], option(argv, "--worlds", lambda t: [int(w) for w in t.split(",")]),
                    option(argv, "--first", int, 0), option(argv, "--epochs", int, 0), option(argv, "--like", str),
                    option(argv, "--min-accuracy", float))
        return
    if len(argv) >= 2 and argv[0] == "final":
        min_accuracy = 0.0
        if "--min-accuracy" in argv:
            min_accuracy = float(argv[argv.index("--min-accuracy") + 1])
        cmd_final(argv[1], min_accuracy)
    elif len(argv) == 3 and argv[0] == "same":
        cmd_same(argv[1], argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
