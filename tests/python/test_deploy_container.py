"""deploy/container/ for real, with no image registry: the base images are built from Debian's packages by
deploy/container/build-rootfs.sh (mmdebstrap from the host's apt archive, podman import), the switch's
image by podman from Containerfile.switch with no network, and it runs as user 65532 with a read-only
root, no capabilities and the host's network; ranks outside it sum exactly through it. Then the worker
image from Containerfile.worker (on a Debian root with Python and numpy standing in for a PyTorch image)
runs two ranks in containers against it. Root only. Cold, the three base images and the switch's build
take minutes (docs/deploy.md, "Container image", says how many); the tarballs are cached under
build/container/ (or $GRADSWITCH_CONTAINER_CACHE) and podman caches the layers, so a rerun takes
seconds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from _deploy import ROOT, config_with, require, run_ranks, shipped_config_for_test, wait_ping
from conftest import require_or_skip

CONTAINER = ROOT / "deploy" / "container"
# The base images' tarballs; another checkout's cache may be given.
CACHE = Path(os.environ.get("GRADSWITCH_CONTAINER_CACHE") or ROOT / "build" / "container")
USER = "65532"


def podman_global() -> list[str]:
    """podman's options for this host. crun (podman's default runtime) refuses a host whose cgroups are
    v1 with a v2 hierarchy mounted beside (as on the test VM); runc takes them."""
    return ["--runtime", require("runc")]


def run_options() -> list[str]:
    """Limits the container may have: podman's defaults exceed the hard limits of a host without
    CAP_SYS_RESOURCE, which then refuses to set them. 16384 descriptors: the switch's control
    connections (the systemd unit gives 65536)."""
    return ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]


def sh(argv: list[str], timeout: float, what: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, f"{what} failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def base_image(kind: str) -> str:
    env = {**os.environ, "CACHE_DIR": str(CACHE)}
    p = subprocess.run(
        [str(CONTAINER / "build-rootfs.sh"), kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        cwd=ROOT,
    )
    assert p.returncode == 0, f"build-rootfs.sh {kind}:\n{p.stderr[-3000:]}"
    return p.stdout.split()[-1]


def build(containerfile: str, tag: str, **args: str) -> str:
    argv = [
        require("podman"),
        *podman_global(),
        "build",
        "--network",
        "none",
        *run_options(),
        "-f",
        str(CONTAINER / containerfile),
        "-t",
        tag,
    ]
    argv += [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    sh([*argv, str(ROOT)], 2400, f"podman build {containerfile}")
    return tag


@pytest.fixture(scope="module")
def podman():
    if os.geteuid() != 0:
        require_or_skip("TOOLS", "the container test needs root (mmdebstrap --mode=root, podman's storage)")
    require("mmdebstrap")  # build-rootfs.sh runs it
    require("runc")
    return require("podman")


class Container:
    """A detached container, removed at the end."""

    def __init__(self, podman: str, image: str, options: list[str], args: list[str]):
        self.podman, self.name = podman, f"gradswitch-test-{uuid.uuid4().hex[:8]}"
        sh(
            [
                podman,
                *podman_global(),
                "run",
                "-d",
                "--name",
                self.name,
                *run_options(),
                *options,
                image,
                *args,
            ],
            120,
            f"podman run {image}",
        )

    def state(self) -> tuple[bool, int]:
        out = sh(
            [self.podman, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", self.name],
            60,
            "podman inspect",
        )
        running, code = out.split()
        return running == "true", int(code)

    def running(self) -> bool:
        return self.state()[0]

    def logs(self) -> str:
        p = subprocess.run([self.podman, "logs", self.name], capture_output=True, text=True, timeout=60)
        return p.stdout + p.stderr

    def wait(self, timeout: float = 120) -> int:
        return int(sh([self.podman, "wait", self.name], timeout, "podman wait").split()[-1])

    def stop(self) -> int:
        sh([self.podman, *podman_global(), "stop", "-t", "10", self.name], 60, "podman stop")
        return self.state()[1]

    def remove(self) -> None:
        subprocess.run(
            [self.podman, *podman_global(), "rm", "-f", self.name], capture_output=True, timeout=60
        )


def secret_copy(src: Path, dst: Path) -> Path:
    """`src` as the container's user owns it, mode 0600 (the switch refuses a file others may read)."""
    shutil.copy(src, dst)
    os.chown(dst, int(USER), int(USER))
    dst.chmod(0o600)
    return dst


def sandboxed() -> list[str]:
    return [
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        f"{USER}:{USER}",
    ]


def start_switch(podman: str, image: str, tmp_path: Path) -> tuple[Container, dict]:
    """The switch's image with the shipped config (free ports, on loopback) and an auth file, mounted
    where the image and the Kubernetes manifests put them."""
    config, keys = shipped_config_for_test(tmp_path, threads=2)
    config.write_text(
        config_with(config.read_text(), auth_file="/etc/gradswitch/auth", control_host="127.0.0.1")
    )
    auth = secret_copy(keys["auth"], tmp_path / "auth.owned")
    mounts = ["-v", f"{config}:/etc/gradswitch/gradswitchd.toml:ro", "-v", f"{auth}:/etc/gradswitch/auth:ro"]
    switch = Container(podman, image, sandboxed() + mounts, [])  # the image's own CMD: --config ...
    wait_ping(keys["control_port"], switch.running, switch.logs, f"the container {switch.name}", timeout=60)
    return switch, keys


def kubernetes_init_container(podman: str, image: str, tmp_path: Path) -> None:
    """deploy/kubernetes/switch.yaml's init container, run in the image as the pod runs it: it copies a
    Secret's file (root's, group-readable by the pod's fsGroup) into memory, mode 0600, as the switch's
    user, where the ConfigMap's auth-file points."""
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "switch.yaml").read_text()))
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    src, dst = Path(init["command"][-2]), Path(init["command"][-1])
    secret = tmp_path / "secret-volume"
    secret.mkdir()
    (secret / src.name).write_text("tenant train secret=" + "ab" * 32 + "\n")
    os.chown(secret / src.name, 0, pod["securityContext"]["fsGroup"])
    (secret / src.name).chmod(0o440)
    run = tmp_path / "run"
    run.mkdir()
    os.chown(run, int(USER), int(USER))
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    sh(
        [
            podman,
            *podman_global(),
            "run",
            "--rm",
            *run_options(),
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--user",
            user,
            "--group-add",
            str(pod["securityContext"]["fsGroup"]),
            "-v",
            f"{secret}:{src.parent}:ro",
            "-v",
            f"{run}:{dst.parent}",
            "--entrypoint",
            init["command"][0],
            image,
            *init["command"][1:],
        ],
        120,
        "the init container",
    )
    st = (run / dst.name).stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, int(USER)), oct(st.st_mode)


def worker_ranks(podman: str, image: str, tmp_path: Path, keys: dict, world: int = 2) -> list[str]:
    """`world` containers of the worker image running the check program against the switch."""
    secret = secret_copy(keys["secret_file"], tmp_path / "train.secret.owned")
    env = {
        "GRADSWITCH_SWITCH": f"127.0.0.1:{keys['control_port']}",
        "GRADSWITCH_TENANT": "train",
        "GRADSWITCH_SECRET_FILE": "/var/run/secrets/gradswitch/secret",
    }
    options = sandboxed() + ["-v", f"{secret}:{env['GRADSWITCH_SECRET_FILE']}:ro", "--tmpfs", "/tmp"]
    options += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    ranks = [
        Container(
            podman,
            image,
            options,
            [
                "python3",
                "/opt/gradswitch/examples/allreduce_check.py",
                "--rank",
                str(r),
                "--world-size",
                str(world),
                "--job",
                "in-pods",
                "--elements",
                "65536",
            ],
        )
        for r in range(world)
    ]
    try:
        codes = [c.wait() for c in ranks]
        outs = [c.logs() for c in ranks]
    finally:
        for c in ranks:
            c.remove()
    for r, (code, out) in enumerate(zip(codes, outs, strict=True)):
        want = f"OK rank {r} of {world}: 3 allreduces of 65536 floats, every element exact"
        assert code == 0 and want in out, (r, code, out)
    return outs


def test_the_switch_image_runs_sandboxed_and_sums_exactly_for_ranks_outside_and_in_worker_containers(
    podman, tmp_path
):
    image = build(
        "Containerfile.switch",
        "localhost/gradswitchd:test",
        BUILD_IMAGE=base_image("build"),
        RUNTIME_IMAGE=base_image("runtime"),
    )
    # The image holds the daemon alone: no compiler, no Python.
    listing = sh(
        [
            podman,
            *podman_global(),
            "run",
            "--rm",
            *run_options(),
            "--network",
            "none",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            "id -u; command -v cc python3 || true",
        ],
        120,
        "podman run sh",
    )
    assert listing.split() == [USER], listing
    kubernetes_init_container(podman, image, tmp_path)
    switch, keys = start_switch(podman, image, tmp_path)
    try:
        run_ranks(f"127.0.0.1:{keys['control_port']}", 3, keys["secret_file"], job="from-outside")
        # The worker image: the wheel built here with this Python (the stand-in base has the same).
        wheels = ROOT / "build" / "container" / "wheels"  # Containerfile.worker's WHEELS, in the context
        shutil.rmtree(wheels, ignore_errors=True)
        sh(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(wheels),
                str(ROOT),
            ],
            1200,
            "pip wheel",
        )
        worker = build("Containerfile.worker", "localhost/gradswitch-worker:test", BASE=base_image("python"))
        worker_ranks(podman, worker, tmp_path, keys)
        assert switch.running(), switch.logs()
    finally:
        try:
            rc = switch.stop()
            log = switch.logs()
        finally:
            switch.remove()
    assert rc == 0, log
    assert "job 'train/from-outside'" in log and "job 'train/in-pods'" in log, log
    # The shipped config's JSON log, on the container's output (where podman logs and kubectl logs read it).
    assert any(line.startswith("{") and '"msg"' in line for line in log.splitlines()), log
