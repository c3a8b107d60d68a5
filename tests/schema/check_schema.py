"""Validates experiment files against `ddp-run --schema` (draft 2020-12).

usage: check_schema.py SCHEMA_JSON valid|invalid FILE...
Checks the schema itself, then that every FILE is valid (or each invalid),
printing one line per file that is not as expected; exit 1 if any.
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("SKIPPED: python3-jsonschema is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

schema_path, want, files = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(schema_path) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
bad = 0
for path in files:
    with open(path) as f:
        doc = json.load(f)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if want == "valid" and errors:
        bad += 1
        print(f"{path}: refused by the schema: /{'/'.join(map(str, errors[0].absolute_path))}: {errors[0].message[:300]}")
    if want == "invalid" and not errors:
        bad += 1
        print(f"{path}: accepted by the schema, but ddp-run refuses it")
sys.exit(1 if bad else 0)
