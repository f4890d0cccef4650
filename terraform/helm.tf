# Cluster software through the Helm provider (pinned chart versions in var.chart_versions).
locals {
  gpu_tolerations = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
  llmtrain_chart  = coalesce(var.llmtrain_chart_path, "${path.module}/../charts/llmtrain-operator")
}

resource "helm_release" "nvidia_device_plugin" {
  name       = "nvidia-device-plugin"
  repository = "https://nvidia.github.io/k8s-device-plugin"
  chart      = "nvidia-device-plugin"
  version    = var.chart_versions.nvidia_device_plugin
  namespace  = "kube-system"
  wait       = false # GPU groups may be scaled to zero at install time

  values = [yamlencode({
    nodeSelector = { "nvidia.com/gpu.present" = "true" }
    tolerations  = local.gpu_tolerations
  })]

  depends_on = [aws_eks_node_group.system]
}

resource "helm_release" "efa_device_plugin" {
  name       = "aws-efa-k8s-device-plugin"
  repository = "https://aws.github.io/eks-charts"
  chart      = "aws-efa-k8s-device-plugin"
  version    = var.chart_versions.efa_device_plugin
  namespace  = "kube-system"
  wait       = false

  values = [yamlencode({
    nodeSelector = { "vpc.amazonaws.com/efa.present" = "true" }
    tolerations  = local.gpu_tolerations
  })]

  depends_on = [aws_eks_node_group.system]
}

# JobSet (the llmtrain operator's jobset backend: one JobSet per attempt), from its own chart on
# registry.k8s.io with its webhooks and their self-managed certificates. Optional: the PyTorchJob
# backend needs the training-operator below instead (or beside it: docs/operations/migrating-to-jobset.md).
resource "helm_release" "jobset" {
  count = var.install_jobset ? 1 : 0

  name             = "jobset"
  repository       = "oci://registry.k8s.io/jobset/charts"
  chart            = "jobset"
  version          = var.jobset_version
  namespace        = "jobset-system"
  create_namespace = true

  values = [yamlencode({
    # the release image of this version (the chart's own default may point at a staging build)
    image      = { repository = "registry.k8s.io/jobset/jobset", tag = "v${var.jobset_version}" }
    controller = { nodeSelector = local.system_nodes }
  })]

  depends_on = [aws_eks_node_group.system]
}

# Kubeflow training-operator (PyTorchJob controller). Upstream publishes kustomize manifests, not a
# chart, so they are applied from the pinned release tag in three passes (CRDs and namespaces first).
data "kustomization_build" "training_operator" {
  count = var.install_training_operator ? 1 : 0
  path  = "github.com/kubeflow/training-operator.git//manifests/overlays/standalone?ref=${var.training_operator_version}"
}

resource "kustomization_resource" "training_operator_p0" {
  for_each = var.install_training_operator ? data.kustomization_build.training_operator[0].ids_prio[0] : toset([])
  manifest = data.kustomization_build.training_operator[0].manifests[each.value]

  depends_on = [aws_eks_node_group.system]
}

resource "kustomization_resource" "training_operator_p1" {
  for_each = var.install_training_operator ? data.kustomization_build.training_operator[0].ids_prio[1] : toset([])
  manifest = data.kustomization_build.training_operator[0].manifests[each.value]

  depends_on = [kustomization_resource.training_operator_p0]
}

resource "kustomization_resource" "training_operator_p2" {
  for_each = var.install_training_operator ? data.kustomization_build.training_operator[0].ids_prio[2] : toset([])
  manifest = data.kustomization_build.training_operator[0].manifests[each.value]

  depends_on = [kustomization_resource.training_operator_p1]
}

# Kueue: optional, after the PyTorchJob CRD (Kueue turns an integration on only when its CRD exists
# at start-up). ResourceFlavors, ClusterQueues and LocalQueues are policy, left to the platform team.
# Its configuration is charts/upstream-values/kueue.yaml: the chart's own with kubeflow.org/pytorchjob
# turned on, which Kueue's defaults leave out from v0.19.
resource "helm_release" "kueue" {
  count = var.install_kueue ? 1 : 0

  name             = "kueue"
  repository       = "oci://registry.k8s.io/kueue/charts"
  chart            = "kueue"
  version          = var.chart_versions.kueue
  namespace        = "kueue-system"
  create_namespace = true

  values = [
    file("${path.module}/../charts/upstream-values/kueue.yaml"),
    yamlencode({
      controllerManager = { nodeSelector = local.system_nodes }
    }),
  ]

  depends_on = [kustomization_resource.training_operator_p2, helm_release.jobset, aws_eks_node_group.system]
}

locals {
  llmtrain_namespace = "llmtrain-system"
  # Release "llmtrain" in llmtrain-system: the bundled etcd's Service is llmtrain-etcd, the
  # operator's built-in default rendezvous endpoint.
  etcd_endpoint = "llmtrain-etcd.${local.llmtrain_namespace}.svc:2379"
  system_nodes  = { "llmtrain.dev/node-pool" = "system" }

  # Keys of charts/llmtrain-operator/values.yaml; var.llmtrain_values is merged over them.
  llmtrain_base_values = {
    nodeSelector      = local.system_nodes
    watchNamespaces   = local.training_namespaces
    etcd              = { enabled = var.install_etcd, nodeSelector = local.system_nodes }
    serviceMonitor    = { enabled = var.enable_monitoring }
    trainerPodMonitor = { enabled = var.enable_monitoring }
    prometheusRule    = { enabled = var.enable_monitoring }
    dashboards        = { enabled = var.enable_monitoring }
    # Jobs may run only the project's images and this account's ECR, and only as the trainer
    # ServiceAccount Terraform binds to the bucket (or their namespace's default).
    admission = {
      allowedImageRegistries = concat(["public.ecr.aws/llmtrain", "${local.account_id}.dkr.ecr.${var.region}.amazonaws.com"], var.llmtrain_allowed_image_registries)
      allowedServiceAccounts = [var.training_service_account]
    }
    # The backends installed above (and the job backend, which needs nothing installed); new jobs
    # default to PyTorchJob while its operator is installed, else to JobSet, else to the job backend.
    backends = {
      enabled = concat(
        var.install_training_operator ? ["pytorchjob"] : [],
        var.install_jobset ? ["jobset"] : [],
        var.enable_job_backend ? ["job"] : [],
      )
      default = var.install_training_operator ? "pytorchjob" : (var.install_jobset ? "jobset" : "job")
    }
  }
}

resource "helm_release" "llmtrain" {
  count = var.install_llmtrain ? 1 : 0

  name             = "llmtrain"
  chart            = local.llmtrain_chart
  namespace        = local.llmtrain_namespace
  create_namespace = true
  wait             = true

  values = [yamlencode(local.llmtrain_base_values), yamlencode(var.llmtrain_values)]

  lifecycle {
    precondition {
      condition     = var.install_training_operator || var.install_jobset || var.enable_job_backend
      error_message = "install_training_operator, install_jobset and enable_job_backend are all false: the llmtrain operator needs a training backend (its chart's backends.enabled)."
    }
  }

  depends_on = [
    kustomization_resource.training_operator_p2,
    helm_release.jobset,
    kubernetes_namespace_v1.training,
    kubernetes_namespace_v1.tenant,     # watched namespaces exist before the operator starts
    kubernetes_secret_v1.rendezvous_ca, # etcd and the operator mount it (etcd.auth.enabled)
    helm_release.kube_prometheus_stack, # its CRDs (ServiceMonitor, PrometheusRule) first
  ]
}

resource "helm_release" "kube_prometheus_stack" {
  count = var.enable_monitoring ? 1 : 0

  name             = "kube-prometheus-stack"
  repository       = "https://prometheus-community.github.io/helm-charts"
  chart            = "kube-prometheus-stack"
  version          = var.chart_versions.kube_prometheus_stack
  namespace        = "monitoring"
  create_namespace = true

  values = [yamlencode(local.kube_prometheus_stack_values)]

  depends_on = [aws_eks_node_group.system, aws_eks_addon.coredns]
}

resource "helm_release" "dcgm_exporter" {
  count = var.enable_monitoring ? 1 : 0

  name       = "dcgm-exporter"
  repository = "https://nvidia.github.io/dcgm-exporter/helm-charts"
  chart      = "dcgm-exporter"
  version    = var.chart_versions.dcgm_exporter
  namespace  = "monitoring"
  wait       = false

  values = [yamlencode(local.dcgm_exporter_values)]

  depends_on = [helm_release.kube_prometheus_stack]
}
