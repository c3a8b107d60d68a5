#!/usr/bin/env bash
# Keeps the docs true (issue 32): runs every `build/ddp-run ...` command of
# README.md and docs/*.md, in the order each file gives them, in a scratch
# folder (experiments/ linked in), with the built ddp-run. Training commands
# are shortened with --set training.epochs=1 --set training.max_steps=4
# (which changes nothing else they show); each must exit with 0. Commands
# that need what this test cannot give are skipped with the reason printed:
# several nodes (--nnodes), a GPU (nccl, cuda) where there is none, a
# placeholder file the text invents, a command shown failing on purpose.
#
#   tests/docs/commands_test.sh path/to/ddp-run
set -euo pipefail
ddp_run=$(realpath "${1:?usage: commands_test.sh path/to/ddp-run}")
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
/usr/bin/python3 - "$src" "$ddp_run" "$work" <<'PY'
import os, re, shlex, subprocess, sys
src, ddp_run, work = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [os.path.join(src, "README.md")] + sorted(
    os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
gpu = "(CUDA" in subprocess.run([ddp_run, "--version"], stdout=subprocess.PIPE, text=True).stdout
skips = [("--nnodes", "needs a second node"), ("exp.json", "a placeholder experiment file"),
         ("typo_train.json", "shown failing on purpose"), ("$PREFIX", "needs an installed package")]
if not gpu:
    skips += [("device=cuda", "needs a GPU; ddp-run --version says this build has none"),
              ("backend=nccl", "needs a GPU; ddp-run --version says this build has none")]
ran = skipped = failed = 0
for doc in docs:
    folder = os.path.join(work, os.path.basename(doc))
    os.makedirs(folder)
    os.symlink(os.path.join(src, "experiments"), os.path.join(folder, "experiments"))
    lines = open(doc).read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("$ "):
            line = line[2:]
        if not line.startswith("build/ddp-run "):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        command = re.sub(r"\s+#.*$", "", line).strip()
        reason = next((why for key, why in skips if key in command), None)
        where = f"{os.path.relpath(doc, src)}: {command}"
        if reason:
            print(f"SKIPPED ({reason}): {where}")
            skipped += 1
            continue
        words = shlex.split(command.split(">")[0])
        informational = any(w in words for w in ("--describe", "--list-plugins", "--schema", "--version", "--sample",
                                                 "--demo", "--help"))
        run = command.replace("build/ddp-run", shlex.quote(ddp_run), 1)
        if not informational:
            redirect = ""
            if ">" in run:
                run, redirect = run.split(">", 1)
                redirect = " >" + redirect
            run = run.rstrip() + " --set training.epochs=1 --set training.max_steps=4 --set training.save_every=1" + redirect
        result = subprocess.run(["bash", "-c", run], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=300)
        ran += 1
        if result.returncode != 0:
            failed += 1
            print(f"FAILED (exit code {result.returncode}): {where}")
            print("\n".join("    | " + l for l in result.stdout.splitlines()[-15:]))
        else:
            print(f"ok: {where}")
print(f"docs commands: {ran} run, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
