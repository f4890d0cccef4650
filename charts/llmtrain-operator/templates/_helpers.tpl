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
{{- if and .Values.rendezvousCASecret .Values.etcd.enabled }}
{{- fail "rendezvousCASecret is for an etcd of your own (defaultEtcdEndpoint); the bundled etcd (etcd.enabled) keeps its CA in its own Secret: set one or the other" }}
{{- end }}
{{- if and .Values.rendezvousCASecret (not .Values.defaultEtcdEndpoint) }}
{{- fail "rendezvousCASecret needs defaultEtcdEndpoint (host:port of the etcd that trusts that CA)" }}
{{- end }}
{{- if and .Values.dashboards.enabled (not .Values.dashboards.label) }}
{{- fail "dashboards.enabled needs dashboards.label (the label the Grafana sidecar watches, e.g. grafana_dashboard)" }}
{{- end }}
{{- if not (has .Values.backends.default .Values.backends.enabled) }}
{{- fail (printf "backends.default %s is not in backends.enabled %v: enable it, or choose one of those" .Values.backends.default .Values.backends.enabled) }}
{{- end }}
{{- range $ns, $backend := .Values.backends.namespaceDefaults }}
{{- if not (has $backend $.Values.backends.enabled) }}
{{- fail (printf "backends.namespaceDefaults.%s is %s, which is not in backends.enabled %v" $ns $backend $.Values.backends.enabled) }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the bundled etcd requires the operator's per-namespace client certificates. */}}
{{- define "llmtrain-operator.rendezvousAuth" -}}
{{- if or .Values.rendezvousCASecret (and .Values.etcd.enabled (dig "auth" "enabled" true .Values.etcd)) }}true{{ end }}
{{- end }}

{{/* The Secret with the rendezvous CA: rendezvousCASecret for an etcd of one's own, else the etcd
chart's llmtrain-etcd.tlsSecret. */}}
{{- define "llmtrain-operator.rendezvousCASecret" -}}
{{- if .Values.rendezvousCASecret }}
{{- .Values.rendezvousCASecret }}
{{- else }}
{{- include "llmtrain-etcd.tlsSecret" (dict "Values" .Values.etcd "Release" .Release "Chart" (dict "Name" "llmtrain-etcd")) }}
{{- end }}
{{- end }}

{{/* Name of one of the chart's (cluster-scoped) ValidatingAdmissionPolicies and its binding:
one set per release, so the release's namespace is part of it. (list $ "suffix") */}}
{{- define "llmtrain-operator.admissionPolicyName" -}}
{{- $root := index . 0 -}}
{{- printf "%s.%s.%s" (include "llmtrain-operator.fullname" $root) $root.Release.Namespace (index . 1) | trunc 253 | trimSuffix "." }}
{{- end }}

{{/* The operator-made child's controller owner (admission-operator-objects.yaml): an LLMTrainingJob. */}}
{{- define "llmtrain-operator.childOwner" -}}
- name: owner
  expression: >-
    has(object.metadata.ownerReferences) ? object.metadata.ownerReferences.filter(o,
    o.apiVersion.startsWith('llmtrain.dev/') && o.kind == 'LLMTrainingJob' && has(o.controller) && o.controller) : []
{{- end }}

{{/* Variables over the worker pod template (after a `pod` variable that points at it). */}}
{{- define "llmtrain-operator.workerPodVariables" -}}
- name: containers
  expression: "variables.pod.containers"
- name: caps
  expression: >-
    variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.capabilities) ||
    !has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x == 'IPC_LOCK'))
{{- end }}

{{/* What the worker pod template of every operator-made child must be (render.py's pod.yaml.j2),
whichever backend wraps it. */}}
{{- define "llmtrain-operator.workerPodValidations" -}}
- expression: >-
    size(variables.containers) == 1 && variables.containers[0].name == 'pytorch' &&
    variables.containers[0].command == ['python', '-m', 'llmtrain_trainer.launch'] &&
    !has(variables.pod.initContainers) && !has(variables.pod.ephemeralContainers) &&
    !has(variables.containers[0].envFrom)
  message: "one container, pytorch, running python -m llmtrain_trainer.launch; no init or ephemeral containers, no envFrom"
- expression: >-
    !(has(variables.pod.hostNetwork) && variables.pod.hostNetwork) && !(has(variables.pod.hostPID) && variables.pod.hostPID) &&
    !(has(variables.pod.hostIPC) && variables.pod.hostIPC) &&
    has(variables.pod.automountServiceAccountToken) && !variables.pod.automountServiceAccountToken
  message: "no host namespaces; no ServiceAccount token"
- expression: >-
    has(variables.pod.securityContext) && has(variables.pod.securityContext.runAsNonRoot) && variables.pod.securityContext.runAsNonRoot &&
    has(variables.pod.securityContext.seccompProfile) && variables.pod.securityContext.seccompProfile.type == 'RuntimeDefault' &&
    variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged) &&
    variables.caps
  message: "non-root, seccomp RuntimeDefault, not privileged, no capability but IPC_LOCK"
- expression: >-
    !has(variables.pod.volumes) || variables.pod.volumes.all(v, !has(v.hostPath) &&
    (has(v.emptyDir) || has(v.persistentVolumeClaim) || (has(v.secret) && v.secret.secretName == object.metadata.name + '-rendezvous')))
  message: "volumes: emptyDir, PersistentVolumeClaim, or the attempt's own rendezvous Secret (<name>-rendezvous); no hostPath"
- expression: >-
    variables.containers.all(c, (!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)) &&
    (!has(c.env) || c.env.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef) || e.name == 'HF_TOKEN')))
  message: "no host ports; a Secret only as HF_TOKEN"
{{- with .Values.admission.allowedImageRegistries }}
- expression: {{ printf "variables.containers.all(c, %s.exists(r, c.image.startsWith(r + '/')))" (toJson .) | quote }}
  message: {{ printf "the image must come from %s (admission.allowedImageRegistries)" (join ", " .) | quote }}
{{- end }}
{{- end }}
