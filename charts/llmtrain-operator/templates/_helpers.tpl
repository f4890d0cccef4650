{{/*
Names. Everything is namespaced under "llmtrain-operator." so subcharts can't collide.
*/}}
{{- define "llmtrain-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmtrain-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llmtrain-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmtrain-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmtrain-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmtrain-operator.labels" -}}
helm.sh/chart: {{ include "llmtrain-operator.chart" . }}
{{ include "llmtrain-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmtrain
{{- end }}

{{- define "llmtrain-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmtrain-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmtrain-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The etcd endpoint new jobs get when they name none: an explicit value wins, then the bundled
etcd subchart's Service, else the operator's built-in default.
*/}}
{{- define "llmtrain-operator.etcdEndpoint" -}}
{{- if .Values.defaultEtcdEndpoint }}
{{- .Values.defaultEtcdEndpoint }}
{{- else if .Values.etcd.enabled }}
{{- printf "%s.%s.svc:%d" (include "llmtrain-etcd.fullname" (dict "Values" .Values.etcd "Release" .Release "Chart" (dict "Name" "llmtrain-etcd"))) .Release.Namespace (int .Values.etcd.service.clientPort) }}
{{- end }}
{{- end }}

{{/* Guard rails that JSON schema can't express across fields. */}}
{{- define "llmtrain-operator.validate" -}}
{{- if and .Values.dashboards.enabled (not .Values.dashboards.label) }}
{{- fail "dashboards.enabled needs dashboards.label (the label the Grafana sidecar watches, e.g. grafana_dashboard)" }}
{{- end }}
{{- end }}

{{/* "true" when the bundled etcd requires the operator's per-namespace client certificates. */}}
{{- define "llmtrain-operator.rendezvousAuth" -}}
{{- if and .Values.etcd.enabled (dig "auth" "enabled" true .Values.etcd) }}true{{ end }}
{{- end }}

{{/* The Secret with the rendezvous CA (the etcd chart's llmtrain-etcd.tlsSecret). */}}
{{- define "llmtrain-operator.rendezvousCASecret" -}}
{{- include "llmtrain-etcd.tlsSecret" (dict "Values" .Values.etcd "Release" .Release "Chart" (dict "Name" "llmtrain-etcd")) }}
{{- end }}

{{/* Name of one of the chart's (cluster-scoped) ValidatingAdmissionPolicies and its binding:
one set per release, so the release's namespace is part of it. (list $ "suffix") */}}
{{- define "llmtrain-operator.admissionPolicyName" -}}
{{- $root := index . 0 -}}
{{- printf "%s.%s.%s" (include "llmtrain-operator.fullname" $root) $root.Release.Namespace (index . 1) | trunc 253 | trimSuffix "." }}
{{- end }}
