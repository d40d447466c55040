"""Validate cloud-config files with cloud-init's own schema code, run inside cloud-init's environment.

Usage: python cloud_init_schema_check.py FILE...  (with cloud-init importable)
Prints one JSON line per file: {"file", "errors" (cloud-init's own schema), "strict_errors"}.
"strict" adds cloud-init 23.4's top level (every module key allowed, nothing else), since the
Debian 12 package (22.4.2) predates it.
"""

import json
import sys

import yaml
from cloudinit.config.schema import SchemaValidationError, get_schema, validate_cloudconfig_schema


def strict(schema: dict) -> dict:
    keys = {}
    for definition in schema.get("$defs", {}).values():
        keys.update(definition.get("properties", {}))
    return {**schema, "properties": {k: {} for k in keys}, "additionalProperties": False}


def errors(config: dict, schema: dict) -> list:
    try:
        validate_cloudconfig_schema(config, schema, strict=True)
    except SchemaValidationError as exc:
        return [str(exc)]
    return []


schema = get_schema()
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    print(json.dumps({"file": path, "errors": errors(config, schema), "strict_errors": errors(config, strict(schema))}))
