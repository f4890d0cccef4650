# Provider pins. `terraform init` writes .terraform.lock.hcl; commit it in your own copy so every
# apply uses the same provider builds.
terraform {
  # 1.5.7 is the oldest release this module is written for (and the one `make test` builds to check
  # formatting); newer 1.x releases work unchanged.
  required_version = ">= 1.5.7"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # >= 5.82: launch-template interface_type "efa-only" and node group capacity_type CAPACITY_BLOCK.
      version = "~> 5.82"
    }
    helm = {
      source  = "hashicorp/helm"
      version = "~> 2.17"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.36"
    }
    # The rendezvous CA and etcd's server certificate (rendezvous_ca.tf).
    tls = {
      source  = "hashicorp/tls"
      version = "~> 4.0"
    }
    # The Kubeflow training-operator ships kustomize manifests, not a Helm chart.
    kustomization = {
      source  = "kbst/kustomization"
      version = "~> 0.9"
    }
  }
}
