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
{{- if and (not (include "karpenter-capi.inManagementCluster" .)) (or .Values.clusterAPI.kubeconfigSecret.name .Values.clusterAPI.url) }}true{{ end }}
{{- end }}

{{/* The topology: workload (also when unset, as after an upgrade with --reuse-values from a chart
without it), management or fleet; any other value fails the render. */}}
{{- define "karpenter-capi.topology" -}}
{{- $topology := .Values.topology | default "workload" }}
{{- if has $topology (list "workload" "management" "fleet") }}{{ $topology }}
{{- else }}
{{- fail (printf "topology must be workload, management or fleet, not %q" $topology) }}
{{- end }}
{{- end }}

{{/* "true" in the management topology (next to Cluster API, one release per workload
cluster), empty otherwise. */}}
{{- define "karpenter-capi.managementTopology" -}}
{{- if eq (include "karpenter-capi.topology" .) "management" }}true{{ end }}
{{- end }}

{{/* "true" in the fleet topology (next to Cluster API, one release for every selected Cluster),
empty otherwise. */}}
{{- define "karpenter-capi.fleetTopology" -}}
{{- if eq (include "karpenter-capi.topology" .) "fleet" }}true{{ end }}
{{- end }}

{{/* "true" where the pods run in the management cluster (management and fleet): this cluster is
not a workload cluster, so no workload ClusterRole is installed here. */}}
{{- define "karpenter-capi.inManagementCluster" -}}
{{- if or (include "karpenter-capi.managementTopology" .) (include "karpenter-capi.fleetTopology" .) }}true{{ end }}
{{- end }}

{{/* Where NodePools, NodeClaims, ClusterAPINodeClasses and NodeOverlays live: workload (also when
unset, as after an upgrade with --reuse-values from a chart without it) or management; any other
value fails the render. */}}
{{- define "karpenter-capi.karpenterObjects" -}}
{{- $where := .Values.karpenterObjects | default "workload" }}
{{- if has $where (list "workload" "management") }}{{ $where }}
{{- else }}
{{- fail (printf "karpenterObjects must be workload or management, not %q" $where) }}
{{- end }}
{{- end }}

{{/* "true" when Karpenter's objects live in the management cluster (karpenterObjects=management),
empty otherwise. */}}
{{- define "karpenter-capi.karpenterObjectsInManagement" -}}
{{- if eq (include "karpenter-capi.karpenterObjects" .) "management" }}true{{ end }}
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
{{- if and (include "karpenter-capi.karpenterObjectsInManagement" .) (not (include "karpenter-capi.inManagementCluster" .)) }}
{{- if not .Values.clusterAPI.clusterName }}
{{- fail "karpenterObjects=management binds Karpenter's objects to one Cluster: set clusterAPI.clusterName to its name" }}
{{- end }}
{{- if not .Values.clusterAPI.namespace }}
{{- fail "karpenterObjects=management binds Karpenter's objects to one Cluster: set clusterAPI.namespace to its namespace" }}
{{- end }}
{{- end }}
{{- if include "karpenter-capi.fleetTopology" . }}
{{- if .Values.clusterAPI.clusterName }}
{{- fail "topology=fleet serves every Cluster fleet.selector chooses: leave clusterAPI.clusterName empty (or use topology=management for one Cluster)" }}
{{- end }}
{{- if or .Values.clusterAPI.kubeconfigSecret.name .Values.clusterAPI.url }}
{{- fail "topology=fleet reaches Cluster API in-cluster with the release's ServiceAccount: leave clusterAPI.kubeconfigSecret.name and clusterAPI.url empty (fleet.kubeconfigSecret names each Cluster's workload kubeconfig)" }}
{{- end }}
{{- if not .Values.leaderElection.enabled }}
{{- fail "topology=fleet shares the Clusters between replicas through one Lease per Cluster: leaderElection.enabled=false is not possible" }}
{{- end }}
{{- if .Values.controller.dryRun }}
{{- fail "topology=fleet has no shadow mode: controller.dryRun needs the workload or management topology" }}
{{- end }}
{{- if not (contains "{cluster}" .Values.fleet.kubeconfigSecret.name) }}
{{- fail (printf "fleet.kubeconfigSecret.name %q does not contain {cluster}: each Cluster needs a Secret of its own" .Values.fleet.kubeconfigSecret.name) }}
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
