# ---------------------------------------------------------------------------------------------
# Node IAM role (system and GPU nodes). Pods get AWS credentials from EKS Pod Identity, not from
# this role: the launch templates keep IMDS at hop limit 1 so containers cannot reach it.
# ---------------------------------------------------------------------------------------------
resource "aws_iam_role" "node" {
  name = "${var.cluster_name}-node"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore", # Session Manager instead of SSH to debug a node
  ])
  role       = aws_iam_role.node.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/${each.value}"
}

# ---------------------------------------------------------------------------------------------
# System node group (CPU)
# ---------------------------------------------------------------------------------------------
resource "aws_launch_template" "system" {
  name_prefix            = "${var.cluster_name}-system-"
  update_default_version = true

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.system_node_group.disk_size_gib
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = aws_kms_key.this.arn
      delete_on_termination = true
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.cluster_name}-system" }
  }
}

resource "aws_eks_node_group" "system" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "system"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = local.private_subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  instance_types  = var.system_node_group.instance_types
  capacity_type   = "ON_DEMAND"

  scaling_config {
    min_size     = var.system_node_group.min_size
    max_size     = var.system_node_group.max_size
    desired_size = var.system_node_group.desired_size
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.system.id
    version = aws_launch_template.system.latest_version
  }

  labels = {
    "llmtrain.dev/node-pool" = "system"
  }

  depends_on = [aws_iam_role_policy_attachment.node, aws_eks_addon.core]

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }
}

# ---------------------------------------------------------------------------------------------
# GPU node groups (EFA)
# ---------------------------------------------------------------------------------------------

# EFA traffic must be allowed to and from every member of the group (the OS-bypass path ignores
# anything narrower); nothing else is opened here.
resource "aws_security_group" "efa" {
  name        = "${var.cluster_name}-efa"
  description = "EFA: all traffic between GPU nodes of ${var.cluster_name}"
  vpc_id      = local.vpc_id

  tags = { Name = "${var.cluster_name}-efa" }
}

resource "aws_vpc_security_group_ingress_rule" "efa_self" {
  security_group_id            = aws_security_group.efa.id
  description                  = "EFA and NCCL between GPU nodes"
  referenced_security_group_id = aws_security_group.efa.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "efa_self" {
  security_group_id            = aws_security_group.efa.id
  description                  = "EFA and NCCL between GPU nodes"
  referenced_security_group_id = aws_security_group.efa.id
  ip_protocol                  = "-1"
}

# A cluster placement group per GPU node group: all nodes of a job on the same network spine.
resource "aws_placement_group" "gpu" {
  for_each = local.gpu_groups

  name     = "${var.cluster_name}-${each.key}"
  strategy = "cluster"
}

locals {
  # nodeadm (AL2023) NodeConfig, merged by EKS with its own: stripe the instance-store NVMe drives
  # (8 x 3.84 TB on p5, 8 x 1 TB on p4de) into one RAID0 for containerd and the kubelet, so images,
  # emptyDir scratch and local checkpoint staging land on NVMe rather than EBS.
  gpu_user_data = <<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="LLMTRAIN"

    --LLMTRAIN
    Content-Type: application/node.eks.aws

    ---
    apiVersion: node.eks.aws/v1alpha1
    kind: NodeConfig
    spec:
      instance:
        localStorage:
          strategy: RAID0
    --LLMTRAIN--
  EOT
}

resource "aws_launch_template" "gpu" {
  for_each = local.gpu_groups

  name_prefix            = "${var.cluster_name}-${each.key}-"
  instance_type          = each.value.instance_type
  update_default_version = true
  user_data              = base64encode(local.gpu_user_data)

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = each.value.root_volume_gib
      volume_type           = "gp3"
      iops                  = 16000
      throughput            = 1000
      encrypted             = true
      kms_key_id            = aws_kms_key.this.arn
      delete_on_termination = true
    }
  }

  # The EFA interfaces: as many as the instance catalog says this instance type has.
  dynamic "network_interfaces" {
    for_each = local.efa_network_interfaces[each.key]
    content {
      network_card_index    = network_interfaces.value.network_card_index
      device_index          = network_interfaces.value.device_index
      interface_type        = network_interfaces.value.interface_type
      security_groups       = [aws_eks_cluster.this.vpc_config[0].cluster_security_group_id, aws_security_group.efa.id]
      delete_on_termination = true
    }
  }

  placement {
    group_name = aws_placement_group.gpu[each.key].name
  }

  # Targeted On-Demand Capacity Reservation, or the reservation behind a Capacity Block.
  dynamic "capacity_reservation_specification" {
    for_each = each.value.capacity_reservation_id != null || each.value.capacity_reservation_resource_group_arn != null ? [1] : []
    content {
      capacity_reservation_target {
        capacity_reservation_id                 = each.value.capacity_reservation_id
        capacity_reservation_resource_group_arn = each.value.capacity_reservation_resource_group_arn
      }
    }
  }

  dynamic "instance_market_options" {
    for_each = each.value.capacity_type == "CAPACITY_BLOCK" ? [1] : []
    content {
      market_type = "capacity-block"
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.cluster_name}-${each.key}" }
  }

  lifecycle {
    precondition {
      condition     = each.value.known
      error_message = "gpu_node_groups.${each.key}: ${each.value.instance_type} is not a GPU instance type of the catalog (${join(", ", keys(local.gpu_catalog))})."
    }
  }
}

resource "aws_eks_node_group" "gpu" {
  for_each = local.gpu_groups

  cluster_name    = aws_eks_cluster.this.name
  node_group_name = each.key
  node_role_arn   = aws_iam_role.node.arn
  # One subnet, one AZ: the placement group and any capacity reservation are zonal.
  subnet_ids      = [local.gpu_subnet_id]
  ami_type        = "AL2023_x86_64_NVIDIA" # the EKS GPU-optimised AMI (NVIDIA driver, container toolkit, EFA)
  release_version = each.value.ami_release_version
  capacity_type   = each.value.capacity_type

  scaling_config {
    min_size     = each.value.min_size
    max_size     = each.value.max_size
    desired_size = each.value.desired_size
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.gpu[each.key].id
    version = aws_launch_template.gpu[each.key].latest_version
  }

  labels = merge({
    "llmtrain.dev/node-pool"        = "gpu"
    "llmtrain.dev/node-group"       = each.key
    "llmtrain.dev/gpus-per-node"    = tostring(each.value.gpus_per_node)
    "llmtrain.dev/efa-interfaces"   = tostring(each.value.efa_interfaces)
    "nvidia.com/gpu.present"        = "true"
    "vpc.amazonaws.com/efa.present" = "true"
  }, each.value.extra_labels)

  # Only pods that tolerate this (training pods, device plugins, DCGM exporter) land on GPU nodes.
  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }

  depends_on = [aws_iam_role_policy_attachment.node, aws_eks_addon.core]

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }
}
