"""Vendors the schemas of the custom resources that deploy/kubernetes/ uses (PyTorchJob, TrainJob,
ServiceMonitor) for tests/python/test_deploy_kubernetes.py: each CRD's openAPIV3Schema without its
descriptions, with every embedded pod template cut to a marker (the test validates those against
Kubernetes' own PodTemplateSpec schema with kubernetes-validate instead). README.md says where each CRD
came from.

    python3 tests/python/k8s_crd_schemas/vendor.py SOURCE-LABEL CRD.yaml [CRD.yaml ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

POD_TEMPLATE = "x-gradswitch-pod-template"


def is_pod_template(name: str, schema: dict) -> bool:
    props = schema.get("properties", {})
    return (
        name == "template"
        and {"metadata", "spec"} <= set(props)
        and "containers" in (props["spec"].get("properties", {}))
    )


def trim(schema, name: str = ""):
    if isinstance(schema, list):
        return [trim(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if is_pod_template(name, schema):
        return {"type": "object", POD_TEMPLATE: True}
    out = {}
    for k, v in schema.items():
        if k == "description":
            continue
        if k == "properties":
            out[k] = {p: trim(s, p) for p, s in v.items()}
        else:
            out[k] = trim(v, name if k in ("items", "additionalProperties") else "")
    return out


def main() -> int:
    source, files = sys.argv[1], sys.argv[2:]
    here = Path(__file__).parent
    for f in files:
        crd = yaml.safe_load(Path(f).read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            out = {
                "$comment": f"{spec['names']['kind']} {spec['group']}/{version['name']} from {source}:"
                f" {Path(f).name}, trimmed by vendor.py",
                **trim(version["schema"]["openAPIV3Schema"]),
            }
            name = f"{spec['group']}_{spec['names']['plural']}_{version['name']}.json"
            (here / name).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
            print(name, len(json.dumps(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
