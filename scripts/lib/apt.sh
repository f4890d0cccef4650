# shellcheck shell=bash
# apt_install PKG...: install Debian packages as root (or through sudo), quietly. Sourced by the tool
# scripts that need a host package (etcd, promtool, the real node's container runtime, the image
# builder); the caller's `die` reports a failure. Callers run it under `set -e`.
apt_install() {
    local pkgs=("$@")
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${pkgs[*]}"
        sudo=(sudo)
    fi
    log "apt-get install ${pkgs[*]}"
    # One apt-get at a time: on a fresh machine make's parallel jobs (make setup's tools and trainer
    # image) both install packages, and apt-get fails at once on a lock another one holds ("Could not
    # get lock /var/lib/apt/lists/lock"). The flock serialises ours; the timeout waits out anyone
    # else's (unattended-upgrades).
    local lock="${TMPDIR:-/tmp}/llmtrain-apt.lock"
    (
        flock 9
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
            install -y -qq --no-install-recommends "${pkgs[@]}" >&2
    ) 9>"$lock"
}
