"""A real node beside the kwok fleet: kubelet + containerd + runc + a CNI bridge + CoreDNS on this
machine, so real pods run (``python -m llmtrain_devcluster up --chain --real-node``).

One module per part: :mod:`.slots` (what keeps two nodes on one machine apart), :mod:`.cgroups`,
:mod:`.network` (bridge and CNI), :mod:`.containerd` and :mod:`.kubelet` (their configuration),
:mod:`.coredns`, :mod:`.images` (importing OCI archives), :mod:`.oci_archive` (writing them) and
:mod:`.lifecycle` (start, the teardown order, status).

Other code puts an image on the node with :func:`import_image` (skipped when the node already
holds that manifest), a directory of this machine in its pods with :func:`local_volume`
(:mod:`.volumes`: a bound PersistentVolume and claim), and its pods there with :func:`placement`
(a whole job: :func:`job_on_the_node`).
"""

from .images import import_image
from .kubelet import job_on_the_node, placement
from .lifecycle import NODE_NAME, down, start, status
from .volumes import local_volume

__all__ = ["NODE_NAME", "down", "import_image", "job_on_the_node", "local_volume", "placement", "start", "status"]
