"""Deployment files: the Dockerfile passes hadolint and has the structure the README promises; the Kubernetes
manifests validate against the Kubernetes schemas (strict: unknown fields fail) and work with the preemption
handling (SIGTERM -> last.ckpt -> exit 143 -> retried without counting as a failure, resuming in a fixed run dir)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pixelsmith.config.paths import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.31.0"  # the oldest we promise: podFailurePolicy and Indexed Jobs are GA there


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]' installs it)")
    return path


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (REPO_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_the_dockerfile_passes_hadolint():
    result = subprocess.run(
        [_tool("hadolint"), str(REPO_ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dockerfile_installs_the_tested_set_and_runs_the_main_job_as_a_user():
    steps = _instructions()
    kinds = [kind for kind, _ in steps]
    args = dict(steps)  # the last of each kind
    assert "nvidia/cuda:" in args["ARG"] and kinds.index("ARG") < kinds.index(
        "FROM"
    )  # an official CUDA image
    install = next(a for k, a in steps if k == "RUN" and "pip install" in a)
    assert "-c constraints.txt" in install
    assert (
        '".[stream]"' in install
    )  # data=shards and pixelsmith-prepare format=shards need litdata in the image
    user = kinds.index("USER")
    assert args["USER"].split(":")[0] not in ("0", "root")
    assert user < kinds.index("CMD") and "RUN" not in kinds[user:]  # nothing after it runs as root
    assert args["CMD"] == '["pixelsmith-train"]' and args["STOPSIGNAL"] == "SIGTERM"
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".venv", "outputs", ".git"} <= set(ignored)


def _documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def test_the_kubernetes_manifests_validate_against_the_schemas(tmp_path):
    validate = _tool("kubernetes-validate")
    files = [str(K8S / name) for name in ("pvc.yaml", "job.yaml", "multinode.yaml")]
    result = subprocess.run(
        [validate, "--strict", "-k", KUBERNETES_VERSION, *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "job.yaml"  # the validator can fail: a misspelled field
    broken.write_text((K8S / "job.yaml").read_text().replace("backoffLimit", "backofLimit"))
    result = subprocess.run(
        [validate, "--strict", "-k", KUBERNETES_VERSION, str(broken)], capture_output=True
    )
    assert result.returncode != 0
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert all((K8S / name).is_file() for name in kustomization["resources"])


@pytest.mark.parametrize("name", ["job.yaml", "multinode.yaml"])
def test_the_jobs_request_gpus_and_retry_a_preempted_pod_into_the_same_run_dir(name):
    (job,) = [d for d in _documents(name) if d["kind"] == "Job"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 120
    rules = spec["podFailurePolicy"]["rules"]
    assert {
        "action": "Ignore",
        "onExitCodes": {"containerName": "train", "operator": "In", "values": [143]},
    } in rules
    command = " ".join(container["command"])
    assert "hydra.run.dir=/workspace/outputs/" in command  # fixed: the retried pod resumes there
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/workspace/outputs"]]["persistentVolumeClaim"]["claimName"] == "pixelsmith-outputs"
    assert pod["securityContext"]["runAsNonRoot"] is True
    if name == "multinode.yaml":
        assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
        assert "--nnodes=2" in command and '--node-rank="$JOB_COMPLETION_INDEX"' in command
        (service,) = [d for d in _documents(name) if d["kind"] == "Service"]
        assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
