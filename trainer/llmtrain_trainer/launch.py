"""`python -m llmtrain_trainer.launch [torchrun arguments]`: torchrun, with a clean stop that exits 0.

torchrun treats SIGTERM as its own death: it forwards the signal, gives the workers a fixed
`--shutdown-timeout` (30 s by default) and then exits 1 whatever they did — so a node drain or spot
interruption that the workers handled perfectly (checkpoint, exit 0) still looks like a failed pod,
and a save that takes longer than 30 s is killed half-way.

This wrapper runs torchrun as a child in its own session and, on SIGTERM or SIGINT, signals the
*workers* (torchrun's children) instead. They finish the micro-batch, checkpoint and exit 0, torchrun
sees every worker succeed and exits 0, and the wrapper exits with torchrun's code. The workers get
the whole pod grace period (`terminationGracePeriodSeconds`), not torchrun's 30 s. A second signal
kills the process tree at once. `llmtrain local` uses the same `stop_workers`.

Preflight (LLMTRAIN_PREFLIGHT=1, rendered when spec.resilience.preflight is on): before training,
the same torchrun arguments run `-m llmtrain_trainer healthcheck` on every rank, under a rendezvous
id of its own (`<id>-preflight`, so the training rendezvous starts fresh). Healthy: training starts.
Unhealthy (a failed device/compute/memory check, a slow node, or bus bandwidth below the catalog's):
training does not start; the check's compact verdict becomes the container's termination message and
the wrapper exits llmtrain.render.PREFLIGHT_EXIT_CODE (86), which the operator reads from the pod's terminated state
(controller/preflight.py) to avoid the suspect node(s) and retry without spending a restart.
LLMTRAIN_PREFLIGHT_ARGS adds healthcheck options (e.g. "--size-mib 256 --iters 10"). The preflight
round never restarts in place (`--max-restarts=0`): its verdict is the point, not getting through.

In-place restarts (`--max-restarts`, spec.resilience.inPlaceRestarts): torchrun runs with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, so each rendezvous round's workers get a TCPStore of their own
(hosted by the new rank 0 on a fresh port). With the store torchrun's agent shares across rounds
(PyTorch's default), the restarted workers found the dead ones' gloo/NCCL addresses still in it and
failed to connect until the stale keys happened to be overwritten: one SIGKILLed rank spent two
in-place restarts instead of one (tests/trainer/test_inplace_restart.py).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence


def free_port() -> int:
    """A TCP port free on every local address right now, found as torch's `get_free_port` finds it
    (bind port 0 on the dual-stack `::`, else on `0.0.0.0`) without importing torch: `llmtrain local`
    and the benchmarks' drivers only start torchrun, and importing torch for a port cost each of
    them ~4 s of CPU before the workers could start."""
    errors = []
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind((host, 0))
                return s.getsockname()[1]
        except OSError as e:
            errors.append(f"{host}: {e}")
    raise RuntimeError(f"no free TCP port ({'; '.join(errors)})")


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def stop_workers(torchrun: subprocess.Popen) -> None:
    """SIGTERM to torchrun's worker processes (to torchrun itself only if it has none yet)."""
    for pid in children(torchrun.pid) or [torchrun.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children before their own children."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def kill_tree(torchrun: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process below it. Killing its process group is not enough:
    torchrun starts each worker in a session of its own, so the workers would run on, orphaned."""
    for pid in [torchrun.pid, *descendants(torchrun.pid)]:  # listed before any of them dies
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def torchrun_env(env: dict | None = None) -> dict:
    """torchrun's environment: a fresh TCPStore per rendezvous round (see the module's doc) unless
    the environment says otherwise."""
    out = dict(os.environ if env is None else env)
    out.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return out


def preflight_args(args: list[str], report: str, extra: Sequence[str] = ()) -> list[str]:
    """The torchrun arguments of the preflight round: the training's, with the rendezvous id
    suffixed `-preflight` and the module's own arguments replaced by `healthcheck --report FILE`."""
    out: list[str] = []
    it = iter(args)
    for a in it:
        if a in ("-m", "--module"):
            module = next(it)
            return [*out, a, module, "healthcheck", "--report", report, *extra]
        if a.startswith(("--rdzv-id=", "--rdzv_id=")):
            a += "-preflight"
        elif a in ("--rdzv-id", "--rdzv_id"):
            a = f"{a}={next(it)}-preflight"
        elif a.startswith(("--max-restarts=", "--max_restarts=")):
            a = "--max-restarts=0"
        elif a in ("--max-restarts", "--max_restarts"):
            next(it)
            a = "--max-restarts=0"
        out.append(a)
    raise ValueError("no -m MODULE in the torchrun arguments")


def termination_log() -> str:
    return os.environ.get("LLMTRAIN_TERMINATION_LOG", "/dev/termination-log")


class Launcher:
    """torchrun as a child, with the signal handling described above, for one or more rounds."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.signals = 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        self.signals += 1
        if self.proc is None:
            return
        if self.signals == 1:
            print(
                f"llmtrain launch: {signal.Signals(signum).name}: stopping the workers (checkpoint, then "
                "exit); a second signal kills them",
                file=sys.stderr,
                flush=True,
            )
            stop_workers(self.proc)
        else:
            kill_tree(self.proc)

    def run(self, args: list[str], env: dict | None = None) -> int:
        self.proc = proc = subprocess.Popen(torchrun_command(args), start_new_session=True, env=torchrun_env(env))
        try:
            while True:
                try:
                    return proc.wait()
                except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
                    continue
        finally:
            if proc.poll() is None:
                kill_tree(proc)
                proc.wait()

    def preflight(self, args: list[str]) -> int:
        """0 when the nodes are fit to train; PREFLIGHT_EXIT_CODE (verdict written as the
        termination message) when the check says they are not; torchrun's code on an error."""
        extra = shlex.split(os.environ.get("LLMTRAIN_PREFLIGHT_ARGS", ""))
        with tempfile.TemporaryDirectory(prefix="llmtrain-preflight-") as tmp:
            report = os.path.join(tmp, "verdict.json")
            # the workers must not leave a (healthy) verdict as the termination message of a pod
            # that goes on to train: this wrapper writes it, only when the check fails
            env = {**os.environ, "LLMTRAIN_TERMINATION_LOG": ""}
            rc = self.run(preflight_args(args, report, extra), env)
            try:
                with open(report) as f:
                    verdict = json.load(f)
            except (OSError, ValueError):
                verdict = None
        if verdict is not None and not verdict.get("healthy", True):
            # Imported only here: the wrapper lives as long as the training and stays stdlib-only
            # (llmtrain.render, the pod contract shared with the operator, pulls pydantic/jinja2).
            from llmtrain.render import PREFLIGHT_EXIT_CODE

            from .distributed.healthcheck import termination_message

            text = termination_message(verdict)
            try:
                with open(termination_log(), "w") as f:
                    f.write(text)
            except OSError:
                pass  # not in a pod
            print(f"llmtrain launch: preflight health check failed, not training: {text}", file=sys.stderr, flush=True)
            return PREFLIGHT_EXIT_CODE
        if rc != 0:
            print(f"llmtrain launch: preflight health check exited {rc} without a verdict", file=sys.stderr, flush=True)
            return rc
        print("llmtrain launch: preflight health check passed", file=sys.stderr, flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    launcher = Launcher()
    if os.environ.get("LLMTRAIN_PREFLIGHT") == "1":
        code = launcher.preflight(args)
        if code != 0 or launcher.signals:  # unfit nodes, an error, or asked to stop meanwhile
            return code
    return launcher.run(args)


if __name__ == "__main__":
    sys.exit(main())
