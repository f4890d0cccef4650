"""llmtrain's Grafana dashboards, as code (grafana-foundation-sdk builders).

Three dashboards, each with a Prometheus datasource variable and namespace / job variables:

* ``llmtrain-gpu-health``: DCGM exporter metrics per job (GPUs held by the job's worker pods)
  and per node: utilisation, memory-copy utilisation, SM clock, temperature, power, framebuffer,
  XID errors.
* ``llmtrain-training``: the trainer's metrics per job: step, loss, tokens/s, MFU, TFLOP/s,
  step time, data wait, memory, checkpoints, heartbeat, restarts.
* ``llmtrain-operator``: the operator's reconciles, reconcile latency, jobs by phase, restarts.

``scripts/gen-dashboards.py`` writes ``build_all()`` to ``dashboards/generated/*.json`` and to
the chart (``charts/llmtrain-operator/files/dashboards/``); a test checks the checked-in JSON is
what this module builds, that Grafana's model (the SDK's ``Dashboard.from_json``) reads it back
without loss, that every query is valid PromQL (promtool) and that every metric a query names is
registered by the operator's / trainer's code or exported by DCGM exporter.

Joining GPUs to jobs: DCGM exporter labels each GPU series with the ``namespace``/``pod`` that
holds it (Kubernetes pod mapping, scraped with ``honorLabels: true``). The trainer's own series
carry ``llmtrain_job`` and are scraped from the same pods, so
``DCGM * on (namespace, pod) group_left (llmtrain_job) group by (...) (llmtrain_trainer_step)``
attributes each GPU to its job without kube-state-metrics label allow-lists.
"""

from __future__ import annotations

from typing import Any, Callable

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig,
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

TAGS = ["llmtrain"]
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Selectors shared by the queries (Grafana interpolates the multi-value variables as regexes).
JOB_SEL = 'namespace=~"$namespace", llmtrain_job=~"$job"'
NODE_SEL = 'Hostname=~"$node"'


def job_gpus(metric: str) -> str:
    """``metric`` (a DCGM series) restricted to the GPUs of the selected jobs, labelled with
    ``llmtrain_job``."""
    return (
        f"{metric}\n"
        f"* on (namespace, pod) group_left (llmtrain_job)\n"
        f"group by (namespace, pod, llmtrain_job) (llmtrain_trainer_step{{{JOB_SEL}}})"
    )


# ----- small builders ---------------------------------------------------------------------------
def _q(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def _thresholds(*steps: tuple[float | None, str]) -> gdash.ThresholdsConfig:
    return gdash.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=v, color=c) for v, c in steps])


def ts(title: str, queries: list[tuple[str, str]], *, unit: str = "short", desc: str = "",
       w: int = 12, h: int = 8, minv: float | None = None, maxv: float | None = None,
       thresholds: gdash.ThresholdsConfig | None = None, stack: bool = False) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).datasource(DS).unit(unit).span(w).height(h)
         .line_width(1).fill_opacity(10)
         .legend(VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
                 .placement(common.LegendPlacement.BOTTOM)))
    if desc:
        p = p.description(desc)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(_q(expr, legend, ref=chr(ord("A") + i)))
    if minv is not None:
        p = p.min(minv)
    if maxv is not None:
        p = p.max(maxv)
    if thresholds is not None:
        p = p.thresholds(thresholds).thresholds_style(
            GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE))
    if stack:
        p = p.stacking(StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)
    return p


def st(title: str, expr: str, *, unit: str = "short", desc: str = "", w: int = 4, h: int = 4,
       legend: str = "", thresholds: gdash.ThresholdsConfig | None = None,
       decimals: float | None = None) -> stat.Panel:
    p = (stat.Panel().title(title).datasource(DS).unit(unit).span(w).height(h)
         .with_target(_q(expr, legend, instant=True))
         .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .color_mode(common.BigValueColorMode.VALUE)
         .graph_mode(common.BigValueGraphMode.NONE))
    if desc:
        p = p.description(desc)
    if thresholds is not None:
        p = p.thresholds(thresholds)
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def _datasource_var() -> gdash.DatasourceVariable:
    return gdash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def _query_var(name: str, label: str, query: str) -> gdash.QueryVariable:
    return (gdash.QueryVariable(name).label(label).datasource(DS).query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all")))


def _base(uid: str, title: str, desc: str) -> gdash.Dashboard:
    return (gdash.Dashboard(title).uid(uid).description(desc).tags(TAGS).editable()
            .tooltip(DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-6h", "now")
            .timezone("browser"))


# ----- (1) GPU health --------------------------------------------------------------------------
def gpu_health() -> gdash.Dashboard:
    d = (_base("llmtrain-gpu-health", "llmtrain / GPU health (DCGM)",
               "GPU health from NVIDIA DCGM exporter, per llmtrain job and per node.")
         .with_variable(_datasource_var())
         .with_variable(_query_var("namespace", "Namespace",
                                   "label_values(llmtrain_trainer_step, namespace)"))
         .with_variable(_query_var("job", "Job",
                                   'label_values(llmtrain_trainer_step{namespace=~"$namespace"}, llmtrain_job)'))
         .with_variable(_query_var("node", "Node", "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)")))

    pct = dict(unit="percent", minv=0, maxv=100)
    d = d.with_row(gdash.Row("Per job: the GPUs held by the job's worker pods"))
    d = d.with_panel(ts("GPU utilisation by job (mean)",
                        [(f"avg by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_GPU_UTIL')})",
                          "{{namespace}}/{{llmtrain_job}}")],
                        desc="Near 0% while the job is Running is the classic hang "
                             "(alert LLMTrainJobGPUsIdle).",
                        thresholds=_thresholds((None, "red"), (5, "green")), **pct))
    d = d.with_panel(ts("GPU utilisation by job (min GPU)",
                        [(f"min by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_GPU_UTIL')})",
                          "{{namespace}}/{{llmtrain_job}}")],
                        desc="The least busy GPU of each job: one straggler slows every rank.", **pct))
    d = d.with_panel(ts("Memory copy utilisation by job (mean)",
                        [(f"avg by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_MEM_COPY_UTIL')})",
                          "{{namespace}}/{{llmtrain_job}}")], **pct))
    d = d.with_panel(ts("Hottest GPU by job",
                        [(f"max by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_GPU_TEMP')})",
                          "{{namespace}}/{{llmtrain_job}}")], unit="celsius",
                        thresholds=_thresholds((None, "green"), (80, "orange"), (85, "red"))))
    d = d.with_panel(ts("Power by job (sum)",
                        [(f"sum by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_POWER_USAGE')})",
                          "{{namespace}}/{{llmtrain_job}}")], unit="watt"))
    d = d.with_panel(ts("SM clock by job (min GPU)",
                        [(f"min by (namespace, llmtrain_job) ({job_gpus('DCGM_FI_DEV_SM_CLOCK')})",
                          "{{namespace}}/{{llmtrain_job}}")], unit="rotmhz",
                        desc="A falling SM clock on one GPU means thermal or power throttling."))

    d = d.with_row(gdash.Row("Per node"))
    per_gpu = "{{Hostname}} GPU {{gpu}}"
    d = d.with_panel(ts("GPU utilisation", [(f"DCGM_FI_DEV_GPU_UTIL{{{NODE_SEL}}}", per_gpu)], **pct))
    d = d.with_panel(ts("Memory copy utilisation",
                        [(f"DCGM_FI_DEV_MEM_COPY_UTIL{{{NODE_SEL}}}", per_gpu)], **pct))
    d = d.with_panel(ts("SM clock", [(f"DCGM_FI_DEV_SM_CLOCK{{{NODE_SEL}}}", per_gpu)], unit="rotmhz"))
    d = d.with_panel(ts("GPU temperature", [(f"DCGM_FI_DEV_GPU_TEMP{{{NODE_SEL}}}", per_gpu)],
                        unit="celsius",
                        thresholds=_thresholds((None, "green"), (80, "orange"), (85, "red"))))
    d = d.with_panel(ts("Power", [(f"DCGM_FI_DEV_POWER_USAGE{{{NODE_SEL}}}", per_gpu)], unit="watt"))
    d = d.with_panel(ts("Framebuffer used",
                        [(f"DCGM_FI_DEV_FB_USED{{{NODE_SEL}}} / "
                          f"(DCGM_FI_DEV_FB_USED{{{NODE_SEL}}} + DCGM_FI_DEV_FB_FREE{{{NODE_SEL}}})",
                          per_gpu)], unit="percentunit", minv=0, maxv=1))
    d = d.with_panel(
        table.Panel().title("XID errors in range").datasource(DS).span(24).height(6)
        .description("GPUs that reported an XID error (DCGM_FI_DEV_XID_ERRORS holds the last XID "
                     "code) in the selected time range (alert LLMTrainGPUXidError).")
        .with_target(_q(f"max by (Hostname, gpu, UUID, namespace, pod) "
                        f"(max_over_time(DCGM_FI_DEV_XID_ERRORS{{{NODE_SEL}}}[$__range])) > 0",
                        instant=True).format(PromQueryFormat.TABLE)))
    return d


# ----- (2) training progress -------------------------------------------------------------------
def training() -> gdash.Dashboard:
    d = (_base("llmtrain-training", "llmtrain / Training",
               "Training progress of LLMTrainingJobs from the trainer's own metrics.")
         .with_variable(_datasource_var())
         .with_variable(_query_var("namespace", "Namespace",
                                   "label_values(llmtrain_trainer_step, namespace)"))
         .with_variable(_query_var("job", "Job",
                                   'label_values(llmtrain_trainer_step{namespace=~"$namespace"}, llmtrain_job)')))
    by = "by (namespace, llmtrain_job)"
    lj = "{{namespace}}/{{llmtrain_job}}"
    rate = "$__rate_interval"

    d = d.with_row(gdash.Row("Now"))
    d = d.with_panel(st("Step", f"max {by} (llmtrain_trainer_step{{{JOB_SEL}}})", legend=lj, decimals=0))
    d = d.with_panel(st("Loss", f"avg {by} (llmtrain_trainer_loss{{{JOB_SEL}}})", legend=lj, decimals=3))
    d = d.with_panel(st("Tokens/s", f"max {by} (llmtrain_trainer_tokens_per_second{{{JOB_SEL}}})",
                        legend=lj, unit="short"))
    d = d.with_panel(st("MFU", f"avg {by} (llmtrain_trainer_mfu{{{JOB_SEL}}})", legend=lj,
                        unit="percentunit",
                        thresholds=_thresholds((None, "red"), (0.25, "orange"), (0.4, "green"))))
    d = d.with_panel(st("Last checkpoint age",
                        f"time() - max {by} (llmtrain_trainer_last_checkpoint_timestamp_seconds{{{JOB_SEL}}} > 0)",
                        legend=lj, unit="s"))
    d = d.with_panel(st("Restarts (24h)",
                        f"sum {by} (increase(llmtrain_operator_job_restarts_total{{{JOB_SEL}}}[24h]))",
                        legend=lj, decimals=0,
                        thresholds=_thresholds((None, "green"), (1, "orange"), (3, "red"))))

    d = d.with_row(gdash.Row("Progress"))
    d = d.with_panel(ts("Loss", [(f"avg {by} (llmtrain_trainer_loss{{{JOB_SEL}}})", lj)]))
    d = d.with_panel(ts("Step", [(f"max {by} (llmtrain_trainer_step{{{JOB_SEL}}})", lj)]))
    d = d.with_panel(ts("Tokens per second (whole job)",
                        [(f"max {by} (llmtrain_trainer_tokens_per_second{{{JOB_SEL}}})", lj)]))
    d = d.with_panel(ts("Tokens per second per device",
                        [(f"avg {by} (llmtrain_trainer_tokens_per_second_per_device{{{JOB_SEL}}})", lj)],
                        desc="The job's tokens/s over its devices, as torchtitan reports it; like MFU it "
                             "counts each checkpoint's blocking time."))
    d = d.with_panel(ts("Tokens trained per second per rank",
                        [(f"rate(llmtrain_trainer_tokens_total{{{JOB_SEL}}}[{rate}])",
                          "{{llmtrain_job}} rank {{rank}}")],
                        desc="From the tokens counter; a rank below the others is a straggler."))
    d = d.with_panel(ts("Straggler score per rank (the 8 highest)",
                        [(f"max by (namespace, llmtrain_job, rank, node) "
                          f"(llmtrain_trainer_straggler_score{{{JOB_SEL}}})",
                          "{{llmtrain_job}} rank {{rank}} on {{node}}")],
                        desc="Each rank's compute time over the median of the other ranks' (rank 0's last "
                             "window). A rank that makes the others wait scores above 1; the ranks that wait "
                             "for it score about 1. spec.resilience.stragglers.threshold is 1.2 by default.",
                        thresholds=_thresholds((None, "green"), (1.2, "red"))))
    d = d.with_panel(ts("Straggler's node (the job's slowdown)",
                        [(f"max by (namespace, llmtrain_job, node, rank) "
                          f"(llmtrain_job_straggler_slowdown{{{JOB_SEL}}})",
                          "{{llmtrain_job}} rank {{rank}} on {{node}} (recorded)"),
                         (f"max by (namespace, llmtrain_job) (llmtrain_trainer_straggler_slowdown{{{JOB_SEL}}})",
                          "{{llmtrain_job}} now")],
                        desc="The straggler the operator recorded (condition StragglerDetected): how many times "
                             "slower the job runs because of that rank's node; and the largest slowdown of the "
                             "last window. Empty: no straggler.",
                        minv=1))

    d = d.with_row(gdash.Row("Efficiency"))
    d = d.with_panel(ts("MFU", [(f"avg {by} (llmtrain_trainer_mfu{{{JOB_SEL}}})", lj)],
                        unit="percentunit", minv=0,
                        desc="Model FLOPs utilisation: achieved model FLOP/s over the instance "
                             "catalog's dense BF16 peak (alert LLMTrainJobMFUDrop)."))
    d = d.with_panel(ts("TFLOP/s per device",
                        [(f"avg {by} (llmtrain_trainer_tflops_per_device{{{JOB_SEL}}})", lj)]))
    d = d.with_panel(ts("Step time",
                        [(f"histogram_quantile(0.5, sum by (namespace, llmtrain_job, le) "
                          f"(rate(llmtrain_trainer_step_seconds_bucket{{{JOB_SEL}}}[{rate}])))", lj + " p50"),
                         (f"histogram_quantile(0.95, sum by (namespace, llmtrain_job, le) "
                          f"(rate(llmtrain_trainer_step_seconds_bucket{{{JOB_SEL}}}[{rate}])))", lj + " p95")],
                        unit="s"))
    d = d.with_panel(ts("Mean step time per rank",
                        [(f"rate(llmtrain_trainer_step_seconds_sum{{{JOB_SEL}}}[{rate}]) / "
                          f"rate(llmtrain_trainer_step_seconds_count{{{JOB_SEL}}}[{rate}])",
                          "{{llmtrain_job}} rank {{rank}}")], unit="s"))
    d = d.with_panel(ts("Data wait share of step time",
                        [(f"sum {by} (rate(llmtrain_trainer_data_wait_seconds_sum{{{JOB_SEL}}}[{rate}])) / "
                          f"sum {by} (rate(llmtrain_trainer_step_seconds_sum{{{JOB_SEL}}}[{rate}]))", lj)],
                        unit="percentunit", minv=0,
                        desc="Time the ranks spend waiting for the next batch, as a share of step "
                             "time: above a few percent the input pipeline starves the GPUs."))
    d = d.with_panel(ts("Data wait p95",
                        [(f"histogram_quantile(0.95, sum by (namespace, llmtrain_job, le) "
                          f"(rate(llmtrain_trainer_data_wait_seconds_bucket{{{JOB_SEL}}}[{rate}])))", lj)],
                        unit="s"))

    d = d.with_row(gdash.Row("Memory"))
    d = d.with_panel(ts("GPU memory allocated (max rank)",
                        [(f"max {by} (llmtrain_trainer_memory_allocated_bytes{{{JOB_SEL}}})", lj)],
                        unit="bytes"))
    d = d.with_panel(ts("GPU memory reserved (max rank)",
                        [(f"max {by} (llmtrain_trainer_memory_reserved_bytes{{{JOB_SEL}}})", lj)],
                        unit="bytes"))

    d = d.with_row(gdash.Row("Loss health"))
    d = d.with_panel(ts("Loss vs its recent median",
                        [(f"avg {by} (llmtrain_trainer_loss{{{JOB_SEL}}})", lj + " loss"),
                         (f"avg {by} (llmtrain_trainer_loss_median{{{JOB_SEL}}})", lj + " median"),
                         (f"max {by} (llmtrain_trainer_loss_ratio_to_median{{{JOB_SEL}}})", lj + " ratio")],
                        desc="The median of the previous resilience.lossSpikeWindow steps; the spike "
                             "rule compares each step's loss with it (alert LLMTrainLossSpike)."))
    d = d.with_panel(ts("Loss spikes and NaN/Inf streaks",
                        [(f"max {by} (llmtrain_trainer_loss_spike_step{{{JOB_SEL}}})", lj + " first spike step"),
                         (f"max {by} (llmtrain_trainer_loss_spike_ratio{{{JOB_SEL}}})", lj + " its ratio"),
                         (f"max {by} (llmtrain_trainer_nonfinite_loss_max_steps{{{JOB_SEL}}})", lj + " longest NaN run"),
                         (f"max {by} (llmtrain_trainer_nonfinite_loss_first_step{{{JOB_SEL}}})", lj + " its first step"),
                         (f"max {by} (llmtrain_trainer_nonfinite_loss_steps{{{JOB_SEL}}})", lj + " NaN now"),
                         (f"max {by} (llmtrain_trainer_resumed_before_step{{{JOB_SEL}}})", lj + " rolled back before")],
                        desc="What the operator's NaN and loss-spike rules read, per attempt "
                             "(alert LLMTrainLossNonFinite); a rollback shows as 'rolled back before'.", w=12))

    d = d.with_row(gdash.Row("Checkpoints, heartbeat, restarts"))
    d = d.with_panel(ts("Checkpoint age vs 2x interval",
                        [(f"time() - max {by} (llmtrain_trainer_last_checkpoint_timestamp_seconds{{{JOB_SEL}}} > 0)",
                          lj + " age"),
                         (f"2 * max {by} (llmtrain_trainer_checkpoint_interval_seconds{{{JOB_SEL}}} > 0)",
                          lj + " alert threshold")],
                        unit="s", desc="Alert LLMTrainCheckpointStale fires when age crosses 2x the interval."))
    d = d.with_panel(ts("Last checkpoint step",
                        [(f"max {by} (llmtrain_trainer_last_checkpoint_step{{{JOB_SEL}}})", lj)]))
    d = d.with_panel(ts("Checkpoint save duration",
                        [(f"histogram_quantile(0.5, sum by (namespace, llmtrain_job, le) "
                          f"(rate(llmtrain_trainer_checkpoint_duration_seconds_bucket{{{JOB_SEL}}}[1h])))", lj + " p50"),
                         (f"histogram_quantile(1, sum by (namespace, llmtrain_job, le) "
                          f"(rate(llmtrain_trainer_checkpoint_duration_seconds_bucket{{{JOB_SEL}}}[1h])))", lj + " max")],
                        unit="s"))
    d = d.with_panel(ts("Time since last step vs hang timeout",
                        [(f"time() - min {by} (llmtrain_trainer_heartbeat_timestamp_seconds{{{JOB_SEL}}} > 0)",
                          lj + " slowest rank"),
                         (f"max {by} (llmtrain_trainer_hang_timeout_seconds{{{JOB_SEL}}})", lj + " hang timeout")],
                        unit="s", desc="The heartbeat moves when a step completes "
                                       "(alert LLMTrainJobNoHeartbeat)."))
    d = d.with_panel(ts("Checkpoint interval (checkpoint.intervalMinutes: auto)",
                        [(f"max {by} (llmtrain_trainer_checkpoint_interval_seconds{{{JOB_SEL}}} > 0)", lj + " interval"),
                         (f"max {by} (llmtrain_trainer_checkpoint_blocking_estimate_seconds{{{JOB_SEL}}})",
                          lj + " blocking per save"),
                         (f"max {by} (llmtrain_trainer_checkpoint_mtbf_seconds{{{JOB_SEL}}}) / 3600",
                          lj + " job MTBF (h)"),
                         (f"max {by} (llmtrain_trainer_checkpoint_blocking_measured_saves{{{JOB_SEL}}})",
                          lj + " saves measured")],
                        desc="The interval the trainer saves at and, with auto, Young/Daly's inputs: "
                             "sqrt(2 x blocking seconds per save x the job's MTBF), the blocking cost "
                             "smoothed over the saves measured (the planner's estimate before the first); "
                             "status.checkpoint.reason says the same in words.", w=24))
    d = d.with_panel(ts("Restarts by reason",
                        [(f"sum by (namespace, llmtrain_job, reason) "
                          f"(increase(llmtrain_operator_job_restarts_total{{{JOB_SEL}}}[1h]))",
                          "{{namespace}}/{{llmtrain_job}} {{reason}}")],
                        desc="New attempts per hour (alert LLMTrainJobRestartsClimbing).", w=24))

    d = d.with_row(gdash.Row("Goodput"))
    d = d.with_panel(ts("Goodput since creation",
                        [(f"max {by} (llmtrain_job_goodput_ratio{{{JOB_SEL}}})", lj)],
                        unit="percentunit", minv=0, maxv=1,
                        desc="status.goodput.ratio: productive seconds over the job's wall time less the "
                             "time it was suspended (alert LLMTrainJobGoodputLow)."))
    d = d.with_panel(ts("Badput by kind (share of wall time)",
                        [(f"sum by (namespace, llmtrain_job, kind) "
                          f"(deriv(llmtrain_job_badput_seconds{{{JOB_SEL}}}[15m]))",
                          "{{namespace}}/{{llmtrain_job}} {{kind}}")],
                        unit="percentunit", minv=0, stack=True,
                        desc="Seconds of badput per second of wall time, stacked by kind (queued, starting, "
                             "restarting, hang, lost work, checkpoint stall, data wait, and slow: the "
                             "time a straggler verdict cost, (1 - 1/slowdown) of the productive time "
                             "while it stood): what the job pays for and does not train with."))
    d = d.with_panel(ts("Checkpoint stall share of wall time (per rank)",
                        [(f"rate(llmtrain_trainer_checkpoint_blocking_seconds_total{{{JOB_SEL}}}[{rate}])",
                          "{{llmtrain_job}} rank {{rank}}"),
                         (f"rate(llmtrain_trainer_snapshot_blocking_seconds_total{{{JOB_SEL}}}[{rate}])",
                          "{{llmtrain_job}} rank {{rank}} memory snapshots")],
                        unit="percentunit", minv=0,
                        desc="The blocking part of the checkpoint saves between steps, and of the in-memory "
                             "snapshots (spec.checkpoint.memory: the copy into /dev/shm)."))
    d = d.with_panel(ts("Attempt: resume step and time in its training loop",
                        [(f"max {by} (llmtrain_trainer_resume_step{{{JOB_SEL}}})", lj + " resumed from step"),
                         (f"max {by} (llmtrain_trainer_resume_tier{{{JOB_SEL}}})",
                          lj + " resumed from (1 durable, 2 memory, 3 partner)"),
                         (f"max {by} (llmtrain_trainer_last_snapshot_step{{{JOB_SEL}}})", lj + " newest snapshot"),
                         (f"time() - max {by} (llmtrain_trainer_train_start_timestamp_seconds{{{JOB_SEL}}} > 0)",
                          lj + " seconds in loop")],
                        desc="Steps between the resume step and the previous attempt's last step are "
                             "redone (status.goodput.stepsRedone)."))
    d = d.with_panel(ts("In-place restarts of the attempt",
                        [(f"max {by} (llmtrain_trainer_inplace_restarts{{{JOB_SEL}}})", lj + " restarts in place"),
                         (f"max {by} (llmtrain_trainer_inplace_redone_steps{{{JOB_SEL}}})", lj + " steps redone"),
                         (f"max {by} (llmtrain_trainer_attempt_steps{{{JOB_SEL}}})", lj + " steps")],
                        desc="torchrun restarted the worker processes in place (spec.resilience.inPlaceRestarts, "
                             "status.progress.inPlaceRestarts); no restart spent. Steps: the attempt's, over "
                             "its processes."))
    d = d.with_panel(ts("Where the attempt's time went, over its in-place restarts",
                        [(f"max {by} (llmtrain_trainer_inplace_restart_seconds{{{JOB_SEL}}})", lj + " restarting"),
                         (f"max {by} (llmtrain_trainer_inplace_redone_seconds{{{JOB_SEL}}})", lj + " redone steps"),
                         (f"max {by} (llmtrain_trainer_attempt_step_seconds{{{JOB_SEL}}})", lj + " steps"),
                         (f"max {by} (llmtrain_trainer_attempt_checkpoint_blocking_seconds{{{JOB_SEL}}})",
                          lj + " checkpoint stall"),
                         (f"max {by} (llmtrain_trainer_attempt_data_wait_seconds{{{JOB_SEL}}})", lj + " data wait")],
                        unit="s",
                        desc="The trainer's attempt-wide counters (carried across its worker processes), "
                             "which status.goodput is computed from."))
    return d


# ----- (3) operator ----------------------------------------------------------------------------
def operator() -> gdash.Dashboard:
    d = (_base("llmtrain-operator", "llmtrain / Operator",
               "The llmtrain operator: reconciles, latency, jobs by phase, restarts.")
         .with_variable(_datasource_var())
         .with_variable(_query_var("namespace", "Namespace",
                                   "label_values(llmtrain_operator_job_restarts_total, namespace)"))
         .with_variable(_query_var("job", "Job",
                                   'label_values(llmtrain_operator_job_restarts_total{namespace=~"$namespace"}, llmtrain_job)')))
    rate = "$__rate_interval"
    d = d.with_row(gdash.Row("Jobs"))
    # With two replicas (leader election) the standby keeps its gauges at its last values or zero;
    # max over replicas is the active one's count.
    for i, phase in enumerate(("Pending", "Running", "Restarting", "Succeeded", "Failed")):
        color = {"Restarting": "orange", "Failed": "red"}.get(phase, "green")
        d = d.with_panel(st(phase, f'max(llmtrain_operator_jobs{{phase="{phase}"}})', decimals=0,
                            w=24 // 5 if i < 4 else 24 - 4 * (24 // 5),
                            thresholds=_thresholds((None, "green"), (1, color))))
    d = d.with_panel(ts("Jobs by phase", [("max by (phase) (llmtrain_operator_jobs)", "{{phase}}")],
                        stack=True, w=24))

    d = d.with_row(gdash.Row("Reconciles"))
    d = d.with_panel(ts("Reconciles by outcome",
                        [(f"sum by (outcome) (rate(llmtrain_operator_reconciles_total[{rate}]))",
                          "{{outcome}}")], unit="ops", stack=True))
    d = d.with_panel(ts("Reconcile error ratio",
                        [(f'sum(rate(llmtrain_operator_reconciles_total{{outcome="error"}}[{rate}])) / '
                          f"sum(rate(llmtrain_operator_reconciles_total[{rate}]))", "errors")],
                        unit="percentunit", minv=0))
    d = d.with_panel(ts("Reconcile latency",
                        [(f"histogram_quantile({q}, sum by (le) "
                          f"(rate(llmtrain_operator_reconcile_duration_seconds_bucket[{rate}])))", f"p{int(q * 100)}")
                         for q in (0.5, 0.95, 0.99)], unit="s"))
    d = d.with_panel(ts("Mean reconcile latency",
                        [(f"sum(rate(llmtrain_operator_reconcile_duration_seconds_sum[{rate}])) / "
                          f"sum(rate(llmtrain_operator_reconcile_duration_seconds_count[{rate}]))", "mean")],
                        unit="s"))

    d = d.with_row(gdash.Row("Restarts"))
    d = d.with_panel(ts("Restarts by job and reason (per hour)",
                        [(f"sum by (namespace, llmtrain_job, reason) "
                          f"(increase(llmtrain_operator_job_restarts_total{{{JOB_SEL}}}[1h]))",
                          "{{namespace}}/{{llmtrain_job}} {{reason}}")], w=24))
    return d


BUILDERS: dict[str, Callable[[], gdash.Dashboard]] = {
    "llmtrain-gpu-health": gpu_health,
    "llmtrain-training": training,
    "llmtrain-operator": operator,
}


def _assign_ids(panels: list[dict[str, Any]]) -> None:
    n = 0
    for p in panels:
        n += 1
        p["id"] = n
        for sub in p.get("panels") or []:
            n += 1
            sub["id"] = n


def build(name: str) -> dict[str, Any]:
    """One dashboard as Grafana JSON (a plain dict)."""
    import json

    model = BUILDERS[name]().build()
    data = json.loads(json.dumps(model, cls=JSONEncoder))
    _assign_ids(data.get("panels") or [])
    return data


def build_all() -> dict[str, dict[str, Any]]:
    return {name: build(name) for name in BUILDERS}


def render(data: dict[str, Any]) -> str:
    """The exact text written to disk (stable key order, trailing newline)."""
    import json

    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
