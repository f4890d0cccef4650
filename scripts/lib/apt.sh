# shellcheck shell=bash
# apt_install PKG...: install Debian packages as root (or through sudo), quietly. Sourced by the tool
# scripts that need a host package (etcd, promtool, the real node's container runtime, the image
# builder); the caller's `die` reports a failure.
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
