#!/usr/bin/env bash
# ddp-run --schema: a valid JSON Schema (draft 2020-12) that accepts every
# file in experiments/, refuses what ddp-run refuses (each case below is
# checked against both), and knows a plugin library's plugins with
# --plugin-lib.
set -euo pipefail
ddp_run=$1
example_plugin=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$repo"
$python -c "import jsonschema" 2>/dev/null || { echo "SKIPPED: python3-jsonschema is not installed (scripts/setup.sh installs it)"; exit 0; }

"$ddp_run" --schema > "$work/schema.json"
echo "== docs/experiment.schema.json (which experiments/ name for editors) is ddp-run --schema's output"
cmp -s "$work/schema.json" docs/experiment.schema.json ||
  { echo "FAIL: docs/experiment.schema.json is stale. HINT: build/ddp-run --schema > docs/experiment.schema.json"; exit 1; }
echo "== every experiment in experiments/ is valid"
$python "$here/check_schema.py" "$work/schema.json" valid experiments/*.json

echo "== variants that ddp-run accepts are valid"
$python - "$work" <<'PY'
import json, sys
work = sys.argv[1]
base = json.load(open("experiments/wine_ddp.json"))
variants = {
    "with_schema_key": {"$schema": "../schema.json"},
    "hook_object": {"distributed": {**base.get("distributed", {}), "comm_hook": {"name": "powersgd", "rank": 2}}},
    "hook_name": {"distributed": {**base.get("distributed", {}), "comm_hook": "bf16"}},
    "model_by_name": {"model": "mlp"},
    "trace": {"training": {**base["training"], "trace": True, "trace_steps": 2}},
}
for name, change in variants.items():
    doc = {**base, **change}
    doc["training"] = {**doc["training"], "epochs": 1}
    json.dump(doc, open(f"{work}/ok_{name}.json", "w"))
PY
$python "$here/check_schema.py" "$work/schema.json" valid "$work"/ok_*.json
for f in "$work"/ok_*.json; do
  "$ddp_run" "$f" --out "$work/run_$(basename "$f" .json)" > "$work/out.txt" 2>&1 ||
    { echo "FAIL: ddp-run refused $f, which the schema accepts:"; cat "$work/out.txt"; exit 1; }
done

echo "== what ddp-run refuses, the schema refuses"
$python - "$work" <<'PY'
import json, sys
work = sys.argv[1]
base = json.load(open("experiments/wine_ddp.json"))
cases = {
    "unknown_top_key": {"trainig": {}},
    "epochs_zero": {"training": {**base["training"], "epochs": 0}},
    "epochs_float": {"training": {**base["training"], "epochs": 1.5}},
    "unknown_training_key": {"training": {**base["training"], "epoch": 3}},
    "lr_string": {"optimizer": {**base["optimizer"], "lr": "0.1"}},
    "lr_zero": {"optimizer": {**base["optimizer"], "lr": 0}},
    "unknown_model": {"model": {"name": "transformer9"}},
    "model_unknown_param": {"model": {**base["model"], "widht": 3}},
    "backend": {"distributed": {**base.get("distributed", {}), "backend": "mpi"}},
    "hook_bad_param": {"distributed": {**base.get("distributed", {}), "comm_hook": {"name": "powersgd", "rank": 0}}},
    "hook_unknown": {"distributed": {**base.get("distributed", {}), "comm_hook": "int4"}},
    "missing_model": {"model": None},
    "plugins_not_list": {"plugins": "libx.so"},
    "required_param_missing": {"dataset": "csv"},
    "name_escapes_runs": {"name": "../elsewhere"},
    "name_hidden": {"name": ".hidden"},
}
for name, change in cases.items():
    doc = {**base, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    json.dump(doc, open(f"{work}/bad_{name}.json", "w"))
PY
$python "$here/check_schema.py" "$work/schema.json" invalid "$work"/bad_*.json
for f in "$work"/bad_*.json; do
  rc=0
  "$ddp_run" "$f" --out "$work/badrun" > "$work/out.txt" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: ddp-run gave exit $rc for $f (expected 2):"; cat "$work/out.txt"; exit 1; }
  [ ! -e "$work/badrun" ] || { echo "FAIL: ddp-run made a run folder for $f"; exit 1; }
done

echo "== --plugin-lib: the example plugin's plugins are in the schema and the listing"
"$ddp_run" --plugin-lib "$example_plugin" --schema > "$work/schema_plugin.json"
$python - "$work/schema.json" "$work/schema_plugin.json" <<'PY'
import json, sys
def names(path, section):
    choices = json.load(open(path))["properties"][section]["oneOf"]
    return {c["properties"]["name"]["const"] for c in choices[1:]}
without, with_lib = (names(sys.argv[1], "model") | names(sys.argv[1], "optimizer") | names(sys.argv[1], "loss")
                     | names(sys.argv[1], "scheduler") | names(sys.argv[1], "dataset")), set()
for section in ("dataset", "model", "optimizer", "scheduler", "loss"):
    with_lib |= names(sys.argv[2], section)
added = with_lib - without
assert added, "the plugin library added no plugin to the schema"
print("added by the library:", sorted(added))
PY
"$ddp_run" --plugin-lib "$example_plugin" --list-plugins | grep -q "sum_then_divide" ||
  { echo "FAIL: --list-plugins with --plugin-lib does not show the example's comm hook"; exit 1; }
rc=0
"$ddp_run" --plugin-lib "$work/none.so" --list-plugins > "$work/out.txt" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l < "$work/out.txt")" -eq 1 ] ||
  { echo "FAIL: a missing --plugin-lib gave exit $rc:"; cat "$work/out.txt"; exit 1; }
echo "PASS"
