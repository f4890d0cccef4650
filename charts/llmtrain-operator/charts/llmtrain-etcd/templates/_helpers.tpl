{{- define "llmtrain-etcd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains "etcd" .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-etcd" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "llmtrain-etcd.selectorLabels" -}}
app.kubernetes.io/name: {{ default "llmtrain-etcd" .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmtrain-etcd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | trunc 63 | trimSuffix "-" }}
{{ include "llmtrain-etcd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmtrain
app.kubernetes.io/component: rendezvous
{{- end }}

{{/* The Secret with the rendezvous CA and etcd's server certificate (auth.enabled). */}}
{{- define "llmtrain-etcd.tlsSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-tls" (include "llmtrain-etcd.fullname" .)) }}
{{- end }}
