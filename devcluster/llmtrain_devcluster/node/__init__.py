"""A real node beside the kwok fleet: kubelet + containerd + runc + a CNI bridge + CoreDNS."""
