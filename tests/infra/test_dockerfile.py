"""The Dockerfile, checked without a container engine: hadolint (the real binary), and a parse that
ties the images to the project's own pins and to what the renderer and the chart run."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib

import pytest
import yaml
from infra_hcl import ROOT

pytestmark = pytest.mark.infra

DOCKERFILE = ROOT / "Dockerfile"


def parse_dockerfile(text: str) -> dict:
    """{"args": {global ARG defaults}, "stages": {name: {"from": image, "lines": [(instr, rest)]}}}"""
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    out: dict = {"args": {}, "stages": {}}
    stage = None
    for line in logical:
        instr, _, rest = line.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            stage = {"from": m.group(1), "lines": []}
            out["stages"][m.group(2) or str(len(out["stages"]))] = stage
        elif stage is None:
            if instr == "ARG":
                k, _, v = rest.strip().partition("=")
                out["args"][k] = v
        else:
            stage["lines"].append((instr, rest.strip()))
    return out


@pytest.fixture(scope="module")
def df() -> dict:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            k, v = line.split("==", 1)
            out[k.strip().lower().replace("_", "-")] = v.strip()
    return out


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def stage_args(df, name: str) -> dict[str, str]:
    """ARG defaults visible in a stage, following FROM <earlier stage> chains."""
    st = df["stages"][name]
    base = stage_args(df, st["from"]) if st["from"] in df["stages"] else {}
    for instr, rest in st["lines"]:
        if instr == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            base[k] = v
    return base


def stage_chain(df, name: str) -> list[str]:
    st = df["stages"][name]
    return ([*stage_chain(df, st["from"])] if st["from"] in df["stages"] else []) + [name]


def last(df, name: str, instr: str) -> str | None:
    for stage in reversed(stage_chain(df, name)):
        found = [r for i, r in df["stages"][stage]["lines"] if i == instr]
        if found:
            return found[-1]
    return None


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


# ------------------------------------------------------------------------------------------------
def test_hadolint_passes(hadolint_bin):
    proc = subprocess.run(
        [str(hadolint_bin), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_hadolint_ignore_is_explained():
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*#\s*hadolint\s+ignore=([\w,]+)", line)
        if not m:
            continue
        comments = []
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#"):
            comments.append(lines[j])
            j -= 1
        for rule in m.group(1).split(","):
            why = [c.split(rule, 1)[1] for c in comments if rule in c]
            assert why and len(why[0].strip(" :()#")) >= 30, (
                f"line {i + 1}: {rule} ignored without an explanation in the comment above it"
            )
    cfg = ROOT / ".hadolint.yaml"
    if cfg.exists():
        assert not (yaml.safe_load(cfg.read_text()) or {}).get("ignored"), ".hadolint.yaml ignores rules globally"


def test_targets_exist_and_run_as_non_root(df):
    for target in ("trainer", "operator"):
        assert target in df["stages"], f"no `{target}` target"
        user = last(df, target, "USER")
        assert user, f"{target}: no USER"
        uid = expand(user, {**df["args"], **stage_args(df, target)}).split(":")[0]
        assert uid not in ("0", "root"), f"{target} runs as root"


def test_image_uid_matches_the_chart_security_context(df):
    values = yaml.safe_load((ROOT / "charts/llmtrain-operator/values.yaml").read_text())
    uid = expand(last(df, "operator", "USER"), stage_args(df, "operator")).split(":")[0]
    assert int(uid) == values["podSecurityContext"]["runAsUser"]


def test_trainer_pins_agree_with_constraints(df, pins):
    args = {**df["args"], **stage_args(df, "trainer-build")}
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["NCCL_VERSION"] == pins["nvidia-nccl-cu13"]
    # the CUDA base image's major version is the one torch's NCCL/CUDA wheels are built for
    cuda_major = re.search(r"nvidia-nccl-cu(\d+)", " ".join(f"{k}=={v}" for k, v in pins.items())).group(1)
    base = df["args"]["CUDA_BASE_IMAGE"]
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-(base|runtime|cudnn-runtime)-ubuntu\d+\.\d+", base)
    assert m, base
    assert m.group(1) == cuda_major, f"CUDA base {base} vs nvidia-nccl-cu{cuda_major}"
    # and the NCCL/torch ARGs are enforced by the build itself, not just declared
    run = " ".join(r for i, r in df["stages"]["trainer-build"]["lines"] if i == "RUN")
    assert "${TORCH_VERSION}" in run and "${NCCL_VERSION}" in run and "torch.cuda.nccl.version()" in run


def test_pip_and_setuptools_match_the_dev_environment(df):
    venv_sh = (ROOT / "scripts/venv.sh").read_text()
    for stage in ("trainer-build", "operator-build"):
        args = stage_args(df, stage)
        assert f"pip=={args['PIP_VERSION']}" in venv_sh, stage
        assert f"setuptools=={args['SETUPTOOLS_VERSION']}" in venv_sh, stage


def test_every_pip_install_is_pinned_and_hashed(df):
    """Third-party packages only from a locked file with --require-hashes (pip refuses any file
    whose sha256 differs); --no-deps without a lock only for our own package."""
    installs = 0
    for name, st in df["stages"].items():
        for instr, rest in st["lines"]:
            if instr != "RUN":
                continue
            for cmd in re.split(r"&&|;", rest):
                if "pip install" not in cmd:
                    continue
                words = shlex.split(cmd.replace('"', ""))
                args = words[words.index("install") + 1 :]
                if args[-1] == ".":
                    assert "--no-deps" in args, f"{name}: our package must not pull dependencies: `{cmd.strip()}`"
                    continue
                assert "--require-hashes" in args and "--no-deps" in args, f"{name}: unhashed `{cmd.strip()}`"
                assert "-r" in args and args[args.index("-r") + 1].startswith("requirements/"), cmd
                assert not [a for a in args if not a.startswith("-") and a != args[args.index("-r") + 1]], cmd
                installs += 1
    assert installs == 4  # bootstrap + dependencies, for each of the two Python images


def _lock(name: str) -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9][a-z0-9.-]*)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        assert m, f"requirements/{name}: {line!r} is not `name==version --hash=sha256:<hex>`"
        assert m.group(1) not in out, f"requirements/{name}: {m.group(1)} twice"
        out[m.group(1)] = m.group(2)
    return out


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")


@pytest.mark.parametrize("image, extra", [("trainer-image.txt", "trainer"), ("operator-image.txt", "operator")])
def test_locked_requirements_are_the_constraints_pins_of_what_the_image_needs(df, pins, pyproject, image, extra):
    """The locks (scripts/lock-image-requirements.py) must follow constraints.txt: a pin bumped
    without re-locking fails here, not in a build."""
    lock = _lock(image)
    wrong = {n: (v, pins.get(n)) for n, v in lock.items() if pins.get(n) != v}
    assert not wrong, f"requirements/{image} differs from constraints.txt (rerun the lock script): {wrong}"
    project = pyproject["project"]
    needed = {_name(r) for r in project["dependencies"] + project["optional-dependencies"][extra]}
    assert needed <= set(lock), f"requirements/{image} lacks {sorted(needed - set(lock))}"
    if extra == "operator":
        assert "torch" not in lock, "the operator image must not pull torch"
    else:
        assert lock["torch"] == stage_args(df, "trainer-build")["TORCH_VERSION"]
        assert lock["nvidia-nccl-cu13"] == stage_args(df, "trainer-build")["NCCL_VERSION"]
    boot = _lock("bootstrap.txt")
    for stage in ("trainer-build", "operator-build"):
        args = stage_args(df, stage)
        assert boot == {"pip": args["PIP_VERSION"], "setuptools": args["SETUPTOOLS_VERSION"]}, stage
    assert not set(boot) & set(lock), "pip/setuptools come from bootstrap.txt only"


def test_extras_installed_per_target(df):
    run = {
        s: " ".join(r for i, r in df["stages"][s]["lines"] if i == "RUN") for s in ("trainer-deps", "operator-build")
    }
    assert "requirements/trainer-image.txt" in run["trainer-deps"]
    assert "requirements/operator-image.txt" in run["operator-build"]
    assert "trainer-image" not in run["operator-build"], "the operator image must not pull torch"


def test_copy_sources_exist_and_are_in_the_build_context(df):
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", ".dockerignore is expected to be an allow-list"
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    for name, st in df["stages"].items():
        for instr, rest in st["lines"]:
            if instr not in ("COPY", "ADD") or rest.startswith("--from"):
                continue
            *srcs, _dest = shlex.split(rest)
            for src in srcs:
                assert (ROOT / src).exists(), f"{name}: COPY {src}: not in the repository"
                assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), (
                    f"{name}: COPY {src} is excluded by .dockerignore"
                )


def rendered_worker() -> dict:
    """The worker container of a PyTorchJob rendered by the real renderer for a p5 example."""
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import load_job

    job = load_job(ROOT / "examples/llama2-7b-p5.yaml")  # default etcd endpoint: the chart's
    from llmtrain.spec import DEFAULT_ETCD_ENDPOINT

    ptj = render_pytorchjob(job.spec, job.name, namespace="ml", default_etcd_endpoint=DEFAULT_ETCD_ENDPOINT)
    (container,) = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return container


def test_rendered_command_exists_in_the_trainer_image(df, pyproject):
    container = rendered_worker()
    # ENTRYPOINT is what a plain `docker run` does; the PyTorchJob's command replaces it with the same
    entry = yaml.safe_load(last(df, "trainer", "ENTRYPOINT"))
    assert container["command"] == entry, (container["command"], entry)
    # python (the venv's) runs the launcher module, which runs torch.distributed.run (torchrun)
    assert container["command"][:2] == ["python", "-m"]
    launcher = container["command"][2]
    assert (ROOT / "trainer" / (launcher.replace(".", "/") + ".py")).exists(), launcher
    env = last(df, "trainer", "ENV")
    assert re.search(r"PATH=/opt/venv/bin[:\s]", env), "the venv's bin is not first on the trainer PATH"
    run = " ".join(r for i, r in df["stages"]["trainer-build"]["lines"] if i == "RUN")
    assert f"/opt/venv/bin/{' '.join(container['command'])} --help" in run, "the build does not prove the command runs"
    # `-m <module>`: the module is a package of the distribution the image installs
    args = container["args"]
    module = args[args.index("-m") + 1]
    where = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    pkg_dirs = [ROOT / w / module for w in where if (ROOT / w / module / "__main__.py").exists()]
    assert pkg_dirs, f"no {module}/__main__.py under {where}"
    copies = " ".join(r for i, r in df["stages"]["trainer-build"]["lines"] if i == "COPY")
    assert str(pkg_dirs[0].relative_to(ROOT)) in copies, f"{module} is not copied into the trainer image"
    # metrics port the renderer declares is exposed
    ports = re.findall(r"(\d+)(?:-(\d+))?", last(df, "trainer", "EXPOSE"))
    from llmtrain.pod_contract import METRICS_PORT

    assert any(int(a) <= METRICS_PORT <= int(b or a) for a, b in ports)


def test_default_image_references_point_at_these_targets(pyproject):
    from llmtrain.spec import DEFAULT_IMAGE

    version = pyproject["project"]["version"]
    assert DEFAULT_IMAGE == f"public.ecr.aws/llmtrain/llmtrain-trainer:{version}"
    assert rendered_worker()["image"] == DEFAULT_IMAGE
    header = DOCKERFILE.read_text()
    assert f"--target trainer -t {DEFAULT_IMAGE} ." in header
    chart = yaml.safe_load((ROOT / "charts/llmtrain-operator/values.yaml").read_text())
    repo = chart["image"]["repository"]
    assert f"--target operator -t {repo}:{version} ." in header
    assert yaml.safe_load((ROOT / "charts/llmtrain-operator/Chart.yaml").read_text())["appVersion"] == version


def test_operator_entrypoint_is_the_chart_command_and_a_console_script(df, pyproject):
    entry = yaml.safe_load(last(df, "operator", "ENTRYPOINT"))
    assert entry == ["llmtrain-operator"]
    assert entry[0] in pyproject["project"]["scripts"]
    deployment = (ROOT / "charts/llmtrain-operator/templates/deployment.yaml").read_text()
    m = re.search(r"command:\s*(\[.*\])", deployment)
    assert m and yaml.safe_load(m.group(1)) == entry


def test_efa_installer_is_current_and_verified_before_use(df):
    """Issue 10, defect 10: a release from 2025 or later (1.43.1 was over a year old), and the
    tarball checked against a pinned sha256 before it is unpacked or run."""
    args = stage_args(df, "trainer-base")
    version = tuple(int(x) for x in args["EFA_INSTALLER_VERSION"].split("."))
    assert version >= (1, 50, 0)
    assert re.fullmatch(r"[0-9a-f]{64}", args["EFA_INSTALLER_SHA256"])
    (run,) = [r for i, r in df["stages"]["trainer-base"]["lines"] if i == "RUN" and "efa-installer" in r]
    steps = [s.strip() for s in run.split("&&")]
    # (inside the `if ...; else` of EFA_INSTALLER_VERSION=none, so not at the start of its step)
    download = next(i for i, s in enumerate(steps) if "curl " in s and "efa-installer" in s)
    verify = next(i for i, s in enumerate(steps) if "sha256sum -c" in s)
    unpack = next(i for i, s in enumerate(steps) if s.startswith("tar "))
    assert download < verify < unpack and "${EFA_INSTALLER_SHA256}" in steps[verify]


def test_trainer_interpreter_carries_ipc_lock_as_permitted_only_file_capability(df):
    """EFA pods add IPC_LOCK; the non-root trainer gains it only through a file capability. It must
    be permitted-only: with the effective bit, pods that drop every capability (CPU jobs) could not
    exec the interpreter at all (EPERM)."""
    runs = " ".join(r for i, r in df["stages"]["trainer"]["lines"] if i == "RUN")
    assert "setcap cap_ipc_lock=+p " in runs and "+ep" not in runs
    assert "/etc/ld.so.conf.d/" in runs and "ldconfig" in runs  # secure-exec ignores LD_LIBRARY_PATH


# --- local builds (scripts/trainer-image.sh): the two build args, the skip, the layers, the CA --------


def _efa_run(df) -> str:
    (run,) = [r for i, r in df["stages"]["trainer-base"]["lines"] if i == "RUN" and "efa-installer" in r]
    return run


def test_efa_installer_none_skips_exactly_the_installer(df):
    """EFA_INSTALLER_VERSION=none (a machine that cannot reach the installer's host) skips the
    download, the check and the installer, and nothing else: the OS packages are still installed
    and curl still purged."""
    run = _efa_run(df)
    m = re.search(r'if \[ "\$\{EFA_INSTALLER_VERSION\}" = none \]; then (.*?); else (.*?); fi(.*)', run)
    assert m, run
    skipped, installed, after = m.groups()
    assert "curl" not in skipped and "efa_installer.sh" not in skipped
    for step in ("curl -fsSL", "sha256sum -c", "tar -xzf", "./efa_installer.sh", "rm -rf /tmp/aws-efa-installer"):
        assert step in installed, step
    assert "apt-get purge -y curl" in after and "rm -rf /var/lib/apt/lists/*" in after
    assert run.index("apt-get install") < m.start()


def test_trainer_image_labels_say_which_base_and_efa_installer(df):
    """The labels name the build args' values; a global ARG is empty inside a stage unless the stage
    declares it again before use."""
    lines = df["stages"]["trainer-base"]["lines"]
    (label,) = [r for i, r in lines if i == "LABEL"]
    assert 'io.llmtrain.base-image="${CUDA_BASE_IMAGE}"' in label
    assert 'io.llmtrain.efa-installer="${EFA_INSTALLER_VERSION}"' in label
    declared = [r.split("=")[0] for i, r in lines[: lines.index(("LABEL", label))] if i == "ARG"]
    assert {"CUDA_BASE_IMAGE", "EFA_INSTALLER_VERSION"} <= set(declared)
    assert stage_chain(df, "trainer")[0] == "trainer-base"  # the trainer image inherits them


def test_the_venv_layer_is_keyed_by_the_lock_and_our_packages_come_after(df):
    """The ~5.7 GB third-party venv is one layer that only the lock (and the base) change; llmtrain's
    own files come in a later, small layer, so a commit does not rebuild, push or pull the venv."""
    deps = df["stages"]["trainer-deps"]
    assert deps["from"] == "trainer-base"
    copies = [r for i, r in deps["lines"] if i in ("COPY", "ADD")]
    assert copies == ["requirements/bootstrap.txt requirements/trainer-image.txt ./requirements/"], copies
    build = df["stages"]["trainer-build"]
    assert build["from"] == "trainer-deps"
    (install,) = [r for i, r in build["lines"] if i == "RUN" and "pip install" in r]
    assert "--root /opt/llmtrain-root ." in install
    # the checks run on llmtrain installed in the venv (the staging root copied over it)
    assert install.index("cp -a /opt/llmtrain-root/. /") < install.index("import torch, llmtrain_trainer")
    final = df["stages"]["trainer"]["lines"]
    venv = final.index(("COPY", "--from=trainer-deps /opt/venv /opt/venv"))
    ours = final.index(("COPY", "--from=trainer-build /opt/llmtrain-root/ /"))
    assert venv < ours
    assert not [r for i, r in final if i == "COPY" and "--from=trainer-build /opt/venv" in r]
    assert not [i for i, _ in final[ours + 1 :] if i in ("RUN", "COPY", "ADD")], (
        "a layer after ours changes every commit"
    )


def test_the_build_ca_is_a_secret_used_only_when_given(df):
    """pip behind a TLS-intercepting proxy needs that proxy's CA; it comes in as the build secret
    build-ca (docker build --secret, buildah bud --secret: scripts/trainer-image.sh), never as a file
    in a layer, and a build without it (docker on EKS) uses the image's own CAs."""
    downloads = 0
    for name, st in df["stages"].items():
        for instr, rest in st["lines"]:
            assert not (instr in ("COPY", "ADD") and re.search(r"\.(crt|pem)\b|pip\.conf", rest)), (name, rest)
            if instr != "RUN" or not re.search(r"pip install .*-r requirements/", rest):
                continue
            if not name.startswith("trainer"):
                continue
            downloads += 1
            assert rest.startswith("--mount=type=secret,id=build-ca "), rest
            assert "if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi" in rest
    assert downloads == 2
    script = (ROOT / "scripts/trainer-image.sh").read_text()
    assert '--secret "id=build-ca,src=$f"' in script


def test_the_local_build_sets_only_the_two_build_args(df):
    """scripts/trainer-image.sh changes the base and skips EFA, and nothing else (the header says so)."""
    script = (ROOT / "scripts/trainer-image.sh").read_text()
    m = re.search(r"^BUILD_ARGS=\((.*)\)$", script, re.M)
    assert m, "no BUILD_ARGS=(...) line"
    names = [a.split("=")[0] for a in shlex.split(m.group(1))]
    assert names == ["CUDA_BASE_IMAGE", "EFA_INSTALLER_VERSION"]
    assert "CUDA_BASE_IMAGE" in df["args"] and "EFA_INSTALLER_VERSION" in stage_args(df, "trainer-base")
    header = DOCKERFILE.read_text().split("\nARG ", 1)[0]
    assert "CUDA_BASE_IMAGE" in header and "EFA_INSTALLER_VERSION=none" in header
