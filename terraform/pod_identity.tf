# Every IAM role that EKS Pod Identity hands to pods, and the ServiceAccount each is for. The trust
# policies come from one module (modules/pod-identity-trust), so each role is assumable only
# through an association of this cluster, for exactly these namespaces and this ServiceAccount.
# Add-on ServiceAccounts live in the add-on's own namespace. The training role serves every
# training namespace; its S3 permissions are scoped per namespace (modules/training-bucket-policy).
locals {
  training_namespaces = distinct(concat([var.training_namespace], var.tenant_namespaces))

  pod_identity_service_accounts = {
    training         = { namespaces = local.training_namespaces, service_account = var.training_service_account }
    fsx_csi          = { namespaces = ["kube-system"], service_account = "fsx-csi-controller-sa" }
    cloudwatch_agent = { namespaces = ["amazon-cloudwatch"], service_account = "cloudwatch-agent" }
  }
}

module "pod_identity_trust" {
  source   = "./modules/pod-identity-trust"
  for_each = local.pod_identity_service_accounts

  cluster_arn     = aws_eks_cluster.this.arn
  namespaces      = each.value.namespaces
  service_account = each.value.service_account
}
