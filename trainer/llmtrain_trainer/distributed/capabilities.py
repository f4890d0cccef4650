"""Make CAP_IPC_LOCK effective for the non-root trainer on EFA pods.

Kubernetes adds a capability (`securityContext.capabilities.add`) only to the bounding set of a
non-root container process; it never reaches the permitted or effective set. The trainer image
gives its interpreter IPC_LOCK as a permitted-only file capability (Dockerfile), so an exec of it
in a pod whose bounding set holds IPC_LOCK (EFA pods, `allowPrivilegeEscalation: true`) starts
with IPC_LOCK permitted; this module raises it into the effective set with capset(2), which is what
mlock/ibv_reg_mr check when libfabric pins the buffers it registers with the EFA device. Anywhere
else (CPU pods, laptops) the capability is not permitted and nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

CAP_IPC_LOCK = 14
_CAPABILITY_VERSION_3 = 0x20080522  # two 32-bit words per set


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def raise_permitted(cap: int = CAP_IPC_LOCK) -> bool:
    """Raise `cap` into the effective set if it is permitted. True if it is effective afterwards."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    header, data = _Header(_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    word, bit = divmod(cap, 32)
    mask = 1 << bit
    if data[word].effective & mask:
        return True
    if not data[word].permitted & mask:
        return False
    data[word].effective |= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        log.warning("could not raise capability %d: errno %d", cap, ctypes.get_errno())
        return False
    return True
