# Cluster API rules: only the verbs the controller calls, on the objects of the cluster that holds
# them. A ClusterRole in the joined workload topology, a Role in the release namespace in the
# management topology (clusterrole-cluster-api.yaml). tests/deploy.rs checks them against its table.
{{- define "karpenter-capi.clusterAPIRules" -}}
# Watcher: list/watch; Scaler: re-read, bind and mark (patch), delete below min-size.
- apiGroups: [cluster.x-k8s.io]
  resources: [machines]
  verbs: [get, list, watch, patch, delete]
# Watcher: list/watch; Scaler: re-read, compare-and-swap spec.replicas by JSON patch.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinedeployments]
  verbs: [get, list, watch, patch]
{{- if .Values.generate.enabled }}
# Generator (generate.enabled, docs/generate.md): create a generated group, delete an idle one.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinedeployments]
  verbs: [create, delete]
{{- end }}
# Watcher: MachineSets, for a preflight check holding a scale-up (their conditions), read only.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinesets]
  verbs: [list, watch]
# Watcher: Clusters, for Cluster API's pause (spec.paused or the annotation), read only.
- apiGroups: [cluster.x-k8s.io]
  resources: [clusters]
  verbs: [list, watch]
# The same for MachinePools, the second scalable kind (watched only where they are served).
- apiGroups: [cluster.x-k8s.io]
  resources: [machinepools]
  verbs: [get, list, watch, patch]
{{- if include "karpenter-capi.karpenterObjectsInManagement" . }}
# Event recorder (karpenterObjects=management): Events about Karpenter's objects, in the
# Cluster's namespace (events.k8s.io/v1): create, and patch when an event repeats.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
# Catalog: read each MachineDeployment's infrastructure template once (get only).
{{- range .Values.rbac.clusterAPI.infrastructureTemplates }}
- {apiGroups: [{{ .group | quote }}], resources: {{ toJson .resources }}, verbs: [get]}
{{- end }}
{{- if .Values.generate.enabled }}
# Generator (generate.enabled): create a generated group's template copy, delete it with its group,
# and list the marked ones no group references (a crash between the two creates). The
# *machinetemplates kinds of the list above only: a MachinePool is never a source.
{{- range .Values.rbac.clusterAPI.infrastructureTemplates }}
{{- $templates := list }}
{{- range .resources }}{{ if hasSuffix "machinetemplates" . }}{{ $templates = append $templates . }}{{ end }}{{ end }}
{{- if $templates }}
- {apiGroups: [{{ .group | quote }}], resources: {{ toJson $templates }}, verbs: [create, delete, list]}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
