# Rules on Karpenter's own kinds, in the cluster that holds them (karpenterObjects): in the
# workload cluster's rules (_rules-workload.tpl) by default, in a ClusterRole of the management
# cluster (clusterrole-cluster-api.yaml) with karpenterObjects=management. The kinds are
# cluster-scoped, so a Role cannot hold them. tests/deploy.rs checks them against its table.
{{- define "karpenter-capi.karpenterRules" -}}
# Supervisor watch; claims re-read, patch and delete themselves; create is the provisioner's.
- apiGroups: [karpenter.sh]
  resources: [nodeclaims]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [karpenter.sh]
  resources: [nodeclaims/status]
  verbs: [patch]
# NodePool watch (provisioner, disruption); their status: usage and conditions.
- apiGroups: [karpenter.sh]
  resources: [nodepools]
  verbs: [list, watch]
- apiGroups: [karpenter.sh]
  resources: [nodepools/status]
  verbs: [patch]
# Catalog: watch node classes, patch their Ready condition.
- apiGroups: [karpenter.cluster.x-k8s.io]
  resources: [clusterapinodeclasses]
  verbs: [list, watch]
- apiGroups: [karpenter.cluster.x-k8s.io]
  resources: [clusterapinodeclasses/status]
  verbs: [patch]
# Catalog: watch node overlays, patch their conditions.
- apiGroups: [karpenter.sh]
  resources: [nodeoverlays]
  verbs: [list, watch]
- apiGroups: [karpenter.sh]
  resources: [nodeoverlays/status]
  verbs: [patch]
{{- end }}
