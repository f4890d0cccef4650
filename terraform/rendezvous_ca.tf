# The rendezvous CA and the bundled etcd's server certificate: the Secret that the chart's etcd and
# operator mount when etcd.auth.enabled (the chart's default). It holds what
# `python -m llmtrain.rendezvous_auth secret --namespace llmtrain-system --service llmtrain-etcd`
# prints: ca.crt, ca.key (the operator signs each namespace's client certificate with it), and
# tls.crt/tls.key for the etcd Service's DNS names. The chart does not generate keys itself, so that
# Argo CD syncs stay stable; without this Secret etcd and the operator would wait for it.
# The private keys are in the Terraform state: keep the state encrypted (the S3 backend with KMS).
locals {
  rendezvous_auth = var.install_llmtrain && var.install_etcd
  etcd_service    = "llmtrain-etcd"
}

resource "kubernetes_namespace_v1" "llmtrain" {
  count = local.rendezvous_auth ? 1 : 0
  metadata {
    name = local.llmtrain_namespace
  }
  lifecycle {
    # Helm's create_namespace labels it too; the release owns nothing else here.
    ignore_changes = [metadata[0].labels, metadata[0].annotations]
  }
}

resource "tls_private_key" "rendezvous_ca" {
  count       = local.rendezvous_auth ? 1 : 0
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "rendezvous_ca" {
  count           = local.rendezvous_auth ? 1 : 0
  private_key_pem = tls_private_key.rendezvous_ca[0].private_key_pem
  subject {
    common_name = "llmtrain-rendezvous-ca"
  }
  is_ca_certificate     = true
  validity_period_hours = 10 * 365 * 24
  allowed_uses          = ["cert_signing", "crl_signing", "digital_signature"]
}

resource "tls_private_key" "etcd_server" {
  count       = local.rendezvous_auth ? 1 : 0
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "etcd_server" {
  count           = local.rendezvous_auth ? 1 : 0
  private_key_pem = tls_private_key.etcd_server[0].private_key_pem
  subject {
    common_name = local.etcd_service
  }
  dns_names = [
    local.etcd_service,
    "${local.etcd_service}.${local.llmtrain_namespace}",
    "${local.etcd_service}.${local.llmtrain_namespace}.svc",
    "${local.etcd_service}.${local.llmtrain_namespace}.svc.cluster.local",
  ]
}

resource "tls_locally_signed_cert" "etcd_server" {
  count                 = local.rendezvous_auth ? 1 : 0
  cert_request_pem      = tls_cert_request.etcd_server[0].cert_request_pem
  ca_private_key_pem    = tls_private_key.rendezvous_ca[0].private_key_pem
  ca_cert_pem           = tls_self_signed_cert.rendezvous_ca[0].cert_pem
  validity_period_hours = 10 * 365 * 24
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth"]
}

resource "kubernetes_secret_v1" "rendezvous_ca" {
  count = local.rendezvous_auth ? 1 : 0
  metadata {
    name      = "${local.etcd_service}-tls"
    namespace = kubernetes_namespace_v1.llmtrain[0].metadata[0].name
    labels    = { "app.kubernetes.io/part-of" = "llmtrain" }
  }
  data = {
    "ca.crt"  = tls_self_signed_cert.rendezvous_ca[0].cert_pem
    "ca.key"  = tls_private_key.rendezvous_ca[0].private_key_pem
    "tls.crt" = tls_locally_signed_cert.etcd_server[0].cert_pem
    "tls.key" = tls_private_key.etcd_server[0].private_key_pem
  }
}
