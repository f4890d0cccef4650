{{/*
The operator's permissions, shared by the ClusterRole (all namespaces) and the per-namespace Roles.
Exactly the table in operator/llmtrain/controller/rbac.py, which names the code behind each verb
(tests/charts/test_operator_rbac.py checks it against the code, test_chart_static.py this file
against it): watch its jobs and read one before acting, write only their status, own the children
of the backends enabled (backends.enabled: PyTorchJobs; JobSets, and read their Jobs; batch Jobs
and create their Services), watch/list
pods (worker state, failures), post core Events. No reading of Secrets (with etcd auth it
only creates the attempts' rendezvous credentials), no writes to the jobs themselves, nothing
cluster-admin.
*/}}
{{- define "llmtrain-operator.rules" -}}
- apiGroups: [llmtrain.dev]
  resources: [llmtrainingjobs]
  verbs: [get, list, watch]
- apiGroups: [llmtrain.dev]
  resources: [llmtrainingjobs/status]
  verbs: [patch]
{{- /* Each enabled backend's (files/backends.json, generated from llmtrain.backends and
controller/rbac.py): its child kind (get, list, watch, create, delete); a JobSet's batch Jobs,
read to check they are the JobSet's before its pods are trusted; the job backend's headless
Services, created only. Merged where two backends need the same resource. */}}
{{- $backends := .Files.Get "files/backends.json" | fromJson }}
{{- $rules := dict }}
{{- range .Values.backends.enabled }}
{{- range (index $backends .).rules }}
{{- $key := printf "%s|%s" .group .resource }}
{{- $_ := set $rules $key (concat (get $rules $key | default list) .verbs | uniq) }}
{{- end }}
{{- end }}
{{- range $key := keys $rules | sortAlpha }}
{{- $gr := splitList "|" $key }}
- apiGroups: [{{ index $gr 0 | quote }}]
  resources: [{{ index $gr 1 }}]
  verbs: [{{ get $rules $key | sortAlpha | join ", " }}]
{{- end }}
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- /* Why a queued job waits, in Kueue's words (controller/adapters/kueue.py). Read only. */}}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
{{- if .Values.jobNetworkPolicy.enabled }}
{{- /* One NetworkPolicy per job (controller/adapters/tenancy.py); created, never read or changed. */}}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
{{- end }}
{{- if include "llmtrain-operator.rendezvousAuth" . }}
{{- /* Each attempt's etcd credentials (controller/adapters/tenancy.py). create only: no get/list, so the
operator cannot read the tenants' Secrets. */}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- end }}
{{- end }}

{{/*
kopf itself lists/watches CustomResourceDefinitions to notice resources appearing or going away
(without it its watcher fails and retries). CRDs hold no secrets; this is read-only and
cluster-scoped, so it needs a ClusterRole even when the operator watches only some namespaces.
*/}}
{{- define "llmtrain-operator.frameworkRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- /* Bad-node avoidance lists the Ready nodes of an instance type before keeping a failed
attempt's nodes out of the next one (never so many that the job cannot schedule); the node watch
reads the health conditions that move an attempt off a sick node (nodeHealth.conditions).
Read-only; patch (the llmtrain.dev/suspect taint) only when suspectNodeTaint.enabled. */}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [{{ if .Values.suspectNodeTaint.enabled }}list, patch, watch{{ else }}list, watch{{ end }}]
{{- end }}
