"""The trainer makes a permitted IPC_LOCK effective (how EFA pods' non-root workers get it from the
image's file capability; issue 10, defect 7), checked against the kernel's own view in /proc."""

import subprocess
import sys

CHILD = r"""
import ctypes
from llmtrain_trainer.distributed.capabilities import _CAPABILITY_VERSION_3, _Data, _Header, raise_permitted

def caps(name):
    line = next(l for l in open("/proc/self/status") if l.startswith(name + ":"))
    return int(line.split()[1], 16)

libc = ctypes.CDLL(None, use_errno=True)
h, d = _Header(_CAPABILITY_VERSION_3, 0), (_Data * 2)()
assert libc.capget(ctypes.byref(h), d) == 0
bit = 1 << 14
permitted = bool(caps("CapPrm") & bit)
d[0].effective &= ~bit  # start as an exec'd non-root process would: permitted, not effective
if sys.argv[1] == "not-permitted":
    d[0].permitted &= ~bit
    permitted = False
assert libc.capset(ctypes.byref(h), d) == 0
assert not caps("CapEff") & bit
ok = raise_permitted()
assert ok == permitted == bool(caps("CapEff") & bit), (ok, permitted, hex(caps("CapEff")))
print("raised" if ok else "not permitted")
"""


def run(mode):
    r = subprocess.run([sys.executable, "-c", "import sys\n" + CHILD, mode], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_permitted_ipc_lock_becomes_effective_and_nothing_is_gained_otherwise():
    first = run("as-is")  # "raised" where the process may hold IPC_LOCK (root CI), else "not permitted"
    assert first in ("raised", "not permitted")
    assert run("not-permitted") == "not permitted"
