# The training pods' identity: EKS Pod Identity maps <namespace>/<training_service_account>, in
# training_namespace and each of tenant_namespaces, to this one role. What it may do in S3 depends
# on the namespace the pod runs in (modules/training-bucket-policy): its own
# <checkpoint_prefix><namespace>/ read-write, the shared prefixes read-only, nothing else.
resource "aws_iam_role" "training" {
  name = "${var.cluster_name}-training"

  assume_role_policy = module.pod_identity_trust["training"].json
}

module "training_bucket_policy" {
  source = "./modules/training-bucket-policy"

  bucket_arn           = aws_s3_bucket.this.arn
  kms_key_arn          = aws_kms_key.this.arn
  region               = var.region
  checkpoint_prefix    = var.checkpoint_prefix
  shared_read_prefixes = var.shared_read_prefixes
}

resource "aws_iam_role_policy" "training_bucket" {
  name = "bucket-per-namespace"
  role = aws_iam_role.training.id

  policy = module.training_bucket_policy.json
}

resource "aws_eks_pod_identity_association" "training" {
  cluster_name    = aws_eks_cluster.this.name
  namespace       = var.training_namespace
  service_account = local.pod_identity_service_accounts.training.service_account
  role_arn        = aws_iam_role.training.arn

  depends_on = [aws_eks_addon.core]
}

# The same role for each team namespace (a separate resource so the training namespace's
# association keeps its address in existing states).
resource "aws_eks_pod_identity_association" "tenant" {
  for_each = toset(var.tenant_namespaces)

  cluster_name    = aws_eks_cluster.this.name
  namespace       = each.value
  service_account = local.pod_identity_service_accounts.training.service_account
  role_arn        = aws_iam_role.training.arn

  depends_on = [aws_eks_addon.core, kubernetes_namespace_v1.tenant]
}
