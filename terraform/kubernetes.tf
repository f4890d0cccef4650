# In-cluster objects owned by this module: the training namespace and ServiceAccount, the FSx
# StorageClass/PV/PVC and the rendezvous etcd. They wait for the system nodes and CoreDNS.
locals {
  fsx_claim_name = "llmtrain-fsx"
  etcd_name      = "llmtrain-etcd"
  etcd_endpoint  = "${local.etcd_name}.${var.training_namespace}.svc:2379"
}

resource "kubernetes_namespace_v1" "training" {
  metadata {
    name   = var.training_namespace
    labels = { "app.kubernetes.io/part-of" = "llmtrain" }
  }

  depends_on = [aws_eks_node_group.system, aws_eks_addon.coredns]
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
    storage_class_name               = ""
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
    storage_class_name = ""
    volume_name        = kubernetes_persistent_volume_v1.fsx[0].metadata[0].name
    resources {
      requests = { storage = "${var.fsx_storage_capacity_gib}Gi" }
    }
  }
}

# ---------------------------------------------------------------------------------------------
# etcd for torch elastic rendezvous (PyTorchJob elasticPolicy rdzvBackend etcd/etcd-v2).
# One member, memory-backed: rendezvous state lives only as long as an attempt, and llmtrain gives
# every attempt a fresh rendezvous id, so a restarted etcd loses nothing a job still needs.
# ---------------------------------------------------------------------------------------------
resource "kubernetes_service_v1" "etcd" {
  count = var.install_etcd ? 1 : 0

  metadata {
    name      = local.etcd_name
    namespace = kubernetes_namespace_v1.training.metadata[0].name
    labels    = { "app.kubernetes.io/name" = local.etcd_name }
  }
  spec {
    selector = { "app.kubernetes.io/name" = local.etcd_name }
    port {
      name        = "client"
      port        = 2379
      target_port = "client"
    }
  }
}

resource "kubernetes_deployment_v1" "etcd" {
  count = var.install_etcd ? 1 : 0

  metadata {
    name      = local.etcd_name
    namespace = kubernetes_namespace_v1.training.metadata[0].name
    labels    = { "app.kubernetes.io/name" = local.etcd_name, "app.kubernetes.io/part-of" = "llmtrain" }
  }

  spec {
    replicas = 1
    strategy {
      type = "Recreate"
    }
    selector {
      match_labels = { "app.kubernetes.io/name" = local.etcd_name }
    }

    template {
      metadata {
        labels = { "app.kubernetes.io/name" = local.etcd_name }
      }

      spec {
        automount_service_account_token = false
        node_selector                   = { "llmtrain.dev/node-pool" = "system" }

        security_context {
          run_as_non_root = true
          run_as_user     = 65532
          run_as_group    = 65532
          fs_group        = 65532
          seccomp_profile {
            type = "RuntimeDefault"
          }
        }

        container {
          name              = "etcd"
          image             = var.etcd_image
          image_pull_policy = "Always"
          command = [
            "/usr/local/bin/etcd",
            "--name=${local.etcd_name}",
            "--data-dir=/var/lib/etcd",
            "--listen-client-urls=http://0.0.0.0:2379",
            "--advertise-client-urls=http://${local.etcd_endpoint}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=${local.etcd_name}=http://127.0.0.1:2380",
            "--enable-v2=true",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
            "--quota-backend-bytes=2147483648",
          ]

          port {
            name           = "client"
            container_port = 2379
          }

          resources {
            requests = { cpu = "250m", memory = "512Mi" }
            limits   = { cpu = "1", memory = "2Gi" }
          }

          liveness_probe {
            http_get {
              path = "/health"
              port = "client"
            }
            period_seconds    = 10
            failure_threshold = 6
          }

          readiness_probe {
            http_get {
              path = "/health"
              port = "client"
            }
            period_seconds = 5
          }

          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            privileged                 = false
            capabilities {
              drop = ["ALL"]
            }
          }

          volume_mount {
            name       = "data"
            mount_path = "/var/lib/etcd"
          }
        }

        volume {
          name = "data"
          empty_dir {
            medium     = "Memory"
            size_limit = "2Gi"
          }
        }
      }
    }
  }
}
