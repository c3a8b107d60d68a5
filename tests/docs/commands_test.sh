#!/usr/bin/env bash
# Keeps the docs true (issue 32): runs every command example of README.md
# and docs/*.md that uses this project's programs (build/ddp-run,
# build/benchmarks/ddp-bench, scripts/ddp-plot), in a scratch folder per
# file (experiments/ linked in), with the built programs, two at a time: a
# command that names a path an earlier one of its file names (a run folder
# it resumes or plots, a file it loads) runs after it, as the file orders
# them. Commands are shortened where that
# changes nothing else they show (issue 40: the whole test in under two
# minutes): training to one epoch of at most 4 steps, benchmarks to the
# fewest steps and smallest sizes that still run their code paths (see
# `shorten` below). A command that, shortened, is one already run (in this
# file or another) is not run again: what it wrote there is copied here
# and it is listed as such. Each must exit with 0. Commands that need what this test cannot give are skipped with the
# reason printed: several nodes, a GPU where there is none, root (network
# namespaces), matplotlib where it is absent, a placeholder file the text
# invents, a command shown failing on purpose. The set-up scripts
# (scripts/setup.sh, run.sh, test.sh) set up and run this test, package.sh
# builds the Debian package, and the installed-package steps are ctest's
# install.* tests: they are listed as skipped with that reason.
#
#   tests/docs/commands_test.sh path/to/ddp-run [path/to/ddp-bench]
set -euo pipefail
ddp_run=$(realpath "${1:?usage: commands_test.sh path/to/ddp-run [path/to/ddp-bench]}")
ddp_bench=$(realpath "${2:-$(dirname "$ddp_run")/benchmarks/ddp-bench}" 2>/dev/null || true)
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
/usr/bin/python3 - "$src" "$ddp_run" "$work" "$ddp_bench" <<'PY'
import importlib.util, os, re, shlex, shutil, subprocess, sys, threading, time
src, ddp_run, work, ddp_bench = sys.argv[1:5]
docs = [os.path.join(src, "README.md")] + sorted(
    os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
gpu = "(CUDA" in subprocess.run([ddp_run, "--version"], stdout=subprocess.PIPE, text=True).stdout
skips = [("--nnodes", "needs a second node"), ("exp.json", "a placeholder experiment file"),
         ("typo_train.json", "shown failing on purpose"), ("$PREFIX", "needs an installed package"),
         ("init_from=start.pt", "needs the file the Python lines beside it write"),
         ("sudo ", "needs root (network namespaces); ctest cluster.* runs it where it may"),
         ("--hosts", "needs root (network namespaces); ctest cluster.* runs it where it may")]
if not gpu:
    skips += [("device=cuda", "needs a GPU; ddp-run --version says this build has none"),
              ("backend=nccl", "needs a GPU; ddp-run --version says this build has none"),
              ("--device cuda", "needs a GPU; ddp-run --version says this build has none")]
if importlib.util.find_spec("matplotlib") is None:
    skips += [("ddp-plot", "needs matplotlib (python3-matplotlib)"), ("--plot", "needs matplotlib (python3-matplotlib)")]
if not os.access(ddp_bench or "/nonexistent", os.X_OK):
    skips += [("ddp-bench", "ddp-bench is not built (scripts/test.sh builds it)")]
# Programs of this project a documented command may start with, and where
# they are here. The set-up scripts run this very test, and the install steps
# are ctest's install.* tests.
programs = {"build/ddp-run": ddp_run, "build/benchmarks/ddp-bench": ddp_bench,
            "scripts/ddp-plot": os.path.join(src, "scripts", "ddp-plot")}
elsewhere = {"./scripts/run.sh": "runs ddp-run as set-up does; scripts/test.sh runs this test",
             "./scripts/test.sh": "runs this very test", "./scripts/setup.sh": "set-up, which ran before this test",
             "./scripts/package.sh": "builds the Debian package (minutes of packaging); ctest install.find_package_consumer checks the installed tree it packs"}

# What each ddp-bench subcommand's options become: fewer and smaller
# iterations, the same code paths. A value the command gives is replaced.
bench_short = {
    "collectives": {"--min-bytes": "4K", "--max-bytes": "64K", "--size-factor": "16", "--warmup": "1", "--iters": "2"},
    "wine": {"--repeats": "1"},
    "train-step": {"--steps": "2", "--warmup": "1", "--repeats": "1"},  # at world size 2 where it names none (below)
    "lm": {"--seeds": "0", "--tolerance": "100"},  # and a toy gpt on a slice of the text (below)
    # A toy model: every strategy and the PyTorch side still run.
    "strategies": {"--steps": "1", "--warmup": "1", "--batch": "2"},
    # One model, two steps: the comparison and its table run; at this size
    # the ratios are noise, so no change is called slower here.
    "regress": {"--models": "mlp", "--steps": "2", "--warmup": "1", "--repeats": "1", "--min-tolerance": "1000"},
}
# strategies at a toy size, per --model (mlp is the default).
strategies_toy = {"mlp": {"--widths": "64,64,64"},
                  "gpt": {"--gpt-layers": "1", "--gpt-width": "64", "--gpt-block": "16"}}

def with_options(words, options):
    words = list(words)
    for name, value in options.items():
        if name in words:
            words[words.index(name) + 1] = value
        else:
            words += [name, value]
    return words

def shorten(words):
    program = words[0]
    if program == "build/ddp-run":
        informational = any(w in words for w in ("--describe", "--list-plugins", "--schema", "--version", "--sample",
                                                 "--export", "--demo", "--help"))
        if informational:
            # A sample of a few tokens: the same model, loaded the same way.
            return with_options(words, {"--tokens": "20"}) if "--sample" in words else words
        return words + ["--set", "training.epochs=1", "--set", "training.max_steps=4", "--set", "training.save_every=1"]
    if program == "build/benchmarks/ddp-bench":
        sub = words[1] if len(words) > 1 else ""
        if "--plan" in words or "--help" in words:
            return words
        words = with_options(words, bench_short.get(sub, {}))
        # Every process starts LibTorch (0.7 s of CPU): world size 2 alone,
        # the DDP path with its communication (tests/bench/smoke_test.sh
        # runs world size 1 and the wrapped single rank).
        if sub == "train-step" and "--world-sizes" not in words and "--sweep" not in words:
            words += ["--world-sizes", "2"]
        # The gpt at one layer: the same code paths, a third less start-up.
        if sub == "train-step" and "gpt" in words and not any(w.startswith("model.n_layer=") for w in words):
            words += ["--set", "model.n_layer=1"]
        if sub == "train-step" and "--sweep" in words:  # one bucket size, overlap on and off
            words = with_options(words, {"--sweep-buckets": "25"})
        if sub == "strategies":
            model = words[words.index("--model") + 1] if "--model" in words else "mlp"
            words = with_options(words, strategies_toy.get(model, {}))
        if sub == "lm":
            words += ["--set", "training.max_steps=4", "--set", "dataset.max_bytes=20000", "--set", "model.n_layer=1",
                      "--set", "model.n_embd=32", "--set", "model.n_head=2"]
        return words
    return words

def canonical(words):
    """A command with its options in a fixed order: the same command however its options are ordered."""
    head, pairs, i = [], [], 0
    while i < len(words) and not words[i].startswith("-"):
        head.append(words[i])
        i += 1
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("-"):
            pairs.append((words[i], words[i + 1]))
            i += 2
        else:
            pairs.append((words[i], ""))
            i += 1
    return tuple(head) + tuple(sorted(pairs))

def written(words, redirect):
    """The paths a command writes that a later one may read."""
    paths = [words[words.index(f) + 1] for f in ("--json", "--plot", "-o", "--out")
             if f in words and words.index(f) + 1 < len(words)]
    target = redirect.strip().lstrip(">").strip()
    if target:
        paths.append(target.split()[0])
    return [p for p in paths if not os.path.isabs(p)]

def paths(words, redirect):
    """Every file or folder a command names that another command may write or read (not experiments/)."""
    found = set(written(words, redirect))
    for word in words[1:]:
        if word.startswith("-"):
            continue
        value = word.split("=", 1)[1] if "=" in word else word
        if value.startswith("experiments/") or value.startswith("/"):
            continue
        if "/" in value or os.path.splitext(value)[1] in (".json", ".png", ".pt", ".safetensors", ".csv", ".npy"):
            found.add(value.rstrip("/"))
    return found

def conflict(a, b):
    """Two commands must keep their order: one names a path the other writes or reads (a prefix either way)."""
    return any(p == q or p.startswith(q + "/") or q.startswith(p + "/") for p in a for q in b)

# The plan: every document's entries in its order, each a line to print
# (skipped), a command to run, or a command run already elsewhere.
first = {}             # a shortened command -> the entry that runs it
plan = {}
for doc in docs:
    entries = plan[doc] = []
    name = os.path.relpath(doc, src)
    lines = open(doc).read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("$ "):
            line = line[2:]
        bare = line[5:] if line.startswith("sudo ") else line
        if bare.split(" ")[0] in elsewhere:
            entries.append({"print": f"SKIPPED ({elsewhere[bare.split(' ')[0]]}): {name}: {line}"})
            continue
        if not any(bare.startswith(p + " ") for p in programs):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        command = re.sub(r"\s+#.*$", "", line).strip()
        reason = next((why for key, why in skips if key in command), None)
        where = f"{name}: {command}"
        if reason:
            entries.append({"print": f"SKIPPED ({reason}): {where}"})
            continue
        redirect = ""
        if ">" in command:
            command, redirect = command.split(">", 1)
            redirect = " >" + redirect
        words = shorten(shlex.split(command))
        key = (canonical(words), redirect.strip())
        if key in first:
            entries.append({"same": first[key], "where": where, "words": words, "redirect": redirect,
                            "paths": paths(words, redirect), "done": threading.Event()})
            continue
        # PyTorch's side of train-step, strategies and regress: seconds of
        # Python a line, run by ctest's bench.smoke.* (tests/bench/smoke_test.sh,
        # for the mlp, the cnn and the gpt, and regress on the mlp); here the
        # lines add --no-reference.
        if words[0] == "build/benchmarks/ddp-bench" and len(words) > 1 and words[1] in ("train-step", "strategies", "regress"):
            if "--no-reference" not in words and "--plan" not in words and "--sweep" not in words and "--record" not in words:
                words = words + ["--no-reference"]
                where += "  [--no-reference: bench.smoke.* runs PyTorch's side]"
        entry = {"run": words, "redirect": redirect, "where": where, "doc": name, "done": threading.Event(),
                 "paths": paths(words, redirect)}
        first[key] = entry
        entries.append(entry)

# Every command on a thread of its own, at most two running at once (the
# machine's cores). A command waits for each earlier command of its
# document that names a path it names (a run folder it resumes, a file it
# plots or loads, a file both write), so a document's order holds wherever
# it matters. A command run already elsewhere waits for that run, then
# takes a copy of what it wrote.
slots = threading.Semaphore(2)
lock = threading.Lock()
counts = {"ran": 0, "failed": 0, "skipped": 0}
folders = {}

def run_entry(doc, index):
    folder, entry = folders[doc], plan[doc][index]
    try:
        for earlier in plan[doc][:index]:
            if "paths" in earlier and conflict(entry["paths"], earlier["paths"]):
                earlier["done"].wait()
        entry["lines"] = run_one(folder, entry)
    finally:
        entry["done"].set()

def run_one(folder, entry):
    if "same" in entry:
        original = entry["same"]
        original["done"].wait()
        if not original.get("ok"):
            return [f"not run (it failed in {original['doc']}): {entry['where']}"]
        for path in written(entry["words"], entry["redirect"]):
            source, target = os.path.join(original["folder"], path), os.path.join(folder, path)
            if os.path.exists(source) and not os.path.exists(target):
                os.makedirs(os.path.dirname(target) or folder, exist_ok=True)
                (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, target)
        return [f"ran already ({original['doc']}): {entry['where']}"]
    words, redirect = entry["run"], entry["redirect"]
    # Files the command writes (--json, --plot, -o) go where it says, below the scratch folder.
    for flag in ("--json", "--plot", "-o", "--out"):
        if flag in words and words.index(flag) + 1 < len(words):
            parent = os.path.dirname(words[words.index(flag) + 1])
            if parent and not os.path.isabs(parent):
                os.makedirs(os.path.join(folder, parent), exist_ok=True)
    run = " ".join([shlex.quote(programs[words[0]])] + [shlex.quote(w) for w in words[1:]]) + redirect
    code, output = "not run", ""
    with slots:
        started = time.monotonic()
        try:
            result = subprocess.run(["bash", "-c", run], cwd=folder, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, timeout=300)
            code, output = result.returncode, result.stdout
        except subprocess.TimeoutExpired as e:
            code, output = "timeout after 300 s", (e.stdout or b"").decode(errors="replace")
        except OSError as e:
            code, output = f"not started ({e})", ""
        took = time.monotonic() - started
    entry["folder"], entry["ok"] = folder, code == 0
    with lock:
        counts["ran"] += 1
        counts["failed"] += code != 0
    if code != 0:
        return [f"FAILED (exit code {code}): {entry['where']}"] + ["    | " + l for l in output.splitlines()[-15:]]
    return [f"ok ({took:.1f} s): {entry['where']}"]

threads = []
for doc in docs:
    folder = folders[doc] = os.path.join(work, os.path.basename(doc))
    os.makedirs(folder)
    os.symlink(os.path.join(src, "experiments"), os.path.join(folder, "experiments"))
    for index, entry in enumerate(plan[doc]):
        if "print" in entry:
            counts["skipped"] += 1
        else:
            threads.append(threading.Thread(target=run_entry, args=(doc, index)))
started_all = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
for doc in docs:
    for entry in plan[doc]:
        print(entry["print"] if "print" in entry else "\n".join(entry.get("lines", [f"not run: {entry['where']}"])))
print(f"docs commands: {counts['ran']} run, {counts['failed']} failed, {counts['skipped']} skipped, "
      f"in {time.monotonic() - started_all:.0f} s")
sys.exit(1 if counts["failed"] else 0)
PY
