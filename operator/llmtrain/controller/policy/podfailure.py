"""What a failed worker pod says: the pod watch's cheap read of it (`raw_failure`: which node,
which exit code, which message, or None for a pod that did not fail by itself), the one short
reason the patterns give it (`classify`: an XID, OOMKilled, the preflight check, an NCCL or EFA
error, else the exit code and the exception that llmtrain_trainer.launch names as torchrun's root
cause: "exit 1: ValueError"), and which failures are a node's own (`culprits`: a rank that only lost
its peer says so). Pure; the termination message is the tenant's text, so every pattern is linear
in it. The node verdicts made from these (status.badNodes, status.avoidNodes) are nodes.py's.
"""

from __future__ import annotations

import re

from ...pod_contract import ALSO_FAILED, PREFLIGHT_EXIT_CODE, ROOT_CAUSE
from .child_status import owner_uid

# Every pattern here runs on a termination message the tenant's container wrote. So each is linear
# in its input: possessive quantifiers (`*+`) never give back whitespace to a later quantifier, and
# every gap (`[^)]`, `[^\n]`) has a bound; the message is cut to MAX_MESSAGE_CHARS before any of
# them runs (the kubelet's own limit is 4 KiB; a pod status written through the API has none).
# (The old XID pattern backtracked cubically: "xid" + 4,000 spaces took minutes.)
MAX_MESSAGE_CHARS = 4096
# "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus" (the kernel log line a
# failing GPU leaves, which torch/NCCL error text or a log-tailing entrypoint may carry) or "XID 48".
_XID = re.compile(r"\bxid\b\s*+(?:\([^)]{0,40}\)\s*+)?(?:[:=]\s*+)?(\d{1,3})\b", re.IGNORECASE)
_NCCL = re.compile(r"nccl|watchdog caught collective operation timeout|ProcessGroupNCCL", re.IGNORECASE)
_EFA = re.compile(r"\befa\b|libfabric|\bfi_[a-z_]|FI_EFA|rdma", re.IGNORECASE)
# A rank that only lost its peer says so: blaming its node too would empty a cluster one gang at a time.
# So does a pod whose torchrun was restarting in place when another pod's torchrun, its own in-place
# restarts spent, gave up and closed the rendezvous: its agent fails to rejoin with
# RendezvousClosedError (llmtrain never reuses a rendezvous id, so a closed one was closed by a peer).
_REMOTE = (
    "remote process exited",
    "ncclremoteerror",
    "connection reset by peer",
    "connection closed by peer",
    "connection closed by remote peer",
    "rendezvousclosederror",
)
# The first line the launcher writes for torchrun's root cause (pod_contract.ROOT_CAUSE):
# "torchrun failed; root cause: rank 3 (local 1): ValueError: boom", "... rank 3 (local 1): SIGKILL
# (signal 9)" or "... RendezvousClosedError". Only a Python identifier is taken from it, and it goes
# after the exit code ("exit 1: ValueError"), so a tenant's text can never read as a reason that
# means something else (a lost node's, an XID's). The pod is classified by its root cause and that
# one's traceback (`_own`): the lines about its other failed ranks (pod_contract.ALSO_FAILED), which
# typically only lost the root cause's rank, are left out.
_ROOT_CAUSE_TYPE = re.compile(
    re.escape(ROOT_CAUSE) + r"(?: rank \d{1,7} \(local \d{1,5}\):)? ([A-Za-z_]\w{0,99})(?=:| \(|\n|$)", re.ASCII
)
_TIMEOUT_MS = re.compile(r"timeout\(ms\)=\d", re.IGNORECASE)
_TIMED_OUT = ("timeout", "time out", "timedout", "timed out")


def _on_one_line(text: str, first: str, then: tuple[str, ...]) -> bool:
    """`first.*(then[0]|then[1]|...)` within one line of (lower-case) `text`, by substring search:
    linear, where the regex's `.*` was quadratic in the number of `first`s."""
    start = text.find(first)
    while start >= 0:
        end = text.find("\n", start)
        rest = text[start + len(first) : end if end >= 0 else len(text)]
        if any(t in rest for t in then):
            return True
        if end < 0:
            return False
        start = text.find(first, end)
    return False


def _own(text: str) -> str:
    """The launcher's message without its lines about the pod's other failed ranks; any other
    text as it is."""
    if not text.startswith(ROOT_CAUSE):
        return text
    return "\n".join(line for line in text.split("\n") if not line.startswith(ALSO_FAILED))


def _is_remote(text: str) -> bool:
    low = text.lower()
    return any(r in low for r in _REMOTE) or _on_one_line(low, "peer ", (" closed",))


def _head(text: str | None) -> str:
    """The message as the patterns read it: bounded, and only the root cause's part of the launcher's."""
    return _own((text or "")[:MAX_MESSAGE_CHARS])


def xid_of(text: str | None) -> int | None:
    """The NVIDIA XID error number in `text`, if it names one."""
    m = _XID.search(_head(text))
    return int(m.group(1)) if m else None


def root_cause_type(text: str | None) -> str | None:
    """The exception type the launcher's root-cause line names (at the message's start), if any."""
    m = _ROOT_CAUSE_TYPE.match(_head(text))
    return m.group(1) if m else None


# What a restart's message quotes of a root cause's own words (root_cause_detail): one line, cut.
MAX_DETAIL_CHARS = 240
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def root_cause_detail(text: str | None) -> str | None:
    """The root cause's own words after its exception type, from the launcher's root-cause line
    ("... RuntimeError: checkpoint.uri /ckpt is not writable: ..." → "checkpoint.uri /ckpt is not
    writable: ..."): the tenant's text, so only quoted after the classified reason, on one line,
    without control characters, cut to MAX_DETAIL_CHARS. None without such a line."""
    head = _head(text)
    m = _ROOT_CAUSE_TYPE.match(head)
    if not m or not head.startswith(": ", m.end()):
        return None
    words = _UNPRINTABLE.sub(" ", head[m.end() + 2 :].split("\n", 1)[0]).strip()
    if len(words) > MAX_DETAIL_CHARS:
        words = words[: MAX_DETAIL_CHARS - 1] + "…"
    return words or None


def is_collective_timeout(text: str | None) -> bool:
    low = _head(text).lower()
    return (
        "collective operation timeout" in low
        or bool(_TIMEOUT_MS.search(low))
        or _on_one_line(low, "watchdog", _TIMED_OUT)
        or _on_one_line(low, "nccl", ("timeout",))
    )


def classify(exit_code: int | None, k8s_reason: str | None, message: str | None) -> str:
    """One short reason for a failed worker container, most specific first: an XID names the GPU's
    own fault; OOMKilled is the kernel's; NCCL/EFA text says the network path; else the exit code."""
    message = _head(message)
    xid = xid_of(message)
    if xid is not None:
        return f"XID {xid}"
    if k8s_reason == "OOMKilled":
        return "OOMKilled"
    if exit_code == PREFLIGHT_EXIT_CODE:
        return "preflight"
    if message and is_collective_timeout(message):
        return "NCCL collective timeout"
    if message and _EFA.search(message):
        return "EFA error"
    if message and _NCCL.search(message):
        return "NCCL error"
    if k8s_reason and k8s_reason not in ("Error", "Completed"):
        return k8s_reason if exit_code in (None, 0) else f"{k8s_reason} (exit {exit_code})"
    base = f"exit {exit_code}" if exit_code is not None else "failed"
    raised = root_cause_type(message)
    return f"{base}: {raised}" if raised else base


# The DisruptionTarget reasons that are the node's doing before the pod has ended: the taint-eviction
# controller's, for a NoExecute taint (node.kubernetes.io/not-ready or unreachable on a node that
# stopped being Ready). It marks the pod while it still runs, then deletes it; the pod GC's
# DeletionByPodGC (node deleted) comes with phase Failed.
NODE_EVICTIONS = ("DeletionByTaintManager",)


def raw_failure(pod: dict) -> dict | None:
    """What a failed worker pod says about its node, unclassified (no pattern runs: this is what the
    pod watch does on the event loop), or None if it did not fail (or was a bystander killed by the
    gang's teardown, or never ran on a node, or is not a pod of a backend's). A pod evicted for
    its node (NODE_EVICTIONS) failed on that node, from the moment it is marked. Pod as the API
    returns it (camelCase)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    owner = owner_uid(pod)
    if not node or not owner:
        return None
    term = None
    for c in status.get("containerStatuses") or []:
        t = (c.get("state") or {}).get("terminated")
        if t and t.get("exitCode") not in (None, 0):
            term = t
            break
    disrupted = [
        c
        for c in status.get("conditions") or []
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True" and c.get("reason")
    ]
    evicted = [c for c in disrupted if c.get("reason") in NODE_EVICTIONS]
    if evicted:  # its node's trouble took it away, whatever its containers said on the way out
        term = {"reason": evicted[0].get("reason"), "message": evicted[0].get("message")}
    elif term is None:  # Evicted and such say why in status.reason; the pod GC (node deleted) in a condition
        why = [status] if status.get("reason") else disrupted
        if status.get("phase") != "Failed" or not why:
            return None
        term = {"reason": why[0].get("reason"), "message": why[0].get("message")}
    elif meta.get("deletionTimestamp"):
        return None  # killed by the teardown of the gang, not failed by itself
    exit_code = term.get("exitCode")
    out = {
        "node": str(node)[:253],
        "pod": meta.get("name"),
        "owner": owner,
        "exitCode": exit_code if isinstance(exit_code, int) else None,
        "k8sReason": str(term.get("reason") or "")[:128] or None,
        "finishedAt": term.get("finishedAt"),
    }
    text = term.get("message")
    message = text[:MAX_MESSAGE_CHARS].strip() if isinstance(text, str) else ""
    if message:
        out["message"] = message
    return out


def classified(raw: dict) -> dict:
    """A raw failure with its reason (and XID): the patterns run here, on a handler thread."""
    if "reason" in raw:
        return raw
    out = {k: v for k, v in raw.items() if k != "k8sReason"}
    out["reason"] = classify(raw.get("exitCode"), raw.get("k8sReason"), raw.get("message"))
    xid = xid_of(raw.get("message"))
    if xid is not None:
        out["xid"] = xid
    return out


def failure_of(pod: dict) -> dict | None:
    """`raw_failure`, classified."""
    raw = raw_failure(pod)
    return classified(raw) if raw is not None else None


def culprits(failures: list[dict]) -> list[dict]:
    """The failures to blame nodes for: when some pods failed on their own and others only report
    that a peer went away (NCCL 'remote process exited', 'Connection reset by peer'), the latter are
    victims of the former and their nodes are left alone."""
    own = [f for f in failures if not _is_remote(_head(f.get("message")))]
    return own or list(failures)
