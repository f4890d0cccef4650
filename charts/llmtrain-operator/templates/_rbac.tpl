{{/*
The operator's permissions, shared by the ClusterRole (all namespaces) and the per-namespace Roles.
Only what it really does: watch/patch its jobs and their status, own PyTorchJobs, read pods
(worker state, rank 0's IP for progress), post events, and (with peering) keep its peering object.
No Secrets, nothing cluster-admin.
*/}}
{{- define "llmtrain-operator.rules" -}}
- apiGroups: [llmtrain.dev]
  resources: [llmtrainingjobs]
  verbs: [get, list, watch, patch, update]
- apiGroups: [llmtrain.dev]
  resources: [llmtrainingjobs/status]
  verbs: [get, patch, update]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{- define "llmtrain-operator.peeringRule" -}}
- apiGroups: [kopf.dev]
  resources: [{{ .resource }}]
  verbs: [get, list, watch, patch]
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
{{- /* Bad-node avoidance counts the Ready nodes of an instance type before keeping a failed
attempt's nodes out of the next one (never so many that the job cannot schedule). Read-only;
patch (the llmtrain.dev/suspect taint) only when suspectNodeTaint.enabled. */}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [{{ if .Values.suspectNodeTaint.enabled }}get, list, patch{{ else }}get, list{{ end }}]
{{- end }}
