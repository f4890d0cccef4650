# The trust policy of an IAM role that EKS Pod Identity assumes for one ServiceAccount of one
# cluster. Every Pod Identity role of the root module takes its assume_role_policy from here, so
# the conditions are written once. Provider-free on purpose: tests evaluate it with
# `terraform console` alone.
#
# What each part is for:
#   - principal pods.eks.amazonaws.com with sts:AssumeRole (the credentials) and sts:TagSession
#     (Pod Identity adds session tags; without it every AssumeRole is denied). Amazon EKS User
#     Guide, "Create IAM role with trust policy required by EKS Pod Identity".
#   - the session tags Pod Identity sets, eks-cluster-arn, kubernetes-namespace and
#     kubernetes-service-account (same page, "Setting Conditions"): the role is assumable only for
#     this cluster's ServiceAccount in these namespaces, even if another association in the
#     account names the role. StringEquals with a list matches any one of its values.
#   - aws:SourceAccount, the confused-deputy guard for service principals: only this account's
#     Pod Identity may assume the role. No aws:SourceArn condition: AWS documents no value of it
#     for Pod Identity, and a wrong pattern would make every AssumeRole fail; the eks-cluster-arn
#     session tag already pins the cluster. (The training role used to require SourceArn equal to
#     the cluster ARN, a value nothing documents either.)
#   - Associations must keep session tags on (the default; disableSessionTags = true would fail
#     the tag conditions).

variable "cluster_arn" {
  description = "ARN of the EKS cluster whose Pod Identity associations may assume the role (arn:<partition>:eks:<region>:<account>:cluster/<name>)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:eks:[a-z0-9-]+:[0-9]{12}:cluster/[A-Za-z0-9][A-Za-z0-9_-]*$", var.cluster_arn))
    error_message = "cluster_arn must be an EKS cluster ARN, arn:<partition>:eks:<region>:<12-digit account>:cluster/<name>."
  }
}

variable "namespaces" {
  description = "Kubernetes namespaces of the ServiceAccount the role is for (one association in each)."
  type        = list(string)

  validation {
    condition     = length(var.namespaces) > 0
    error_message = "namespaces must name at least one namespace."
  }
}

variable "service_account" {
  description = "Name of the Kubernetes ServiceAccount the role is for (the association's service account)."
  type        = string
}

locals {
  # arn:<partition>:eks:<region>:<account>:cluster/<name>
  account_id = split(":", var.cluster_arn)[4]

  policy = {
    Version = "2012-10-17"
    Statement = [{
      Sid       = "EksPodIdentity"
      Effect    = "Allow"
      Principal = { Service = "pods.eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
      Condition = {
        StringEquals = {
          "aws:SourceAccount"                         = local.account_id
          "aws:RequestTag/eks-cluster-arn"            = var.cluster_arn
          "aws:RequestTag/kubernetes-namespace"       = var.namespaces
          "aws:RequestTag/kubernetes-service-account" = var.service_account
        }
      }
    }]
  }
}

output "json" {
  description = "The trust policy document, for aws_iam_role.assume_role_policy."
  value       = jsonencode(local.policy)
}
