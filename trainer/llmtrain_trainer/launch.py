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
the wrapper exits llmtrain.pod_contract.PREFLIGHT_EXIT_CODE (86), which the operator reads from the
pod's terminated state (controller/policy/preflight.py) to avoid the suspect node(s) and retry without
spending a restart.
LLMTRAIN_PREFLIGHT_ARGS adds healthcheck options (e.g. "--size-mib 256 --iters 10"). The preflight
round never restarts in place (`--max-restarts=0`): its verdict is the point, not getting through.

In-place restarts (`--max-restarts`, spec.resilience.inPlaceRestarts): torchrun runs with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, so each rendezvous round's workers get a TCPStore of their own
(hosted by the new rank 0 on a fresh port). With the store torchrun's agent shares across rounds
(PyTorch's default), the restarted workers found the dead ones' gloo/NCCL addresses still in it and
failed to connect until the stale keys happened to be overwritten: one SIGKILLed rank spent two
in-place restarts instead of one (tests/trainer/test_inplace_restart.py).

Root cause: the workers' entry point (llmtrain_trainer.__main__) is under torch's `@record`, which
writes a failing rank's exception to the error file torchrun gives it; torchrun runs as
llmtrain_trainer.torchrun, which on a failure writes every failed rank (exit code, signal, recorded
exception), or its agent's own exception (such as `RendezvousClosedError`), to a file of this
wrapper's. From it the wrapper writes the container's termination message (`root_cause_message`):
llmtrain.pod_contract.ROOT_CAUSE and the root cause in one line (a rank killed by a signal such as
SIGKILL first, one that torchrun's teardown stopped last), the other failed ranks a line each, then
the end of the root cause's traceback, within Kubernetes' 4 KiB. Without it the kubelet keeps the
log's last 2 KiB (`FallbackToLogsOnError`), which with 8 ranks per pod is torchrun's summary alone:
bare "exitcode: 1" lines that say neither which exception nor whether the rank only lost a peer.

Final summary: on a clean exit the termination message is the trainer's final figures instead
(llmtrain/final_summary.py: step, loss, tokens/s, MFU and the attempt's goodput counters), which the
pod's local rank 0 writes to a file of this wrapper's ($LLMTRAIN_FINAL_SUMMARY) as it exits 0. The
operator writes them into status.progress when the job succeeds: its last scrape of /metrics is up to
one progress interval old by then.
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

from llmtrain.pod_contract import ALSO_FAILED, PREFLIGHT_ENV, PREFLIGHT_EXIT_CODE, ROOT_CAUSE

from .torchrun import FAILURES_ENV, FINAL_SUMMARY_ENV, MAX_FAILURES


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
    """torchrun, as llmtrain_trainer.torchrun runs it (which also writes what failed)."""
    return [sys.executable, "-m", "llmtrain_trainer.torchrun", *args]


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


TERMINATION_MESSAGE_BYTES = 4096  # the kubelet reads at most this much of a termination message
MAX_FAILURES_FILE_BYTES = 1 << 20  # of what llmtrain_trainer.torchrun wrote: a larger one is not parsed
MAX_OTHERS = 15  # failed ranks listed after the root cause (8 GPUs per node: all of them)
ROOT_CAUSE_LINE_CHARS = 512  # of an exception's first line


def termination_log() -> str:
    return os.environ.get("LLMTRAIN_TERMINATION_LOG", "/dev/termination-log")


def write_termination_message(text: str) -> None:
    """`text` as the container's termination message. Kubernetes mounts the default path into the
    container; where it does not exist (not in a pod) nothing is created. An explicit
    LLMTRAIN_TERMINATION_LOG is created; an empty one writes nothing."""
    path = termination_log()
    if not path:
        return
    flags = os.O_WRONLY | os.O_TRUNC | (os.O_CREAT if os.environ.get("LLMTRAIN_TERMINATION_LOG") else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)


def _what(failure: dict) -> str:
    """One failure in a line: its exception's first line, else the signal, else the exit code."""
    message = failure.get("message")
    if isinstance(message, str) and message.strip():
        return message.strip().splitlines()[0][:ROOT_CAUSE_LINE_CHARS]
    code = failure.get("exitCode")
    if isinstance(failure.get("signal"), str) and isinstance(code, int):
        return f"{failure['signal'][:16]} (signal {-code})"
    return f"exit {code}" if isinstance(code, int) else "failed"


# The signals torchrun's agent stops the other workers with (and the kubelet the pod): a rank they
# killed is a bystander, never the root cause.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def _rank_of(exit_code: int) -> int:
    """Which failure is the root cause, first to last: a rank killed by another signal (the kernel's
    SIGKILL, a crash's SIGSEGV or SIGABRT: a peer's death never kills a rank so, the ranks that lost
    it raise), then ranks that exited (an exception), then those stopped by STOP_SIGNALS."""
    if exit_code >= 0:
        return 1
    return 2 if -exit_code in STOP_SIGNALS else 0


def _failures(data: object) -> list[dict]:
    listed = data.get("failures") if isinstance(data, dict) else None
    out = []
    for f in listed[:MAX_FAILURES] if isinstance(listed, list) else []:
        if isinstance(f, dict) and all(isinstance(f.get(k), int) for k in ("rank", "localRank", "exitCode", "time")):
            out.append(f)
    return out


def root_cause_message(failures_file: str, limit: int = TERMINATION_MESSAGE_BYTES) -> str | None:
    """The termination message of a torchrun that failed, from what llmtrain_trainer.torchrun wrote:
    llmtrain.pod_contract.ROOT_CAUSE and the root cause in a line, the pod's other failed ranks a line
    each, then as much of the end of the root cause's traceback as fits in `limit` bytes (UTF-8),
    cut at a line. The root cause is the first failure in `_rank_of`'s order, then by time and
    rank (torchrun's own pick is the smallest whole-second time, then rank); or torchrun's own
    exception. None without a usable record. The file carries the tenant's text
    (exceptions): read bounded, parsed as JSON only, its shape checked."""
    try:
        with open(failures_file, "rb") as file:
            data = json.loads(file.read(MAX_FAILURES_FILE_BYTES))
    except (OSError, ValueError):  # absent, cut, not JSON, not UTF-8
        return None
    failures = _failures(data)
    agent = data.get("agent") if isinstance(data, dict) else None
    if failures:
        root = min(failures, key=lambda f: (_rank_of(f["exitCode"]), f["time"], f["rank"]))
        lines = [f"{ROOT_CAUSE} rank {root['rank']} (local {root['localRank']}): {_what(root)}"]
        others = [f for f in failures if f is not root]
        shown = 0
        for f in others[:MAX_OTHERS]:  # in at most half the message: the traceback gets the rest
            line = f"{ALSO_FAILED} {f['rank']} (local {f['localRank']}): {_what(f)[:200]}"
            if len("\n".join([*lines, line]).encode()) > limit // 2:
                break
            lines.append(line)
            shown += 1
        if len(others) > shown:
            lines.append(f"{ALSO_FAILED}s: {len(others) - shown} more")
    elif isinstance(agent, dict) and isinstance(agent.get("message"), str) and agent["message"].strip():
        root = agent
        lines = [f"{ROOT_CAUSE} {_what(agent)}"]
    else:
        return None
    head = "\n".join(lines)
    room = limit - len(head.encode()) - 1
    stack = root.get("traceback")
    tail = (stack if isinstance(stack, str) else "").strip().encode()
    if room <= 0:
        return head.encode()[:limit].decode(errors="ignore")
    if len(tail) > room:
        tail = tail[-room:]
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else b""
    text = tail.decode(errors="ignore").strip()
    return f"{head}\n{text}" if text else head


def final_summary_message(path: str) -> str | None:
    """The final summary the workers wrote at `path`, if it is one (llmtrain.final_summary's strict
    `parse_summary`: a cut or foreign file is not passed on), else None."""
    # Imported only here, on the way out of a clean run: the wrapper stays stdlib-only while training runs.
    from llmtrain.final_summary import MAX_BYTES, parse_summary

    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES + 1).decode()
    except (OSError, UnicodeDecodeError):
        return None
    return text if parse_summary(text) is not None else None


class Launcher:
    """torchrun as a child, with the signal handling described above, for one or more rounds."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.signals = 0
        self.root_cause: str | None = None
        self.final: str | None = None
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
        """torchrun's exit code. After a failure with a recorded exception, `root_cause` is the
        termination message that names it (`root_cause_message`), else None; after a clean exit,
        `final` is the workers' final summary (`final_summary_message`), else None."""
        self.root_cause = self.final = None
        with tempfile.TemporaryDirectory(prefix="llmtrain-torchrun-") as tmp:
            failures, summary = os.path.join(tmp, "failures.json"), os.path.join(tmp, "final-summary")
            rc = self._torchrun(args, {**torchrun_env(env), FAILURES_ENV: failures, FINAL_SUMMARY_ENV: summary})
            if rc != 0:
                self.root_cause = root_cause_message(failures)
            elif os.path.exists(summary):
                self.final = final_summary_message(summary)
        return rc

    def _torchrun(self, args: list[str], env: dict) -> int:
        self.proc = proc = subprocess.Popen(torchrun_command(args), start_new_session=True, env=env)
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
            # (the health check pulls torch).
            from .distributed.healthcheck import termination_message

            text = termination_message(verdict)
            write_termination_message(text)
            print(f"llmtrain launch: preflight health check failed, not training: {text}", file=sys.stderr, flush=True)
            return PREFLIGHT_EXIT_CODE
        if rc != 0:
            print(f"llmtrain launch: preflight health check exited {rc} without a verdict", file=sys.stderr, flush=True)
            self.report_root_cause()
            return rc
        print("llmtrain launch: preflight health check passed", file=sys.stderr, flush=True)
        return 0

    def report_root_cause(self) -> None:
        """The last run's recorded exception, if any, as the termination message and on stderr."""
        if self.root_cause:
            write_termination_message(self.root_cause)
            print(f"llmtrain launch: {self.root_cause.splitlines()[0]}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    launcher = Launcher()
    if os.environ.get(PREFLIGHT_ENV) == "1":
        code = launcher.preflight(args)
        if code != 0 or launcher.signals:  # unfit nodes, an error, or asked to stop meanwhile
            return code
    code = launcher.run(args)
    launcher.report_root_cause()
    if launcher.final:  # a clean exit: the final figures, for the operator (llmtrain/final_summary.py)
        write_termination_message(launcher.final)
    return code


if __name__ == "__main__":
    sys.exit(main())
