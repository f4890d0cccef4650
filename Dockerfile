# syntax=docker/dockerfile:1.7
# llmtrain images. Two targets, built from the repository root:
#   docker build --target trainer -t public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0 .
#   docker build --target operator -t public.ecr.aws/llmtrain/llmtrain-operator:0.1.0 .
# Every Python package is installed from requirements/<image>.txt with `--require-hashes`: the
# constraints.txt pins, each with the sha256 PyPI publishes for the file this image's pip picks
# (scripts/lock-image-requirements.py writes them; a build fails on any other file).
# tests/infra/test_dockerfile.py checks the ARGs below and those files against constraints.txt.
# The base images are referenced by tag: pin them by digest (FROM image:tag@sha256:...) in your
# build once you have pulled and checked them; this repository cannot verify a digest for you.
#
# Layer order is for the build cache: OS + EFA (changes rarely) < third-party wheels (change when
# requirements/*.txt change) < our source (changes every commit). The trainer image keeps the last
# two in separate layers (the ~5.7 GB venv, then llmtrain's own few hundred KB), so a source change
# rebuilds, pushes and pulls only the small one.
#
# Two build args exist for builds that cannot reach everything (scripts/trainer-image.sh, the local
# image on a machine with no registry): CUDA_BASE_IMAGE (a local Ubuntu 24.04 base) and
# EFA_INSTALLER_VERSION=none (no EFA installer); the image's labels io.llmtrain.base-image and
# io.llmtrain.efa-installer say which were used. Behind a TLS-intercepting proxy, pass its CA bundle
# as the build secret `build-ca` (docker build --secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt);
# pip uses it during the build and it never enters the image. Without the secret pip uses the
# image's own CAs.

# CUDA 13 base: torch 2.15.0 from PyPI is a CUDA 13 build (+cu132) and brings its CUDA runtime and
# NCCL as wheels; the base supplies the CUDA 13 userspace expectations and NVIDIA_* settings, the
# node supplies the driver.
ARG CUDA_BASE_IMAGE=nvidia/cuda:13.2.0-base-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ------------------------------------------------------------------------------------------------
# trainer: OS packages, Python, EFA (libfabric + aws-ofi-nccl, the NCCL net plugin)
# ------------------------------------------------------------------------------------------------
FROM ${CUDA_BASE_IMAGE} AS trainer-base
# EFA installer release: installs libfabric with the EFA provider, rdma-core and aws-ofi-nccl
# (/opt/amazon/ofi-nccl), which NCCL loads as its network plugin. --skip-kmod: the kernel driver
# comes from the node's AMI (EKS AL2023 NVIDIA AMI), not the container. The tarball is verified
# against a pinned sha256 (AWS publishes one per release) before anything from it runs; bump
# both together. libcap2-bin: setcap for the IPC_LOCK file capability below.
ARG EFA_INSTALLER_VERSION=1.50.0
ARG EFA_INSTALLER_SHA256=fa6dff8593d866866c13cb4640d9059835cd4efa427971f100ab40c97bef2841
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG CUDA_BASE_IMAGE
# EFA_INSTALLER_VERSION=none skips the installer: a local build whose machine cannot reach its
# host, for CPU pods; such an image has no libfabric or aws-ofi-nccl and cannot use EFA.
# DL3008 (pin apt versions): Ubuntu's archive drops superseded package versions, so exact apt pins
# break rebuilds within weeks; the base image tag pins the distribution release instead.
# DL3003 (cd instead of WORKDIR): the EFA installer must run from its unpacked directory, and the
# tarball and that directory must be deleted in the same layer or they stay in the image.
# hadolint ignore=DL3008,DL3003
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl python3 python3-venv libcap2-bin \
 && if [ "${EFA_INSTALLER_VERSION}" = none ]; then echo "EFA installer skipped (EFA_INSTALLER_VERSION=none)"; else \
    curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" -o /tmp/efa.tar.gz \
 && echo "${EFA_INSTALLER_SHA256}  /tmp/efa.tar.gz" | sha256sum -c - \
 && tar -xzf /tmp/efa.tar.gz -C /tmp \
 && cd /tmp/aws-efa-installer \
 && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
 && cd / && rm -rf /tmp/aws-efa-installer /tmp/efa.tar.gz; fi \
 && apt-get purge -y curl && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*
LABEL io.llmtrain.base-image="${CUDA_BASE_IMAGE}" \
      io.llmtrain.efa-installer="${EFA_INSTALLER_VERSION}"

# ------------------------------------------------------------------------------------------------
# trainer-deps: a venv with the trainer's third-party dependencies, from the lock only (its layer is
# keyed by requirements/bootstrap.txt and requirements/trainer-image.txt, not by pyproject.toml)
# ------------------------------------------------------------------------------------------------
FROM trainer-base AS trainer-deps
# The same pip/setuptools scripts/venv.sh uses.
ARG PIP_VERSION=26.3
ARG SETUPTOOLS_VERSION=84.2.1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/bootstrap.txt requirements/trainer-image.txt ./requirements/
# The build secret build-ca, when given, is the CA bundle pip trusts (a TLS-intercepting proxy's).
RUN --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps -r requirements/bootstrap.txt \
 && /opt/venv/bin/python -c "import pip; assert pip.__version__ == '${PIP_VERSION}', pip.__version__"
# Core + [trainer], locked with hashes. --no-build-isolation: python-etcd is an sdist only, built
# with the locked setuptools.
RUN --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
 && /opt/venv/bin/pip install --require-hashes --no-deps --no-build-isolation -r requirements/trainer-image.txt

# ------------------------------------------------------------------------------------------------
# trainer-build: llmtrain itself, installed into the venv under a staging root (/opt/llmtrain-root
# holds only its files, at their /opt/venv paths), then checked in place with the dependencies
# ------------------------------------------------------------------------------------------------
FROM trainer-deps AS trainer-build
# Versions the image must end up with; the build fails if pip resolved anything else.
ARG TORCH_VERSION=2.15.0
ARG NCCL_VERSION=2.30.7
COPY pyproject.toml constraints.txt ./
COPY operator/llmtrain ./operator/llmtrain
COPY trainer/llmtrain_trainer ./trainer/llmtrain_trainer
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation --root /opt/llmtrain-root . \
 && cp -a /opt/llmtrain-root/. / \
 && /opt/venv/bin/python -c "import torch, llmtrain_trainer; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__; assert '.'.join(map(str, torch.cuda.nccl.version())) == '${NCCL_VERSION}', torch.cuda.nccl.version()" \
 && /opt/venv/bin/python -m llmtrain_trainer.launch --help > /dev/null

# ------------------------------------------------------------------------------------------------
# trainer: what the rendered PyTorchJob runs: command ["python", "-m", "llmtrain_trainer.launch"]
# (torchrun with a clean stop), args [..., "-m", "llmtrain_trainer"]
# ------------------------------------------------------------------------------------------------
FROM trainer-base AS trainer
ARG UID=65532
RUN groupadd --gid "${UID}" llmtrain \
 && useradd --uid "${UID}" --gid "${UID}" --create-home --home-dir /home/llmtrain --shell /usr/sbin/nologin llmtrain
# The third-party venv: one layer that changes only with the lock.
COPY --from=trainer-deps /opt/venv /opt/venv
# IPC_LOCK for EFA pods (libfabric pins registered buffers), usable by the non-root user: a
# permitted-only file capability on the interpreter (no effective bit, so pods that drop every
# capability, CPU jobs, still exec it; they simply gain nothing), raised into the effective set
# by the trainer at start-up (llmtrain_trainer.distributed.capabilities). Exec with file capabilities runs in
# glibc's secure mode, which ignores LD_LIBRARY_PATH, so the EFA and OFI-NCCL libraries are also
# registered with the dynamic linker.
RUN setcap cap_ipc_lock=+p "$(readlink -f /opt/venv/bin/python)" \
 && printf '%s\n' /opt/amazon/ofi-nccl/lib /opt/amazon/efa/lib > /etc/ld.so.conf.d/llmtrain-efa.conf \
 && ldconfig
# llmtrain's own packages and console scripts, into the same venv: the small layer a commit changes.
COPY --from=trainer-build /opt/llmtrain-root/ /
# aws-ofi-nccl and libfabric first on the library path so NCCL (from the nvidia-nccl wheel) finds
# the EFA plugin; NCCL_DEBUG=INFO in a job shows "NET/OFI Selected provider is efa".
ENV PATH=/opt/venv/bin:/opt/amazon/efa/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONUNBUFFERED=1 \
    HOME=/home/llmtrain
WORKDIR /home/llmtrain
USER ${UID}:${UID}
# Prometheus metrics: 9410 + local rank (8 GPUs per node).
EXPOSE 9410-9417
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launch"]
CMD ["--nproc-per-node=gpu", "-m", "llmtrain_trainer"]

# ------------------------------------------------------------------------------------------------
# operator: slim Python, core + [operator] only (no torch)
# ------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator-build
ARG PIP_VERSION=26.3
ARG SETUPTOOLS_VERSION=84.2.1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/bootstrap.txt requirements/operator-image.txt ./requirements/
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps -r requirements/bootstrap.txt \
 && /opt/venv/bin/python -c "import pip; assert pip.__version__ == '${PIP_VERSION}', pip.__version__"
COPY pyproject.toml constraints.txt ./
RUN /opt/venv/bin/pip install --require-hashes --no-deps -r requirements/operator-image.txt
COPY operator/llmtrain ./operator/llmtrain
COPY trainer/llmtrain_trainer ./trainer/llmtrain_trainer
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
 && /opt/venv/bin/llmtrain-operator --help > /dev/null

FROM ${PYTHON_IMAGE} AS operator
ARG UID=65532
RUN groupadd --gid "${UID}" llmtrain \
 && useradd --uid "${UID}" --gid "${UID}" --no-create-home --shell /usr/sbin/nologin llmtrain
COPY --from=operator-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1
USER ${UID}:${UID}
# kopf health (8080) and operator metrics (8000), as the chart's probes and Service expect.
EXPOSE 8000 8080
ENTRYPOINT ["llmtrain-operator"]

# ------------------------------------------------------------------------------------------------
# debug-tools: htop and nvtop for the chart's optional debugTools DaemonSet on GPU nodes
# (docker build --target debug-tools -t public.ecr.aws/llmtrain/llmtrain-debug-tools:0.1.0 .)
# ------------------------------------------------------------------------------------------------
FROM ${CUDA_BASE_IMAGE} AS debug-tools
# DL3008: as above, the base image tag pins the distribution release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends htop nvtop \
 && rm -rf /var/lib/apt/lists/*
ARG UID=65532
USER ${UID}:${UID}
ENTRYPOINT ["sleep", "infinity"]
