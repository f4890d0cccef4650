# In-cluster objects owned by this module: the training namespace and ServiceAccount, the FSx
# StorageClass/PV/PVC. They wait for the system nodes and CoreDNS.
locals {
  fsx_claim_name = "llmtrain-fsx"
  # A class name used only to pair the static PV and PVC (no StorageClass object has it), so the
  # claim can never be grabbed by a default StorageClass and provisioned elsewhere.
  fsx_static_class = "llmtrain-fsx-static"
}

resource "kubernetes_namespace_v1" "training" {
  metadata {
    name   = var.training_namespace
    labels = { "app.kubernetes.io/part-of" = "llmtrain" }
  }

  depends_on = [aws_eks_node_group.system, aws_eks_addon.coredns]

  lifecycle {
    precondition {
      condition     = !var.install_etcd || var.install_llmtrain
      error_message = "install_etcd uses the llmtrain-operator chart's bundled etcd: it needs install_llmtrain = true."
    }
  }
}

resource "kubernetes_service_account_v1" "trainer" {
  metadata {
    name      = var.training_service_account
    namespace = kubernetes_namespace_v1.training.metadata[0].name
    labels    = { "app.kubernetes.io/part-of" = "llmtrain" }
  }
  # Pod Identity injects credentials through the agent; no Kubernetes API token is needed.
  automount_service_account_token = false
}

# Team namespaces (var.tenant_namespaces): the same ServiceAccount, mapped to the training role,
# which lets each reach only its own checkpoint prefix.
resource "kubernetes_namespace_v1" "tenant" {
  for_each = toset(var.tenant_namespaces)

  metadata {
    name   = each.value
    labels = { "app.kubernetes.io/part-of" = "llmtrain" }
  }

  depends_on = [aws_eks_node_group.system, aws_eks_addon.coredns]
}

resource "kubernetes_service_account_v1" "tenant_trainer" {
  for_each = kubernetes_namespace_v1.tenant

  metadata {
    name      = var.training_service_account
    namespace = each.value.metadata[0].name
    labels    = { "app.kubernetes.io/part-of" = "llmtrain" }
  }
  automount_service_account_token = false
}

# Dynamic provisioning for teams that want a scratch file system per workload.
resource "kubernetes_storage_class_v1" "fsx" {
  count = local.fsx_count

  metadata {
    name = "fsx-lustre"
  }
  storage_provisioner = "fsx.csi.aws.com"
  reclaim_policy      = "Delete"
  parameters = {
    subnetId                 = local.gpu_subnet_id
    securityGroupIds         = aws_security_group.fsx[0].id
    deploymentType           = "PERSISTENT_2"
    perUnitStorageThroughput = tostring(var.fsx_throughput_per_tib)
    fileSystemTypeVersion    = "2.15"
    dataCompressionType      = "LZ4"
    kmsKeyId                 = aws_kms_key.this.arn
  }
  mount_options = ["flock"]

  depends_on = [aws_eks_addon.fsx_csi]
}

# The terraform-made file system, statically bound: jobs mount claim "llmtrain-fsx".
resource "kubernetes_persistent_volume_v1" "fsx" {
  count = local.fsx_count

  metadata {
    name = "${var.cluster_name}-fsx"
  }
  spec {
    capacity                         = { storage = "${var.fsx_storage_capacity_gib}Gi" }
    access_modes                     = ["ReadWriteMany"]
    persistent_volume_reclaim_policy = "Retain"
    storage_class_name               = local.fsx_static_class
    mount_options                    = ["flock"]
    persistent_volume_source {
      csi {
        driver        = "fsx.csi.aws.com"
        volume_handle = aws_fsx_lustre_file_system.this[0].id
        volume_attributes = {
          dnsname   = aws_fsx_lustre_file_system.this[0].dns_name
          mountname = aws_fsx_lustre_file_system.this[0].mount_name
        }
      }
    }
  }

  depends_on = [aws_eks_addon.fsx_csi]
}

resource "kubernetes_persistent_volume_claim_v1" "fsx" {
  count = local.fsx_count

  metadata {
    name      = local.fsx_claim_name
    namespace = kubernetes_namespace_v1.training.metadata[0].name
  }
  spec {
    access_modes       = ["ReadWriteMany"]
    storage_class_name = local.fsx_static_class
    volume_name        = kubernetes_persistent_volume_v1.fsx[0].metadata[0].name
    resources {
      requests = { storage = "${var.fsx_storage_capacity_gib}Gi" }
    }
  }
}
