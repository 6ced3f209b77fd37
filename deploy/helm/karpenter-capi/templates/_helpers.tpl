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

{{/* True (non-empty) when the controller runs in the workload cluster and the Cluster API
objects live in another cluster. */}}
{{- define "karpenter-capi.separateManagementCluster" -}}
{{- if and (not (include "karpenter-capi.managementTopology" .)) (or .Values.clusterAPI.kubeconfigSecret.name .Values.clusterAPI.url) }}true{{ end }}
{{- end }}

{{/* "true" in the management topology (next to Cluster API, one release per workload
cluster), empty in the workload topology (also when topology is unset, as after an upgrade with
--reuse-values from a chart without it); any other value fails the render. */}}
{{- define "karpenter-capi.managementTopology" -}}
{{- $topology := .Values.topology | default "workload" }}
{{- if eq $topology "management" }}true
{{- else if ne $topology "workload" }}
{{- fail (printf "topology must be workload or management, not %q" $topology) }}
{{- end }}
{{- end }}

{{/* The management topology's settings that cannot work together fail the render, each with
what to do instead. */}}
{{- define "karpenter-capi.validateTopology" -}}
{{- if include "karpenter-capi.managementTopology" . }}
{{- if not .Values.clusterAPI.clusterName }}
{{- fail "topology=management needs clusterAPI.clusterName: the Cluster this release scales, in the release namespace" }}
{{- end }}
{{- if or .Values.clusterAPI.kubeconfigSecret.name .Values.clusterAPI.url }}
{{- fail "topology=management reaches Cluster API in-cluster with the release's ServiceAccount: leave clusterAPI.kubeconfigSecret.name and clusterAPI.url empty (workloadCluster.kubeconfigSecret names the workload cluster's kubeconfig)" }}
{{- end }}
{{- if and .Values.clusterAPI.namespace (ne .Values.clusterAPI.namespace .Release.Namespace) }}
{{- fail (printf "topology=management reads Cluster API objects in the release namespace %q only: install the release in the Cluster's namespace %q instead of setting clusterAPI.namespace" .Release.Namespace .Values.clusterAPI.namespace) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the workload cluster's kubeconfig (management topology): Cluster API's
own <cluster>-kubeconfig unless another is named. */}}
{{- define "karpenter-capi.workloadKubeconfigSecret" -}}
{{- .Values.workloadCluster.kubeconfigSecret.name | default (printf "%s-kubeconfig" .Values.clusterAPI.clusterName) }}
{{- end }}

{{/* Where the workload kubeconfig is mounted (management topology); the file is the Secret's
key projected as "kubeconfig". */}}
{{- define "karpenter-capi.workloadKubeconfigDir" -}}
/etc/karpenter-capi/workload
{{- end }}
