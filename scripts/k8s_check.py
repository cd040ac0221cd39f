#!/usr/bin/env python3
"""Check packaging/k8s/*.yaml against the Kubernetes API schemas (apps/v1, v1).

Every object is built, field by field, into the model classes of the official `kubernetes`
Python client (generated from the API's OpenAPI schema): an unknown field, a wrong type, a
missing required field or a value outside an enum is an error naming the file, object and
field path. kubeconform is not packaged in Debian, and the packaged kubectl's client dry-run
needs an API server; this check needs neither.

Usage: k8s_check.py FILE... (exit 0: all valid). Needs `pip install kubernetes pyyaml`.
"""
import re
import sys

import yaml
from kubernetes import client

KINDS = {("apps/v1", "DaemonSet"): "V1DaemonSet", ("v1", "Service"): "V1Service"}


class Invalid(Exception):
    pass


def build(value, type_name, path):
    """`value` (parsed YAML) as an instance of the client's `type_name`."""
    if type_name in ("object", "datetime"):
        return value
    m = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            raise Invalid(f"{path}: expected a list, found {type(value).__name__}")
        return [build(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(value)]
    m = re.fullmatch(r"dict\((\w+), (.+)\)|Dict\[(\w+), (.+)\]", type_name)
    if m:
        if not isinstance(value, dict):
            raise Invalid(f"{path}: expected a map, found {type(value).__name__}")
        item = m.group(2) or m.group(4)
        return {k: build(v, item, f"{path}.{k}") for k, v in value.items()}
    scalars = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if type_name in scalars:
        if not isinstance(value, scalars[type_name]) or (
            type_name == "int" and isinstance(value, bool)
        ):
            raise Invalid(f"{path}: expected {type_name}, found {value!r}")
        return value
    cls = getattr(client, type_name, None)
    if cls is None:
        raise Invalid(f"{path}: unknown schema type {type_name}")
    if not isinstance(value, dict):
        raise Invalid(f"{path}: expected a {type_name} object, found {value!r}")
    by_json = {j: p for p, j in cls.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        if key not in by_json:
            raise Invalid(f"{path}.{key}: no such field in {type_name}")
        attr = by_json[key]
        kwargs[attr] = build(v, cls.openapi_types[attr], f"{path}.{key}")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a required field missing, a value outside its enum
        raise Invalid(f"{path}: {e}") from None


def check(path):
    errors = 0
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not docs:
        print(f"{path}: no objects", file=sys.stderr)
        return 1
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        name = doc.get("metadata", {}).get("name", "?")
        if key not in KINDS:
            print(f"{path}: {key[1]} {name}: unchecked kind {key}", file=sys.stderr)
            errors += 1
            continue
        try:
            build(doc, KINDS[key], f"{key[1]}/{name}")
        except Invalid as e:
            print(f"{path}: {e}", file=sys.stderr)
            errors += 1
    return errors


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    errors = sum(check(p) for p in sys.argv[1:])
    if errors:
        sys.exit(f"k8s_check: {errors} invalid object(s)")
    print(f"k8s_check: ok ({len(sys.argv) - 1} file(s))")


if __name__ == "__main__":
    main()
