#!/usr/bin/env python3
"""Validate JSON files against a JSON Schema (Draft 7).

Usage: validate_json.py [--expect-invalid] SCHEMA FILE...

Checks SCHEMA itself, then each FILE. Prints one line per invalid file,
"FILE: POINTER: message", for the most relevant error (best_match), and
exits 1 if any file is invalid; otherwise prints "N files valid", exits 0.
With --expect-invalid the test is inverted: exits 0 only if every FILE is
rejected, and names each file that was wrongly accepted.
"""
import argparse
import json
import sys

from jsonschema import Draft7Validator
from jsonschema.exceptions import best_match


def pointer(path):
    """RFC 6901 JSON pointer of a jsonschema error path ("" is the root)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def problem(validator, path):
    """Why the file at path is invalid, or None if it is valid."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return f"cannot read JSON: {e}"
    error = best_match(validator.iter_errors(doc))
    return None if error is None else f"{pointer(error.absolute_path) or '/'}: {error.message}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-invalid", action="store_true", help="succeed only if every file is rejected")
    parser.add_argument("schema")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    with open(args.schema, encoding="utf-8") as f:
        schema = json.load(f)
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)

    failed = 0
    for path in args.files:
        why = problem(validator, path)
        if args.expect_invalid:
            if why is None:
                print(f"{path}: accepted, but expected to be invalid")
                failed += 1
            else:
                print(f"{path}: rejected as expected: {why}")
        elif why is not None:
            print(f"{path}: {why}")
            failed += 1
    if failed:
        return 1
    print(f"{len(args.files)} files " + ("rejected" if args.expect_invalid else "valid"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
