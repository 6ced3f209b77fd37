# Workload-cluster rules: only the verbs the controller calls. The reason for each rule is in
# deploy/manifests/20-rbac.yaml; tests/deploy.rs checks both against one table. One list for the
# ClusterRole installed with the controller (workload topology) and the one rendered for the
# workload cluster of the management topology (workload-cluster-rbac.yaml). Karpenter's own kinds
# (_rules-karpenter.tpl) are here only where they live in the workload cluster (karpenterObjects).
{{- define "karpenter-capi.workloadRules" -}}
# Node feed: list/watch; registration, initialization, finalizer: patch; termination: get
# (a Node the lagging watch does not show yet), delete.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch, delete]
# Provisioner pod watch (the terminator drains from it); terminator: delete at the deadline.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
{{- if contains "PodDeletionCostManagement=true" .Values.controller.featureGates }}
# Pod deletion cost (--feature-gates PodDeletionCostManagement=true): the deletion cost and its
# ownership sentinel on the pods of ranked nodes. Only with the gate, as upstream's chart.
- apiGroups: [""]
  resources: [pods]
  verbs: [patch]
{{- end }}
# Terminator: evictions honour PodDisruptionBudgets.
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# Terminator: wait for a drained node's VolumeAttachments (node watcher), except volumes of
# pods that are not drained (through their PersistentVolumeClaims).
# Storage watcher: claims, volumes and classes for volume topology in the solve.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [list, watch]
- apiGroups: [storage.k8s.io]
  resources: [volumeattachments, storageclasses, csinodes]
  verbs: [list, watch]
# Disruption: nodes with PDB-protected pods are not candidates (a watch).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch]
# DaemonSet feed: the provisioner counts DaemonSet overhead on new nodes.
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [list, watch]
# Workload watcher (only with default topology spread constraints): deduced selectors.
- apiGroups: [""]
  resources: [services, replicationcontrollers]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [replicasets, statefulsets]
  verbs: [list, watch]
{{- if not (include "karpenter-capi.karpenterObjectsInManagement" .) }}
{{ include "karpenter-capi.karpenterRules" . }}
{{- end }}
# CapacityBuffers (--feature-gates CapacityBuffer=true): watch buffers, write their status;
# resolve their chunk's pod template (PodTemplates and the apps workloads a scalableRef names:
# read once, then followed by a watch).
- apiGroups: [autoscaling.x-k8s.io]
  resources: [capacitybuffers]
  verbs: [list, watch]
- apiGroups: [autoscaling.x-k8s.io]
  resources: [capacitybuffers/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [podtemplates]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [deployments, replicasets, statefulsets]
  verbs: [get, list, watch]
# CapacityQuotas (--feature-gates CapacityQuota=true): watch quotas, write their status.
- apiGroups: [autoscaling.x-k8s.io]
  resources: [capacityquotas]
  verbs: [list, watch]
- apiGroups: [autoscaling.x-k8s.io]
  resources: [capacityquotas/status]
  verbs: [patch]
# Event recorder (events.k8s.io/v1): create, and patch when an event repeats.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
