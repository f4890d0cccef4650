"""A job whose PyTorchJob cannot be rendered ends Failed with the reason and an event, is not retried,
and gets no PyTorchJob (issue 8, defect 4). The renderer takes every user string (values go in as
JSON), and validation refuses a bad `spec.rendezvous.endpoint`; what is left to fail is the
operator's own `--default-etcd-endpoint`, which only the render reads. Its own module: no other
operator (the module-scoped shared one) may act on the job meanwhile."""

from __future__ import annotations

from .conftest import wait_for
from .test_operator_cluster import tiny
from .test_operator_consistency import _create, own_operator  # noqa: F401 — fixture


def test_a_job_the_renderer_cannot_handle_ends_failed_with_the_reason(own_operator, kube, namespace):  # noqa: F811
    own_operator("--default-etcd-endpoint", "etcd:notaport")
    _create(kube, namespace, "badrdzv", tiny(rendezvous={"backend": "etcd-v2"}))
    status = kube.wait_phase(namespace, "badrdzv", "Failed")
    assert status["reason"] == "RenderFailed"
    assert status["message"].startswith("cannot render the PyTorchJob of attempt 1:")
    assert "notaport" in status["message"]
    wait_for(
        lambda: any(e.type == "Warning" and e.reason == "RenderFailed" for e in kube.events(namespace, "badrdzv")),
        15,
        "a RenderFailed event",
    )
    assert not kube.ptjs(namespace, "badrdzv")
