# FSx for Lustre next to the GPU nodes (same subnet/AZ), linked to the bucket: datasets are
# lazy-loaded from s3://<bucket>/<fsx_s3_import_prefix> into /data on first read.
locals {
  fsx_count = var.enable_fsx ? 1 : 0
  # Lustre: 988 (LNet) and 1018-1023.
  lustre_ports = { lnet = [988, 988], lustre = [1018, 1023] }
}

resource "aws_security_group" "fsx" {
  count       = local.fsx_count
  name        = "${var.cluster_name}-fsx"
  description = "FSx for Lustre of ${var.cluster_name}: Lustre ports from cluster nodes and between servers"
  vpc_id      = local.vpc_id
  tags        = { Name = "${var.cluster_name}-fsx" }
}

resource "aws_vpc_security_group_ingress_rule" "fsx_from_nodes" {
  for_each = var.enable_fsx ? local.lustre_ports : {}

  security_group_id            = aws_security_group.fsx[0].id
  description                  = "Lustre ${each.key} from cluster nodes"
  referenced_security_group_id = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
}

resource "aws_vpc_security_group_ingress_rule" "fsx_self" {
  for_each = var.enable_fsx ? local.lustre_ports : {}

  security_group_id            = aws_security_group.fsx[0].id
  description                  = "Lustre ${each.key} between file servers"
  referenced_security_group_id = aws_security_group.fsx[0].id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
}

resource "aws_vpc_security_group_egress_rule" "fsx_to_nodes" {
  for_each = var.enable_fsx ? local.lustre_ports : {}

  security_group_id            = aws_security_group.fsx[0].id
  description                  = "Lustre ${each.key} to cluster nodes"
  referenced_security_group_id = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
}

resource "aws_vpc_security_group_egress_rule" "fsx_self" {
  for_each = var.enable_fsx ? local.lustre_ports : {}

  security_group_id            = aws_security_group.fsx[0].id
  description                  = "Lustre ${each.key} between file servers"
  referenced_security_group_id = aws_security_group.fsx[0].id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
}

# Lustre servers also open connections back to clients.
resource "aws_vpc_security_group_ingress_rule" "nodes_from_fsx" {
  for_each = var.enable_fsx ? local.lustre_ports : {}

  security_group_id            = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  description                  = "Lustre ${each.key} from FSx"
  referenced_security_group_id = aws_security_group.fsx[0].id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
}

resource "aws_cloudwatch_log_group" "fsx" {
  count             = local.fsx_count
  name              = "/aws/fsx/${var.cluster_name}"
  retention_in_days = var.cluster_log_retention_days
  kms_key_id        = aws_kms_key.this.arn
}

resource "aws_fsx_lustre_file_system" "this" {
  count = local.fsx_count

  storage_capacity            = var.fsx_storage_capacity_gib
  subnet_ids                  = [local.gpu_subnet_id]
  security_group_ids          = [aws_security_group.fsx[0].id]
  deployment_type             = "PERSISTENT_2"
  per_unit_storage_throughput = var.fsx_throughput_per_tib
  file_system_type_version    = "2.15"
  data_compression_type       = "LZ4"
  kms_key_id                  = aws_kms_key.this.arn
  copy_tags_to_backups        = true

  log_configuration {
    level       = "WARN_ERROR"
    destination = aws_cloudwatch_log_group.fsx[0].arn
  }

  tags = { Name = "${var.cluster_name}-lustre" }
}

resource "aws_fsx_data_repository_association" "datasets" {
  count = var.enable_fsx && var.fsx_s3_import_prefix != null ? 1 : 0

  file_system_id                   = aws_fsx_lustre_file_system.this[0].id
  data_repository_path             = "s3://${aws_s3_bucket.this.id}/${var.fsx_s3_import_prefix}"
  file_system_path                 = "/data"
  batch_import_meta_data_on_create = true

  s3 {
    auto_import_policy {
      events = ["NEW", "CHANGED", "DELETED"]
    }
  }
}

# The FSx CSI driver (EKS add-on), with its controller's AWS identity from Pod Identity.
resource "aws_iam_role" "fsx_csi" {
  count = local.fsx_count
  name  = "${var.cluster_name}-fsx-csi"

  assume_role_policy = module.pod_identity_trust["fsx_csi"].json
}

resource "aws_iam_role_policy_attachment" "fsx_csi" {
  count      = local.fsx_count
  role       = aws_iam_role.fsx_csi[0].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonFSxFullAccess"
}

resource "aws_eks_addon" "fsx_csi" {
  count = local.fsx_count

  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "aws-fsx-csi-driver"
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"
  # The node plugin must also run on the tainted GPU nodes.
  configuration_values = jsonencode({ node = { tolerateAllTaints = true } })

  pod_identity_association {
    role_arn        = aws_iam_role.fsx_csi[0].arn
    service_account = local.pod_identity_service_accounts.fsx_csi.service_account
  }

  depends_on = [aws_eks_node_group.system, aws_eks_addon.core]
}
