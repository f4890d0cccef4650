# The training pods' identity: EKS Pod Identity maps <training_namespace>/<training_service_account>
# to this role, which can read and write the bucket and nothing else.
resource "aws_iam_role" "training" {
  name = "${var.cluster_name}-training"

  assume_role_policy = module.pod_identity_trust["training"].json
}

resource "aws_iam_role_policy" "training_bucket" {
  name = "bucket-read-write"
  role = aws_iam_role.training.id

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ListBucket"
        Effect   = "Allow"
        Action   = ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"]
        Resource = aws_s3_bucket.this.arn
      },
      {
        Sid    = "ReadWriteObjects"
        Effect = "Allow"
        Action = [
          "s3:GetObject", "s3:PutObject", "s3:DeleteObject",
          "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
        ]
        Resource = "${aws_s3_bucket.this.arn}/*"
      },
      {
        Sid      = "UseBucketKey"
        Effect   = "Allow"
        Action   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
        Resource = aws_kms_key.this.arn
        Condition = {
          StringEquals = { "kms:ViaService" = "s3.${var.region}.amazonaws.com" }
        }
      },
    ]
  })
}

resource "aws_eks_pod_identity_association" "training" {
  cluster_name    = aws_eks_cluster.this.name
  namespace       = local.pod_identity_service_accounts.training.namespace
  service_account = local.pod_identity_service_accounts.training.service_account
  role_arn        = aws_iam_role.training.arn

  depends_on = [aws_eks_addon.core]
}
