"""`make demo`, the README's first command, end to end: its own dev cluster (a separate state dir,
free ports; chain mode: scheduler, kwok nodes, training-operator, JobSet, and a real node), the
chart, the operator with the release's RBAC, two p5 jobs in one Kueue queue with quota for one, one
per backend (Running and Queued, then the second Running once the first finished, and both
Succeeded), and the CPU job as two real pods of the trainer image on each backend (etcd rendezvous
over mTLS, then c10d through the JobSet's headless Service): their logs, the operator's scrapes of
rank 0 and, once Succeeded, the status from the termination message the kubelet wrote. Torn down
afterwards."""

import json
import re
import shutil
import subprocess

import pytest

STATE = ".dev-cluster-demo-test"

pytestmark = [pytest.mark.slow, pytest.mark.trainer]


def _columns(table: str, name: str) -> dict[str, str]:
    """The row of `name` in kubectl's table, header → value ("" where kubectl left it empty), each
    value read where its header starts."""
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("NAME "))
    row = next(line for line in lines if line.startswith(name + " "))
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}


def test_make_demo_runs_the_whole_path(own_clusters):
    env_args = [f"DEV_CLUSTER_STATE={STATE}"]
    try:
        run = subprocess.run(
            ["make", "--no-print-directory", "demo", *env_args], capture_output=True, text=True, timeout=600
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        assert "--rdzv-id=demo...tiny-cpu-" in out  # the rendered PyTorchJob was shown
        # Kueue, quota for one 2-node p5 job: the first job's two pods were scheduled onto the two
        # simulated p5.48xlarge nodes, Running, while the second waited Queued in Kueue's words...
        p5_rows = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-a1-worker-")][:2]
        assert len(p5_rows) == 2, out[-4000:]
        assert all(r[1] == "Running" and r[2].startswith("kwok-p5-48xlarge-") for r in p5_rows), p5_rows
        assert len({r[2] for r in p5_rows}) == 2, p5_rows
        queued = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-next ")]
        assert queued and queued[0][1] == "Pending" and "Queued" in queued[0], queued
        assert "insufficient unused quota" in out, out[-4000:]
        # ...and ran once the first finished: its pods on the same two nodes, the first's Succeeded
        second = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-next-a1-worker-")]
        assert len(second) == 2 and all(r[1] == "Running" for r in second), second
        assert {r[2] for r in second} == {r[2] for r in p5_rows}, (second, p5_rows)
        assert queued[-1][1] == "Running", queued
        # one job per backend, each to Succeeded: the first's attempt a PyTorchJob, the second's a JobSet
        rows = [r for r in (line.split() for line in out.splitlines()) if r[:1] in (["pytorchjob"], ["jobset"])]
        assert ["pytorchjob", "llama2-7b-p5", "llama2-7b-p5-a1", "Succeeded"] in rows, rows
        assert ["jobset", "llama2-7b-p5-next", "llama2-7b-p5-next-a1", "Succeeded"] in rows, rows
        try:
            _assert_cpu_jobs_ran_as_real_pods(out)
        except (AssertionError, StopIteration, ValueError, IndexError) as e:
            part = out[out.find("the real node beside the simulated fleet") :]
            raise AssertionError(f"{type(e).__name__}: {e}\n--- the demo's real-node part ---\n{part[-6000:]}") from e
    finally:
        down = subprocess.run(
            ["make", "--no-print-directory", "dev-cluster-down", *env_args], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        shutil.rmtree(STATE, ignore_errors=True)


def _assert_cpu_jobs_ran_as_real_pods(out: str) -> None:
    etcd_part, c10d_part = out.split("examples/tiny-cpu.yaml as tiny-cpu")[1:3]
    assert "namespace demo: Pod Security" in out and "pod-security.kubernetes.io/enforce=restricted" in out
    rows = {}
    for name, part in (("tiny-cpu", etcd_part), ("tiny-cpu-js", c10d_part)):
        # two pods on the real node, with addresses on its bridge (no pod pointed at 127.0.0.1)
        pods = [line.split() for line in part.splitlines() if line.startswith(f"{name}-a1-worker-")]
        assert len(pods) == 2 and all(p[2] == "Running" and p[6] == "real-node" for p in pods), pods
        assert all(p[5].startswith("10.245.") for p in pods), pods
        # the trainers, as kubectl logs -f shows them while they train (rank 0's are the events)
        logs = part.split("kubectl logs -f", 1)[1].split("final status")[0].splitlines()
        shown = "\n".join(logs)
        assert any(f"[pod/{name}-a1-worker-" in line and '{"event":"config"' in line for line in logs), shown
        assert any('{"event":"step","step":1,' in line for line in logs), f"no step 1:\n{shown}"
        final = part.split("final status")[1]
        row = rows[name] = _columns(final, name)
        # Succeeded at the trainer's last step: the termination message the real kubelet read from
        # the container; no ETA left
        assert row["PHASE"] == "Succeeded" and row["STEP"] == "40", row
        assert row["MFU"].endswith("%") and row["GOODPUT"].endswith("%") and row["ETA"] == "", row
        # progress while it ran came from the operator's scrapes of rank 0's pod IP
        assert "TrainingHealthy=True (StepsCompleting)" in final, final
    # etcd over HTTPS with the Secret the operator wrote, mounted where the rendered pod says
    assert "--rdzv-backend=etcd" in etcd_part and "cacert=/etc/llmtrain/rendezvous/ca.crt" in etcd_part
    assert "mountPath: /etc/llmtrain/rendezvous" in etcd_part
    assert "Etcd machines: ['https://10.245." in etcd_part and "Rendezvous version 1 is complete" in etcd_part
    # a JobSet's pods stay after success (the training-operator deletes a PyTorchJob's rank 0 then,
    # its log with it): the end of the run in rank 0's own log, and the status has its MFU
    end_line = next(line for line in c10d_part.splitlines() if '{"event":"end"' in line)
    end = json.loads(end_line[end_line.index('{"event":"end"') :])
    assert end["reason"] == "finished" and end["step"] == 40, end
    assert rows["tiny-cpu-js"]["MFU"] == f"{end['mfu'] * 100:.2f}%", (rows["tiny-cpu-js"], end)
    # c10d through the JobSet's headless Service: rank 0's FQDN, resolved by the cluster DNS
    assert "--rdzv-endpoint=tiny-cpu-js-a1-worker-0-0.tiny-cpu-js-a1:29400" in c10d_part
    # (rank 0's pod is the rendezvous' choice: either pod's FQDN under the Service)
    assert re.search(r"master_addr=tiny-cpu-js-a1-worker-0-[01]\.tiny-cpu-js-a1\.demo\.svc\.cluster\.local ", c10d_part)
    # same seed, same data, same world size: the same trajectory on either backend and rendezvous
    assert rows["tiny-cpu"]["LOSS"] == rows["tiny-cpu-js"]["LOSS"], rows
