# The S3 permissions of the training role, one role for every training namespace, scoped by the
# namespace the pod runs in. Provider-free on purpose: tests evaluate it with `terraform console`.
#
# EKS Pod Identity tags every role session with the pod's namespace, and a policy reads it as
# ${aws:PrincipalTag/kubernetes-namespace} (Amazon EKS User Guide, "Grant Pods access to AWS
# resources based on tags", https://docs.aws.amazon.com/eks/latest/userguide/pod-id-abac.html,
# which lists the tags eks-cluster-arn, eks-cluster-name, kubernetes-namespace,
# kubernetes-service-account, kubernetes-pod-name, kubernetes-pod-uid). So a pod in namespace N:
#   - reads and writes objects only under <checkpoint_prefix>N/ (its checkpoints: whoever could
#     write another namespace's checkpoints could make its next resume load what they wrote);
#   - lists the bucket only under those prefixes (s3:prefix condition), so it cannot learn
#     another namespace's job names or steps either;
#   - reads (never writes) the shared prefixes, e.g. datasets the platform team publishes.
# The associations must keep session tags on (the default): without the tag, the variable does
# not resolve and the statements grant nothing.

variable "bucket_arn" {
  description = "ARN of the training bucket."
  type        = string
}

variable "kms_key_arn" {
  description = "ARN of the bucket's KMS key (SSE-KMS)."
  type        = string
}

variable "region" {
  description = "Region of the bucket (the kms:ViaService condition)."
  type        = string
}

variable "checkpoint_prefix" {
  description = "Key prefix of the per-namespace areas: a pod in namespace N reads and writes <checkpoint_prefix>N/."
  type        = string
}

variable "shared_read_prefixes" {
  description = "Key prefixes every training namespace may read and list but not write."
  type        = list(string)
}

locals {
  # "$${" is Terraform's escape for a literal "${": IAM, not Terraform, resolves the variable.
  own_prefix = "${var.checkpoint_prefix}$${aws:PrincipalTag/kubernetes-namespace}/"

  policy = {
    Version = "2012-10-17"
    Statement = concat([
      {
        Sid      = "BucketLocation"
        Effect   = "Allow"
        Action   = ["s3:GetBucketLocation"]
        Resource = var.bucket_arn
      },
      {
        Sid       = "ListOwnAndSharedPrefixes"
        Effect    = "Allow"
        Action    = ["s3:ListBucket"]
        Resource  = var.bucket_arn
        Condition = { StringLike = { "s3:prefix" = concat(["${local.own_prefix}*"], [for p in var.shared_read_prefixes : "${p}*"]) } }
      },
      {
        Sid    = "ReadWriteOwnNamespace"
        Effect = "Allow"
        Action = [
          "s3:GetObject", "s3:PutObject", "s3:DeleteObject",
          "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
        ]
        Resource = "${var.bucket_arn}/${local.own_prefix}*"
      },
      {
        Sid      = "UseBucketKey"
        Effect   = "Allow"
        Action   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
        Resource = var.kms_key_arn
        Condition = {
          StringEquals = { "kms:ViaService" = "s3.${var.region}.amazonaws.com" }
        }
      },
      ], length(var.shared_read_prefixes) == 0 ? [] : [{
        Sid      = "ReadShared"
        Effect   = "Allow"
        Action   = ["s3:GetObject"]
        Resource = [for p in var.shared_read_prefixes : "${var.bucket_arn}/${p}*"]
    }])
  }
}

output "json" {
  description = "The policy document, for aws_iam_role_policy.policy."
  value       = jsonencode(local.policy)
}
