output "cluster_name" {
  description = "EKS cluster name."
  value       = aws_eks_cluster.this.name
}

output "cluster_endpoint" {
  description = "API server endpoint."
  value       = aws_eks_cluster.this.endpoint
}

output "kubernetes_version" {
  description = "Kubernetes version of the control plane."
  value       = aws_eks_cluster.this.version
}

output "kubeconfig_command" {
  description = "Writes a kubeconfig entry for this cluster."
  value       = "aws eks update-kubeconfig --region ${var.region} --name ${aws_eks_cluster.this.name}"
}

output "bucket_name" {
  description = "Bucket for data shards and checkpoints (spec.data.uri / spec.checkpoint.uri: s3://<bucket>/...)."
  value       = aws_s3_bucket.this.id
}

output "checkpoint_uri" {
  description = "Where jobs in training_namespace put checkpoints (s3://<bucket>/<checkpoint_prefix><namespace>/): the only prefix their pods may write, under the lifecycle rules. Another namespace N uses <checkpoint_prefix>N/."
  value       = "s3://${aws_s3_bucket.this.id}/${var.checkpoint_prefix}${var.training_namespace}/"
}

output "training_namespaces" {
  description = "Every namespace whose trainer ServiceAccount is mapped to training_role_arn (training_namespace and tenant_namespaces)."
  value       = local.training_namespaces
}

output "training_namespace" {
  description = "Namespace for LLMTrainingJobs."
  value       = var.training_namespace
}

output "training_service_account" {
  description = "ServiceAccount of the training pods (mapped to training_role_arn by Pod Identity)."
  value       = var.training_service_account
}

output "training_role_arn" {
  description = "IAM role the training pods assume; in S3 a pod may write only its own namespace's checkpoint prefix and read the shared prefixes."
  value       = aws_iam_role.training.arn
}

output "fsx_claim_name" {
  description = "PersistentVolumeClaim (in training_namespace) of the FSx for Lustre file system; null without FSx."
  value       = var.enable_fsx ? local.fsx_claim_name : null
}

output "fsx_file_system_id" {
  description = "FSx for Lustre file system id; null without FSx."
  value       = var.enable_fsx ? aws_fsx_lustre_file_system.this[0].id : null
}

output "etcd_endpoint" {
  description = "Rendezvous endpoint (host:port) for PyTorchJob elasticPolicy; null without etcd."
  value       = var.install_etcd && var.install_llmtrain ? local.etcd_endpoint : null
}

output "gpu_node_groups" {
  description = "Per GPU node group: instance type, GPUs and EFA interfaces per node (from the catalog), placement group, AZ."
  value = {
    for name, g in local.gpu_groups : name => {
      instance_type   = g.instance_type
      gpus_per_node   = g.gpus_per_node
      efa_interfaces  = g.efa_interfaces
      placement_group = aws_placement_group.gpu[name].name
      capacity_type   = g.capacity_type
      subnet_id       = local.gpu_subnet_id
    }
  }
}

output "kms_key_arn" {
  description = "KMS key encrypting secrets, logs, EBS, the bucket and FSx."
  value       = aws_kms_key.this.arn
}
