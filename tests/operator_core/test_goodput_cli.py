"""`llmtrain goodput` (table and PNG timeline from a job's status) and the expected run that
`llmtrain plan` prints before a job starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmtrain import goodput as gp
from llmtrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_772_366_400.0  # 2026-03-01T12:00:00Z


def job() -> dict:
    s = lambda dt_: gp.stamp(T0 + dt_)
    return {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "llama", "namespace": "team-a", "creationTimestamp": s(0)},
        "status": {
            "phase": "Succeeded",
            "completionTime": s(1000),
            "goodput": {
                "attempts": [
                    {
                        "attempt": 1,
                        "createdTime": s(10),
                        "endTime": s(400),
                        "endReason": "Hang",
                        "trainStartTime": s(40),
                        "heartbeatTime": s(300),
                        "resumeStep": 0,
                        "step": 100,
                        "attemptSteps": 100,
                        "stepSeconds": 250.0,
                        "checkpointBlockingSeconds": 10.0,
                    },
                    {
                        "attempt": 2,
                        "createdTime": s(420),
                        "endTime": s(1000),
                        "endReason": "Succeeded",
                        "trainStartTime": s(450),
                        "heartbeatTime": s(990),
                        "resumeStep": 80,
                        "step": 300,
                        "attemptSteps": 220,
                        "stepSeconds": 528.0,
                        "dataWaitSeconds": 12.0,
                    },
                ]
            },
            "checkpoint": {"attempt": 2, "intervalSource": "spec", "reason": "spec.checkpoint.intervalMinutes: 60"},
        },
    }


def test_goodput_report_table_and_png(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job()))
    out_png = tmp_path / "timeline.png"
    assert main(["goodput", "--from-file", str(path), "--png", str(out_png)]) == 0
    text = capsys.readouterr().out
    # by hand: queued 10; starting 30 + 30; a1 steps 40..300 = 260 (stall 10, productive 250); hang 100;
    # restarting 20; a2 steps 450..990 = 540 (data wait 12; lost (100 - 80) × (528 - 12) / 220 = 46.9,
    # the redone steps' compute, their data wait being in the 12; productive 481.1); final save 10
    # → productive 731.1 of 1000
    assert "goodput 73.1% over 0:16:40" in text and "20 steps redone" in text
    rows = {line[2:42].strip(): line[42:].split() for line in text.splitlines() if line.startswith("  ")}
    assert rows["hang (last step → detection)"] == ["0:01:40", "10.0%"]
    assert rows["lost work (steps redone)"] == ["0:00:47", "4.7%"]
    assert rows["checkpoint stall"] == ["0:00:20", "2.0%"]
    assert "  checkpoint interval: spec.checkpoint.intervalMinutes: 60" in text  # status.checkpoint's why
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_goodput_needs_a_job():
    assert main(["goodput"]) == 2


def test_plan_shows_the_expected_run(capsys):
    assert main(["plan", str(ROOT / "examples" / "llama2-70b-p5-16nodes.yaml"), "--output", "json"]) == 0
    e = json.loads(capsys.readouterr().out)["expected"]
    assert e["steps"] == 3000 and e["tokens"] == 3000 * 4194304
    assert e["wall_seconds"] == pytest.approx(e["train_seconds"] + e["checkpoint_seconds"] + e["restart_seconds"])
    assert e["gpu_hours"] == pytest.approx(e["wall_seconds"] / 3600 * 128)
    assert e["checkpoints"] == int(e["train_seconds"] // (90 * 60)) and e["restarts"] > 0
    assert 0 < e["goodput"] < 1


def test_goodput_timeline_marks_every_checkpoint_the_status_knows(tmp_path):
    """Each ended attempt's record keeps the newest checkpoint it reported, and the current attempt's
    is in status.progress: the timeline marks all of them, once each (it marked only the last)."""
    import matplotlib.pyplot as plt

    from llmtrain import goodput_report

    s = lambda dt_: gp.stamp(T0 + dt_)
    j = job()
    a1, a2 = j["status"]["goodput"]["attempts"]
    a1.update(lastCheckpointStep=80, lastCheckpointTime=s(250))
    a2.update(lastCheckpointStep=280, lastCheckpointTime=s(940))
    # attempt 3, running: it resumed from step 280 (the same checkpoint, reported again) and saved 320
    a2["endReason"] = "Failed"
    j["status"].update(phase="Running", completionTime=None)
    j["status"]["goodput"]["attempts"].append({"attempt": 3, "createdTime": s(1010), "trainStartTime": s(1030)})
    j["status"]["progress"] = {"attempt": 3, "step": 330, "lastCheckpointStep": 320, "lastCheckpointTime": s(1100)}
    now = T0 + 1200

    assert goodput_report.checkpoints(j, now) == [(T0 + 250, 80), (T0 + 940, 280), (T0 + 1100, 320)]
    # a record that repeats a checkpoint already known (attempt 3's resume, as its progress says)
    j["status"]["goodput"]["attempts"][2].update(lastCheckpointStep=280, lastCheckpointTime=s(940))
    assert len(goodput_report.checkpoints(j, now)) == 3
    # one from before the report's span (a folded record's) is left out
    a1["lastCheckpointTime"] = s(-5)
    assert [step for _, step in goodput_report.checkpoints(j, now)] == [280, 320]
    a1["lastCheckpointTime"] = s(250)

    fig = goodput_report.figure(j, now)
    try:
        (ax,) = fig.axes
        marks = sorted(line.get_xdata()[0] for line in ax.lines if line.get_gid() == "checkpoint")
        labels = [t.get_text() for t in ax.texts]
    finally:
        plt.close(fig)
    assert marks == [250 / 60, 940 / 60, 1100 / 60]
    assert labels == ["ckpt 80", "ckpt 280", "ckpt 320"]
    assert f"checkpoints known: step 80 at {s(250)}, step 280 at {s(940)}, step 320 at {s(1100)}" in (
        goodput_report.table(j, now)
    )
    goodput_report.png(j, str(tmp_path / "t.png"), now)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_ended_attempt_keeps_its_newest_checkpoint():
    """decide closes an attempt's record with the trainer's last counters (goodput.closed); the
    newest checkpoint it reported is one of them."""
    progress = {"attempt": 1, "step": 120, "lastCheckpointStep": 100, "lastCheckpointTime": gp.stamp(T0 + 300)}
    g = gp.opened({}, 1, T0, job_created=T0)
    (rec,) = gp.closed(g, 1, T0 + 400, "Failed", progress)["attempts"]
    assert (rec["lastCheckpointStep"], rec["lastCheckpointTime"]) == (100, gp.stamp(T0 + 300))
    (a,) = gp.timeline_of(gp.closed(g, 1, T0 + 400, "Failed", progress), T0).attempts
    assert (a.last_checkpoint_step, a.last_checkpoint_time) == (100, T0 + 300)


def test_goodput_reads_a_live_job_and_its_events_from_the_api_server(kube, monkeypatch, capsys):
    # the job and its events through the operator's own raw client calls, against a real API server
    import uuid

    from llmtrain.controller.adapters import kube as opkube
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

    from .decide_world import tiny

    name = f"gp-{uuid.uuid4().hex[:6]}"
    doc = job()
    kube.apply("default", kube.job_doc(name, tiny()))
    created = kube.job("default", name)
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, name, {"status": doc["status"]}
    )
    monkeypatch.setattr(opkube, "_client", lambda: kube.api)
    ref = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": created["metadata"]["uid"],
        "namespace": "default",
    }
    opkube.post_event(ref, True, "Restarting", "attempt 1 hung: no step for 100 s")
    assert main(["goodput", name, "-n", "default"]) == 0
    text = capsys.readouterr().out
    assert f"default/{name}: goodput" in text and "(2 attempt record(s), 20 steps redone)" in text
    assert "Restarting" in text and "attempt 1 hung: no step for 100 s" in text
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
