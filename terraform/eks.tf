resource "aws_iam_role" "cluster" {
  name = "${var.cluster_name}-cluster"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
    }]
  })
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonEKSClusterPolicy"
}

# Created before the cluster so EKS finds it and does not make one with infinite retention.
resource "aws_cloudwatch_log_group" "cluster" {
  name              = "/aws/eks/${var.cluster_name}/cluster"
  retention_in_days = var.cluster_log_retention_days
  kms_key_id        = aws_kms_key.this.arn
}

resource "aws_eks_cluster" "this" {
  #checkov:skip=CKV_AWS_339:checkov 3.3.30 (the newest release) lists EKS versions up to 1.35; EKS supports 1.36, the default, and variables.tf refuses versions out of support (tests/infra pin both).
  name     = var.cluster_name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn

  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  # What happens when kubernetes_version leaves standard support (see var.support_type).
  upgrade_policy {
    support_type = var.support_type
  }

  access_config {
    authentication_mode                         = "API"
    bootstrap_cluster_creator_admin_permissions = true
  }

  vpc_config {
    subnet_ids              = local.private_subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = var.endpoint_public_access
    public_access_cidrs     = var.endpoint_public_access ? var.endpoint_public_access_cidrs : null
  }

  encryption_config {
    resources = ["secrets"]
    provider {
      key_arn = aws_kms_key.this.arn
    }
  }

  lifecycle {
    precondition {
      condition     = !var.endpoint_public_access || length(var.endpoint_public_access_cidrs) > 0
      error_message = "endpoint_public_access needs endpoint_public_access_cidrs (your office/VPN/CI CIDRs)."
    }
    precondition {
      condition     = var.create_vpc || (var.existing_vpc_id != null && length(var.existing_private_subnet_ids) >= 2 && var.existing_gpu_subnet_id != null)
      error_message = "With create_vpc = false, set existing_vpc_id, existing_private_subnet_ids (2+ AZs) and existing_gpu_subnet_id."
    }
  }

  depends_on = [
    aws_iam_role_policy_attachment.cluster,
    aws_cloudwatch_log_group.cluster,
  ]
}

resource "aws_eks_access_entry" "admin" {
  for_each      = toset(var.admin_principal_arns)
  cluster_name  = aws_eks_cluster.this.name
  principal_arn = each.value
}

resource "aws_eks_access_policy_association" "admin" {
  for_each      = toset(var.admin_principal_arns)
  cluster_name  = aws_eks_cluster.this.name
  principal_arn = each.value
  policy_arn    = "arn:${local.partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"

  access_scope {
    type = "cluster"
  }

  depends_on = [aws_eks_access_entry.admin]
}

# EKS add-ons. Versions default to the one EKS recommends for kubernetes_version; once a cluster
# runs, pin what you tested with (aws eks describe-addon-versions).
resource "aws_eks_addon" "core" {
  for_each = toset(["vpc-cni", "kube-proxy", "eks-pod-identity-agent"])

  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = each.value
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"
}

# CoreDNS needs nodes to schedule on, so it waits for the system node group.
resource "aws_eks_addon" "coredns" {
  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "coredns"
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"

  depends_on = [aws_eks_node_group.system]
}

# CloudWatch Container Insights with enhanced observability: the CloudWatch agent (node, pod and
# DCGM GPU metrics, EFA counters) and Fluent Bit, as an EKS-managed add-on. The agent's
# ServiceAccount gets CloudWatchAgentServerPolicy through Pod Identity.
resource "aws_iam_role" "cloudwatch_agent" {
  count = var.enable_container_insights ? 1 : 0
  name  = "${var.cluster_name}-cloudwatch-agent"

  assume_role_policy = module.pod_identity_trust["cloudwatch_agent"].json
}

resource "aws_iam_role_policy_attachment" "cloudwatch_agent" {
  count      = var.enable_container_insights ? 1 : 0
  role       = aws_iam_role.cloudwatch_agent[0].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/CloudWatchAgentServerPolicy"
}

resource "aws_eks_addon" "cloudwatch_observability" {
  count = var.enable_container_insights ? 1 : 0

  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "amazon-cloudwatch-observability"
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"

  pod_identity_association {
    role_arn        = aws_iam_role.cloudwatch_agent[0].arn
    service_account = local.pod_identity_service_accounts.cloudwatch_agent.service_account
  }

  # The agent runs on GPU nodes too (GPU metrics); they carry the GPU/EFA taints.
  configuration_values = jsonencode({
    containerLogs = { enabled = true }
    tolerations   = [{ operator = "Exists" }]
  })

  depends_on = [aws_eks_addon.core, aws_eks_node_group.system]
}
