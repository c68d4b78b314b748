"""deploy/kubernetes/ (docs/deploy.md, "Kubernetes"). No cluster runs here, so: every manifest is valid
for the named Kubernetes versions (kubernetes-validate's bundled schemas, strict: an unknown field is an
error, as kubectl's default server-side validation makes it), the custom resources (PyTorchJob, TrainJob,
ServiceMonitor) against their CRDs' schemas vendored in k8s_crd_schemas/ with their pod templates
checked as Kubernetes PodTemplateSpecs; the pieces name each other consistently (ports, probes, mounts,
the Service's DNS name); and the real gradswitchd runs the ConfigMap's config with the example Secret's
auth file, answers the probes where they point, and sums exactly for ranks started with the training
pods' command and environment (the PyTorchJob's and the TrainJob's, under torchrun)."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml
from _daemon import daemon_binary
from _deploy import ROOT, TENANT, Process
from conftest import require_or_skip

from gradswitch.control import metrics_token
from gradswitch.daemon import pick_ports

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - depends on the environment
    kubernetes_validate = None


@pytest.fixture(autouse=True)
def _kubernetes_validate():
    if kubernetes_validate is None:
        require_or_skip("TOOLS", "kubernetes-validate is missing: scripts/install-deps.sh installs it (pip)")


K8S = ROOT / "deploy" / "kubernetes"
CRD_SCHEMAS = Path(__file__).parent / "k8s_crd_schemas"
# The oldest Kubernetes still maintained upstream when this was written, and the newest whose schemas
# the pinned kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
CRDS = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs_v1.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs_v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors_v1.json",
}
POD_TEMPLATE = "x-gradswitch-pod-template"


def manifests() -> dict[str, list[dict]]:
    out = {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(K8S.glob("*.yaml"))}
    assert {"switch.yaml", "pytorchjob.yaml", "trainjob.yaml", "servicemonitor.yaml"} <= set(out), out
    return out


def find(kind: str, name: str | None = None) -> dict:
    docs = [d for ds in manifests().values() for d in ds if d["kind"] == kind]
    docs = [d for d in docs if name is None or d["metadata"]["name"] == name]
    assert len(docs) == 1, (kind, name, docs)
    return docs[0]


def strict(schema):
    """A CRD schema as the API server applies it: fields it does not declare are errors (kubectl's
    default --validate=strict), unless the schema keeps unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def pod_templates(doc, schema, path=""):
    """(path, value) of every part of `doc` that the trimmed CRD schema marks as a pod template."""
    if not isinstance(schema, dict):
        return
    if schema.get(POD_TEMPLATE):
        yield path, doc
        return
    if isinstance(doc, dict):
        for k, v in doc.items():
            sub = schema.get("properties", {}).get(k) or schema.get("additionalProperties")
            yield from pod_templates(v, sub, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from pod_templates(v, schema.get("items"), f"{path}[{i}]")


def validate(doc: dict, version: str) -> None:
    """Raises on a manifest that the Kubernetes `version` (with the vendored CRDs) would refuse."""
    crd = CRDS.get((doc["apiVersion"], doc["kind"]))
    if crd is None:
        kubernetes_validate.validate(doc, version, strict=True)
        return
    schema = json.loads((CRD_SCHEMAS / crd).read_text())
    jsonschema.Draft7Validator(strict(schema)).validate(doc)
    templates = list(pod_templates(doc, schema))
    assert templates or POD_TEMPLATE not in json.dumps(schema), f"{doc['kind']}: its pod template is missing"
    for _, template in templates:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
            version,
            strict=True,
        )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version):
    kinds = []
    for name, docs in manifests().items():
        for doc in docs:
            try:
                validate(doc, version)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
                pytest.fail(
                    f"{name}: {doc['kind']} {doc['metadata']['name']} is not valid for {version}: {e}"
                )
            kinds.append(doc["kind"])
    assert {
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "PyTorchJob",
        "TrainJob",
        "ServiceMonitor",
    } <= set(kinds), kinds


BREAKAGES = {
    "a misspelt field": lambda d: d["spec"]["template"]["spec"].update(hostNetwrk=True),
    "a port as text": lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(
        containerPort="seventy-seven"
    ),
}
CRD_BREAKAGES = {
    ("PyTorchJob", "a misspelt replica field"): lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(
        replica=2
    ),
    ("PyTorchJob", "a misspelt field in a pod template"): lambda d: d["spec"]["pytorchReplicaSpecs"][
        "Worker"
    ]["template"]["spec"]["containers"][0].update(imag="x"),
    ("TrainJob", "numNodes as text"): lambda d: d["spec"]["trainer"].update(numNodes="two"),
    ("ServiceMonitor", "a misspelt endpoint field"): lambda d: d["spec"]["endpoints"][0].update(
        prot="metrics"
    ),
}


@pytest.mark.parametrize("what", list(BREAKAGES) + [f"{k}: {w}" for k, w in CRD_BREAKAGES])
def test_the_validation_catches_a_broken_manifest(what):
    # The check above must be able to fail: each breakage of a shipped manifest is refused.
    if what in BREAKAGES:
        kind, breakage = "Deployment", BREAKAGES[what]
    else:
        kind, _, w = what.partition(": ")
        breakage = CRD_BREAKAGES[(kind, w)]
    doc = copy.deepcopy(find(kind))
    breakage(doc)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(doc, KUBERNETES_VERSIONS[-1])


def test_the_manifests_validate_offline():
    # kubernetes-validate ships its schemas: the check needs no network (a new network namespace has none).
    if os.geteuid() != 0:
        require_or_skip("NETNS", "the offline check needs root for a network namespace (unshare -n)")
    code = (
        "import sys, yaml, kubernetes_validate as kv\n"
        "for d in yaml.safe_load_all(open(sys.argv[1])):\n"
        f"    d and kv.validate(d, '{KUBERNETES_VERSIONS[-1]}', strict=True)\n"
        "print('ok')"
    )
    p = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code, str(K8S / "switch.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)


def switch_pod() -> tuple[dict, dict]:
    """The switch Deployment's pod spec and its gradswitchd container."""
    spec = find("Deployment", "gradswitch")["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "gradswitchd"]
    return spec, container


def configmap_config() -> tuple[str, dict]:
    text = find("ConfigMap", "gradswitchd-config")["data"]["gradswitchd.toml"]
    return text, tomllib.loads(text)


def named_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return p


def test_the_switch_pod_is_pinned_hardened_and_names_its_config_consistently():
    spec, c = switch_pod()
    _, config = configmap_config()
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["nodeSelector"] and any(t["effect"] == "NoSchedule" for t in spec["tolerations"])
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    for each in spec["containers"] + spec["initContainers"]:
        sc = each["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, each["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], each["name"]
    # The command reads the ConfigMap where it is mounted; the ports it opens are the pod's and the
    # Service's; the auth file is where the init container puts the Secret's `auth` key.
    assert c["command"][:1] == ["/usr/bin/gradswitchd"] and c["command"][1] == "--config"
    # ... where the switch's image puts the daemon, with the user the pod runs as.
    image = (ROOT / "deploy" / "container" / "Containerfile.switch").read_text()
    assert re.search(r"^COPY --from=build \S+/gradswitchd /usr/bin/gradswitchd$", image, re.M), image
    user = f"{spec['securityContext']['runAsUser']}:{spec['securityContext']['runAsGroup']}"
    assert re.search(rf"^USER {user}$", image, re.M), image
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[c["command"][2]]["subPath"] == "gradswitchd.toml"
    ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in c["ports"]}
    assert ports["control"] == (config["control-port"], "TCP")
    assert ports["metrics"] == (config["metrics-port"], "TCP")
    data = sorted(v[0] for k, v in ports.items() if k.startswith("data-"))
    assert data == list(range(config["data-port"], config["data-port"] + config["threads"]))
    assert all(v[1] == "UDP" for k, v in ports.items() if k.startswith("data-"))
    (init,) = spec["initContainers"]
    assert init["command"][-1] == config["auth-file"] and init["command"][-3:-2] == ["0600"]
    secret_vol = {v["name"]: v for v in spec["volumes"]}
    src_mount = [m for m in init["volumeMounts"] if init["command"][-2].startswith(m["mountPath"] + "/")]
    secret = secret_vol[src_mount[0]["name"]]["secret"]["secretName"]
    assert "auth" in find("Secret", secret)["stringData"] and init["command"][-2].endswith("/auth")
    annotations = find("Deployment", "gradswitch")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == config["metrics-port"]
    svc = find("Service", "gradswitch")
    assert (
        svc["spec"]["clusterIP"] == "None"
        and svc["spec"]["selector"] == find("Deployment", "gradswitch")["spec"]["selector"]["matchLabels"]
    )
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)
    mon = find("ServiceMonitor", "gradswitch")
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def switch_address() -> str:
    """The Service's DNS name and control port, as the training pods must give GRADSWITCH_SWITCH."""
    svc = find("Service", "gradswitch")
    (port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "control"]
    return f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{port}"


def training_containers() -> dict[str, tuple[dict, list[dict], list[dict]]]:
    """Per training manifest: (its env as a dict, its container's volume mounts, the pod's volumes)."""
    job = find("PyTorchJob")
    out = {}
    for role, rs in job["spec"]["pytorchReplicaSpecs"].items():
        pod = rs["template"]["spec"]
        (c,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        out[f"PyTorchJob {role}"] = (
            {e["name"]: e["value"] for e in c["env"]},
            c["volumeMounts"],
            pod["volumes"],
        )
    tj = find("TrainJob")
    (patch,) = tj["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "node"]
    out["TrainJob"] = (
        {e["name"]: e["value"] for e in tj["spec"]["trainer"]["env"]},
        c["volumeMounts"],
        pod["volumes"],
    )
    return out


def test_the_training_pods_find_the_switch_and_mount_their_tenant_secret():
    tenant_secret = find("Secret", "gradswitch-tenant")
    assert tenant_secret["metadata"]["namespace"] == find("PyTorchJob")["metadata"]["namespace"]
    for what, (env, mounts, volumes) in training_containers().items():
        assert env["GRADSWITCH_SWITCH"] == switch_address(), what
        assert env["GRADSWITCH_TENANT"] == TENANT, what
        path = Path(env["GRADSWITCH_SECRET_FILE"])
        (mount,) = [m for m in mounts if m["mountPath"] == str(path.parent)]
        (vol,) = [v for v in volumes if v["name"] == mount["name"]]
        assert vol["secret"]["secretName"] == "gradswitch-tenant", what
        assert path.name in tenant_secret["stringData"], what
    # Both run the check program that the worker image installs.
    worker = (ROOT / "deploy" / "container" / "Containerfile.worker").read_text()
    assert re.search(r"^COPY .*examples/allreduce_check\.py.* /opt/gradswitch/examples/$", worker, re.M), (
        worker
    )
    assert find("PyTorchJob")["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "command"
    ][1:] == ["/opt/gradswitch/examples/allreduce_check.py", "--torch"]
    assert find("TrainJob")["spec"]["trainer"]["command"][1:] == [
        "/opt/gradswitch/examples/allreduce_check.py",
        "--torch",
    ]


def http_get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def example_auth_file(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The example Secret's auth file with its placeholders filled, put in place by the init container's
    own command (install -m 0600, paths moved under tmp_path); {entry name: its secret}."""
    text = find("Secret", "gradswitch-auth")["stringData"]["auth"]
    secrets = {}
    lines = []
    for line in text.splitlines():
        name = line.split()[1]
        secrets[name] = os.urandom(32).hex()
        lines.append(line.replace("REPLACE_WITH_64_HEX_DIGITS", secrets[name]))
    src = tmp_path / "secret" / "auth"
    src.parent.mkdir()
    src.write_text("\n".join(lines) + "\n")
    src.chmod(0o440)  # as the Secret volume's defaultMode: the daemon would refuse it there
    spec, _ = switch_pod()
    (init,) = spec["initContainers"]
    dst = tmp_path / "run" / "auth"
    dst.parent.mkdir()
    subprocess.run([*init["command"][:-2], str(src), str(dst)], check=True, timeout=30)
    return dst, secrets


def test_the_configmap_runs_the_real_switch_which_answers_the_probes_and_sums_for_the_training_jobs(tmp_path):
    text, config = configmap_config()
    spec, c = switch_pod()
    auth, secrets = example_auth_file(tmp_path)
    (tmp_path / "gradswitchd.toml").write_text(text)
    # The ConfigMap's file as the pod's command reads it, moved to loopback and free ports by flags
    # (which override the file) and to the auth file the init container wrote.
    control, data, metrics = pick_ports(config["threads"], extra=1)
    moved = {"control-port": control, "data-port": data, "metrics-port": metrics}
    argv = [
        daemon_binary(),
        "--config",
        str(tmp_path / "gradswitchd.toml"),
        "--control-host",
        "127.0.0.1",
        "--metrics-host",
        "127.0.0.1",
        "--auth-file",
        str(auth),
    ]
    argv += [a for k, v in moved.items() for a in (f"--{k}", str(v))]
    sw = Process(argv, tmp_path / "switch.log")
    try:
        sw.wait_ping(control)
        actual = {config[k]: moved[k] for k in moved}  # the pod's port numbers -> this test's
        ready = c["readinessProbe"]["httpGet"]
        status, _ = http_get(f"http://127.0.0.1:{actual[named_port(c, ready['port'])]}{ready['path']}")
        assert status == 200, (ready, status)
        alive = c["livenessProbe"]["tcpSocket"]
        socket.create_connection(("127.0.0.1", actual[named_port(c, alive["port"])]), timeout=5).close()
        # The scrape: refused without a token, served with the operator's (the ServiceMonitor's Secret).
        endpoint = find("ServiceMonitor")["spec"]["endpoints"][0]
        url = f"http://127.0.0.1:{metrics}{endpoint['path']}"
        assert http_get(url)[0] == 401
        status, body = http_get(url, metrics_token("ops", secrets["ops"]))
        assert status == 200 and "gradswitch_max_jobs 64" in body, (status, body[:500])
        run_training_pods(tmp_path, control, secrets[TENANT])
    finally:
        rc = sw.stop()
    assert rc == 0, sw.log()
    assert f"from {auth}" in sw.log() and '"msg"' in sw.log(), sw.log()


def pod_command(command: list[str]) -> list[str]:
    """A training pod's command as a process here: this Python (and torchrun as its module), the
    example from the source tree, fewer elements."""
    head = [sys.executable, "-m", "torch.distributed.run"] if command[0] == "torchrun" else [sys.executable]
    return [*head, str(ROOT / "examples" / Path(command[1]).name), *command[2:], "--elements", "65536"]


def run_pods(pods: list[tuple[list[str], dict]], world: int) -> None:
    """Starts each (argv, env) and checks that ranks 0 .. world-1 each summed every element exactly."""
    procs = [
        subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for argv, env in pods
    ]
    outs = "".join(p.communicate(timeout=180)[0] for p in procs)
    assert all(p.returncode == 0 for p in procs), outs
    for rank in range(world):
        assert f"OK rank {rank} of {world}: 3 allreduces of 65536 floats, every element exact" in outs, outs


def run_training_pods(tmp_path: Path, control: int, secret: str) -> None:
    """The PyTorchJob's master and worker, then the TrainJob's nodes, as processes with their command
    and environment plus what the training operator (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK) or
    Trainer's torch runtime (torchrun's PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
    PET_MASTER_PORT) sets; the switch and the secret file moved to this test's."""
    secret_file = tmp_path / "tenant.secret"
    secret_file.write_text(secret + "\n")
    moved = {"GRADSWITCH_SWITCH": f"127.0.0.1:{control}", "GRADSWITCH_SECRET_FILE": str(secret_file)}
    specs = find("PyTorchJob")["spec"]["pytorchReplicaSpecs"]
    roles = ["Master"] * specs["Master"]["replicas"] + ["Worker"] * specs["Worker"]["replicas"]
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(pick_ports(0)[0]), "WORLD_SIZE": str(len(roles))}
    pods = []
    for rank, role in enumerate(roles):
        (c,) = specs[role]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c["env"]} | moved | master | {"RANK": str(rank)}
        pods.append((pod_command(c["command"]), env))
    run_pods(pods, len(roles))
    trainer = find("TrainJob")["spec"]["trainer"]
    nodes, per_node = trainer["numNodes"], trainer["numProcPerNode"]
    pet = {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(per_node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(pick_ports(0)[0]),
    }
    env = {e["name"]: e["value"] for e in trainer["env"]} | moved | pet
    run_pods(
        [(pod_command(trainer["command"]), env | {"PET_NODE_RANK": str(n)}) for n in range(nodes)],
        nodes * per_node,
    )
