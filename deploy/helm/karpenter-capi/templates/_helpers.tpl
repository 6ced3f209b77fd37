{{/* Chart name, overridable. */}}
{{- define "karpenter-capi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects. */}}
{{- define "karpenter-capi.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "karpenter-capi.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "karpenter-capi.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select the controller's pods; never change them after the first install. */}}
{{- define "karpenter-capi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "karpenter-capi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "karpenter-capi.labels" -}}
{{ include "karpenter-capi.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "karpenter-capi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "karpenter-capi.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the Cluster API objects live in another cluster. */}}
{{- define "karpenter-capi.separateManagementCluster" -}}
{{- if or .Values.clusterAPI.kubeconfigSecret.name .Values.clusterAPI.url }}true{{ end }}
{{- end }}
