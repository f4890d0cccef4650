provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "llmtrain.dev/cluster" = var.cluster_name
      "managed-by"           = "terraform"
    })
  }
}

# The in-cluster providers authenticate with a short-lived token from `aws eks get-token`
# (exec plugin), so no credential ends up in the state file. The machine running terraform needs
# network access to the API endpoint: either endpoint_public_access with its CIDR in
# endpoint_public_access_cidrs, or a path into the VPC (VPN, bastion, CI runner in the VPC).
locals {
  kube_exec = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", aws_eks_cluster.this.name, "--region", var.region]
  }
}

provider "kubernetes" {
  host                   = aws_eks_cluster.this.endpoint
  cluster_ca_certificate = base64decode(aws_eks_cluster.this.certificate_authority[0].data)

  exec {
    api_version = local.kube_exec.api_version
    command     = local.kube_exec.command
    args        = local.kube_exec.args
  }
}

provider "helm" {
  kubernetes {
    host                   = aws_eks_cluster.this.endpoint
    cluster_ca_certificate = base64decode(aws_eks_cluster.this.certificate_authority[0].data)

    exec {
      api_version = local.kube_exec.api_version
      command     = local.kube_exec.command
      args        = local.kube_exec.args
    }
  }
}

provider "kustomization" {
  kubeconfig_raw = yamlencode({
    apiVersion        = "v1"
    kind              = "Config"
    "current-context" = "eks"
    clusters = [{
      name = "eks"
      cluster = {
        server                       = aws_eks_cluster.this.endpoint
        "certificate-authority-data" = aws_eks_cluster.this.certificate_authority[0].data
      }
    }]
    contexts = [{ name = "eks", context = { cluster = "eks", user = "eks" } }]
    users = [{
      name = "eks"
      user = {
        exec = {
          apiVersion = local.kube_exec.api_version
          command    = local.kube_exec.command
          args       = local.kube_exec.args
        }
      }
    }]
  })
}
