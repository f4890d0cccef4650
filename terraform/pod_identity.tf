# Every IAM role that EKS Pod Identity hands to pods, and the ServiceAccount each is for. The trust
# policies come from one module (modules/pod-identity-trust), so each role is assumable only
# through an association of this cluster, for exactly this namespace and ServiceAccount.
# Add-on ServiceAccounts live in the add-on's own namespace.
locals {
  pod_identity_service_accounts = {
    training         = { namespace = var.training_namespace, service_account = var.training_service_account }
    fsx_csi          = { namespace = "kube-system", service_account = "fsx-csi-controller-sa" }
    cloudwatch_agent = { namespace = "amazon-cloudwatch", service_account = "cloudwatch-agent" }
  }
}

module "pod_identity_trust" {
  source   = "./modules/pod-identity-trust"
  for_each = local.pod_identity_service_accounts

  cluster_arn     = aws_eks_cluster.this.arn
  namespace       = each.value.namespace
  service_account = each.value.service_account
}
