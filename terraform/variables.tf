# ---------------------------------------------------------------------------------------------
# General
# ---------------------------------------------------------------------------------------------
variable "region" {
  description = "AWS region. Pick one where your GPU quota and (if any) capacity reservation live."
  type        = string
  default     = "us-west-2"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must look like us-west-2."
  }
}

variable "cluster_name" {
  description = "EKS cluster name; also the prefix of every named resource."
  type        = string
  default     = "llmtrain"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name: 3-32 characters, lower-case letters, digits and '-', starting with a letter."
  }
}

variable "tags" {
  description = "Tags added to every AWS resource (on top of llmtrain.dev/cluster and managed-by)."
  type        = map(string)
  default     = {}
}

# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
variable "create_vpc" {
  description = "Create a VPC (public + private subnets, one NAT gateway per AZ, flow logs). false: use existing_vpc_id and its subnets."
  type        = bool
  default     = true
}

variable "vpc_cidr" {
  description = "CIDR of the VPC created when create_vpc is true. p5 nodes use 32 network interfaces each: leave room (a /16 by default, /19 private subnets)."
  type        = string
  default     = "10.0.0.0/16"

  validation {
    condition     = can(cidrnetmask(var.vpc_cidr)) && tonumber(split("/", var.vpc_cidr)[1]) <= 18
    error_message = "vpc_cidr must be a valid IPv4 CIDR no smaller than a /18."
  }
}

variable "availability_zones" {
  description = "AZs of the created VPC (2-4 names such as us-west-2a), listed explicitly so the set never changes under you; required when create_vpc is true. Include the AZ where your GPU capacity (quota, reservation, Capacity Block) is."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.availability_zones) <= 4 && length(distinct(var.availability_zones)) == length(var.availability_zones)
    error_message = "availability_zones: at most 4, without repeats."
  }
}

variable "gpu_availability_zone" {
  description = "AZ of the GPU nodes (a cluster placement group and a capacity reservation live in one AZ). null: the first of the VPC's AZs. Ignored with an existing VPC (existing_gpu_subnet_id decides)."
  type        = string
  default     = null
}

variable "existing_vpc_id" {
  description = "VPC to use when create_vpc is false."
  type        = string
  default     = null
}

variable "existing_private_subnet_ids" {
  description = "Private subnets (at least two AZs) for the control plane and the system nodes when create_vpc is false. They need a route to the internet (NAT) or VPC endpoints for ECR, S3, EKS, STS and EC2."
  type        = list(string)
  default     = []
}

variable "existing_gpu_subnet_id" {
  description = "Private subnet for the GPU nodes and FSx when create_vpc is false; it must be in the AZ of your capacity reservation, if any."
  type        = string
  default     = null
}

# ---------------------------------------------------------------------------------------------
# EKS control plane
# ---------------------------------------------------------------------------------------------
variable "kubernetes_version" {
  description = "EKS Kubernetes version, pinned: upgrade deliberately, one minor version at a time. The default is in EKS standard support (and is the version llmtrain's manifests are validated against); check `aws eks describe-cluster-versions` before you pin another."
  type        = string
  default     = "1.36"

  validation {
    condition     = can(regex("^1\\.(3[3-9]|[4-9][0-9])$", var.kubernetes_version))
    error_message = "kubernetes_version must be an EKS minor version still in standard or extended support, such as 1.36 (1.33 or newer)."
  }
}

variable "support_type" {
  description = "EKS upgrade policy. STANDARD: at the end of standard support EKS upgrades the control plane to the next version itself (no extended-support charge; plan your upgrades before that date). EXTENDED: keep the version up to 12 more months, at an extra hourly charge."
  type        = string
  default     = "STANDARD"

  validation {
    condition     = contains(["STANDARD", "EXTENDED"], var.support_type)
    error_message = "support_type must be STANDARD or EXTENDED."
  }
}

variable "enable_container_insights" {
  description = "Install the amazon-cloudwatch-observability EKS add-on: CloudWatch Container Insights with GPU (DCGM) and EFA metrics, the managed alternative (or complement) to enable_monitoring's Prometheus stack. Billed per metric and log volume by CloudWatch."
  type        = bool
  default     = false
}

variable "endpoint_public_access" {
  description = "Expose the API server endpoint publicly (restricted to endpoint_public_access_cidrs). The private endpoint is always on. false means terraform, helm and kubectl must run from inside the VPC."
  type        = bool
  default     = false
}

variable "endpoint_public_access_cidrs" {
  description = "CIDRs allowed to reach the public API endpoint when endpoint_public_access is true. Never 0.0.0.0/0."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "endpoint_public_access_cidrs: valid IPv4 CIDRs, and not 0.0.0.0/0."
  }
}

variable "cluster_log_retention_days" {
  description = "Retention of the control-plane log group (api, audit, authenticator, controllerManager, scheduler)."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.cluster_log_retention_days)
    error_message = "cluster_log_retention_days must be a CloudWatch retention value (e.g. 90, 365, 731)."
  }
}

variable "admin_principal_arns" {
  description = "IAM principals (roles/users) granted cluster-admin through EKS access entries. The identity running terraform is always admin (bootstrap_cluster_creator_admin_permissions)."
  type        = list(string)
  default     = []
}

# ---------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------
variable "system_node_group" {
  description = "The CPU node group for system pods: llmtrain operator, etcd, training-operator, Prometheus, CoreDNS."
  type = object({
    instance_types = optional(list(string), ["m7i.2xlarge"])
    min_size       = optional(number, 2)
    max_size       = optional(number, 4)
    desired_size   = optional(number, 2)
    disk_size_gib  = optional(number, 100)
  })
  default = {}

  validation {
    condition = (
      var.system_node_group.min_size >= 1 && var.system_node_group.max_size <= 20 &&
      var.system_node_group.min_size <= var.system_node_group.desired_size &&
      var.system_node_group.desired_size <= var.system_node_group.max_size
    )
    error_message = "system_node_group: need 1 <= min_size <= desired_size <= max_size <= 20."
  }
}

variable "gpu_node_groups" {
  description = <<-EOT
    GPU node groups, keyed by a short name. instance_type must be a GPU type of the instance
    catalog (operator/llmtrain/data/instances.yaml: p4d/p4de/p5/p5e/p5en); the number of EFA
    interfaces in the launch template comes from that catalog.
    capacity_type: ON_DEMAND (optionally targeting an On-Demand Capacity Reservation with
    capacity_reservation_id or capacity_reservation_resource_group_arn) or CAPACITY_BLOCK
    (an EC2 Capacity Block for ML; capacity_reservation_id required).
    root_volume_gib: EBS root volume; the instance-store NVMe drives are striped (RAID0) for
    containerd and kubelet by nodeadm.
  EOT
  type = map(object({
    instance_type                           = string
    min_size                                = optional(number, 0)
    max_size                                = optional(number, 2)
    desired_size                            = optional(number, 0)
    capacity_type                           = optional(string, "ON_DEMAND")
    capacity_reservation_id                 = optional(string)
    capacity_reservation_resource_group_arn = optional(string)
    root_volume_gib                         = optional(number, 500)
    ami_release_version                     = optional(string)
    extra_labels                            = optional(map(string), {})
  }))
  default = {
    p5 = { instance_type = "p5.48xlarge" }
  }

  validation {
    condition     = length(var.gpu_node_groups) >= 1
    error_message = "Define at least one GPU node group."
  }
  validation {
    condition = alltrue([for g in values(var.gpu_node_groups) :
      g.min_size >= 0 && g.max_size >= 1 && g.max_size <= 128 && g.min_size <= g.desired_size && g.desired_size <= g.max_size
    ])
    error_message = "gpu_node_groups: need 0 <= min_size <= desired_size <= max_size, 1 <= max_size <= 128."
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : contains(["ON_DEMAND", "CAPACITY_BLOCK"], g.capacity_type)])
    error_message = "gpu_node_groups: capacity_type must be ON_DEMAND or CAPACITY_BLOCK (spot is no place for multi-week jobs on placement groups)."
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : g.capacity_type != "CAPACITY_BLOCK" || g.capacity_reservation_id != null])
    error_message = "gpu_node_groups: CAPACITY_BLOCK needs capacity_reservation_id (the cr-... of the block)."
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : !(g.capacity_reservation_id != null && g.capacity_reservation_resource_group_arn != null)])
    error_message = "gpu_node_groups: give capacity_reservation_id or capacity_reservation_resource_group_arn, not both."
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : g.root_volume_gib >= 200 && g.root_volume_gib <= 16384])
    error_message = "gpu_node_groups: root_volume_gib between 200 and 16384 (container images for CUDA are large)."
  }
}

variable "efa_only_secondary_interfaces" {
  description = "Make every EFA interface after the first 'efa-only' (no IP address; saves subnet IPs: a p5 would otherwise take 32). Needs a recent EFA installer, which the EKS AL2023 NVIDIA AMI has."
  type        = bool
  default     = true
}

# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------
variable "bucket_name" {
  description = "S3 bucket for data shards and checkpoints. null: <cluster_name>-<account id>-<region>."
  type        = string
  default     = null

  validation {
    condition     = var.bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete a non-empty bucket (all data and checkpoints). Keep false outside experiments."
  type        = bool
  default     = false
}

variable "checkpoint_prefix" {
  description = "Key prefix under which jobs write checkpoints; the lifecycle rules for old checkpoint versions apply there."
  type        = string
  default     = "checkpoints/"

  validation {
    condition     = can(regex("^[A-Za-z0-9._/-]+/$", var.checkpoint_prefix))
    error_message = "checkpoint_prefix must end in '/'."
  }
}

variable "checkpoint_noncurrent_days" {
  description = "Days an overwritten or deleted checkpoint object is kept as a non-current version before it expires."
  type        = number
  default     = 14

  validation {
    condition     = var.checkpoint_noncurrent_days >= 1 && var.checkpoint_noncurrent_days <= 365
    error_message = "checkpoint_noncurrent_days must be 1-365."
  }
}

variable "checkpoint_expiration_days" {
  description = "Days after which any checkpoint object expires (0: never; llmtrain's checkpoint.keep prunes old ones itself)."
  type        = number
  default     = 0

  validation {
    condition     = var.checkpoint_expiration_days >= 0
    error_message = "checkpoint_expiration_days must be >= 0."
  }
}

variable "enable_fsx" {
  description = "Create an FSx for Lustre file system (linked to the bucket), the FSx CSI driver and a PV/PVC in the training namespace."
  type        = bool
  default     = true
}

variable "fsx_storage_capacity_gib" {
  description = "FSx for Lustre capacity (PERSISTENT_2: 1200, 2400 or a multiple of 2400 GiB)."
  type        = number
  default     = 4800

  validation {
    condition     = var.fsx_storage_capacity_gib == 1200 || (var.fsx_storage_capacity_gib >= 2400 && var.fsx_storage_capacity_gib % 2400 == 0)
    error_message = "fsx_storage_capacity_gib must be 1200 or a multiple of 2400."
  }
}

variable "fsx_throughput_per_tib" {
  description = "FSx PERSISTENT_2 throughput in MB/s per TiB of storage."
  type        = number
  default     = 250

  validation {
    condition     = contains([125, 250, 500, 1000], var.fsx_throughput_per_tib)
    error_message = "fsx_throughput_per_tib must be 125, 250, 500 or 1000."
  }
}

variable "fsx_s3_import_prefix" {
  description = "Bucket prefix linked into the file system's /data path (lazy-loaded on first read, exported on write). null: no data repository association."
  type        = string
  default     = "datasets/"
}

# ---------------------------------------------------------------------------------------------
# Training pods
# ---------------------------------------------------------------------------------------------
variable "training_namespace" {
  description = "Namespace where LLMTrainingJobs (and their PyTorchJobs and pods) run."
  type        = string
  default     = "llmtrain-jobs"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.training_namespace))
    error_message = "training_namespace must be a valid Kubernetes namespace name."
  }
}

variable "training_service_account" {
  description = "ServiceAccount the training pods run as; EKS Pod Identity maps it to the IAM role that may use the bucket."
  type        = string
  default     = "llmtrain-trainer"
}

variable "tenant_namespaces" {
  description = "Further namespaces where LLMTrainingJobs run, typically one per team. Each gets the training ServiceAccount, a Pod Identity association to the training role and the operator's watch; like training_namespace, a pod there reads and writes only s3://<bucket>/<checkpoint_prefix><its namespace>/."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for n in var.tenant_namespaces : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", n))])
    error_message = "tenant_namespaces must be valid Kubernetes namespace names."
  }
}

variable "shared_read_prefixes" {
  description = "Bucket key prefixes every training namespace may read and list but not write (datasets, tokenized data, pretrained weights the platform team publishes)."
  type        = list(string)
  default     = ["datasets/", "tokens/"]

  validation {
    condition     = alltrue([for p in var.shared_read_prefixes : can(regex("^[A-Za-z0-9._/-]+/$", p))])
    error_message = "shared_read_prefixes must be key prefixes ending in '/'."
  }
}

# ---------------------------------------------------------------------------------------------
# In-cluster software (Helm provider)
# ---------------------------------------------------------------------------------------------
variable "install_training_operator" {
  description = "Install the Kubeflow training-operator (PyTorchJob controller) from its pinned upstream manifests."
  type        = bool
  default     = true
}

variable "training_operator_version" {
  description = "Kubeflow training-operator release (git tag of its manifests)."
  type        = string
  default     = "v1.9.4"

  validation {
    condition     = can(regex("^v1\\.[0-9]+\\.[0-9]+$", var.training_operator_version))
    error_message = "training_operator_version must be a v1.x.y tag (PyTorchJob lives in the v1 operator)."
  }
}

variable "install_jobset" {
  description = "Install JobSet (its chart from registry.k8s.io, at jobset_version) and enable the llmtrain operator's jobset backend. With install_training_operator too, both backends are enabled and new jobs default to PyTorchJob (move namespaces with llmtrain_values.backends.namespaceDefaults); alone, JobSet is the default. At least one of the three backends (with enable_job_backend) is needed."
  type        = bool
  default     = false
}

variable "enable_job_backend" {
  description = "Enable the llmtrain operator's job backend (a batch/v1 Indexed Job and a headless Service per attempt: nothing to install, Kubernetes serves both). New jobs default to it only when neither install_training_operator nor install_jobset is set."
  type        = bool
  default     = false
}

variable "jobset_version" {
  description = "JobSet release (its chart version on registry.k8s.io); the version the dev cluster's chain tests run."
  type        = string
  default     = "0.12.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.jobset_version))
    error_message = "jobset_version must be a chart version such as 0.12.0."
  }
}

variable "install_etcd" {
  description = "Turn on the llmtrain-operator chart's bundled etcd (llmtrain-etcd, v2 API enabled) for torch elastic rendezvous; it serves the operator's default endpoint llmtrain-etcd.llmtrain-system.svc:2379."
  type        = bool
  default     = true
}

variable "install_kueue" {
  description = "Install Kueue (its own chart, pinned in chart_versions.kueue) for quotas, priorities and topology-aware placement of LLMTrainingJobs with spec.cluster.queueName, configured by charts/upstream-values/kueue.yaml (the kubeflow.org/pytorchjob and jobset.x-k8s.io/jobset integrations on; Kueue's own defaults leave PyTorchJob out from v0.19). Queues and flavors are the platform team's: see docs/operations/kueue.md."
  type        = bool
  default     = false
}

variable "install_llmtrain" {
  description = "Install the llmtrain operator chart (../charts/llmtrain-operator in this repository)."
  type        = bool
  default     = true
}

variable "llmtrain_chart_path" {
  description = "Path to the llmtrain-operator chart. null: the chart in this repository."
  type        = string
  default     = null
}

variable "llmtrain_values" {
  description = "Extra values for the llmtrain-operator chart, merged over the ones this module sets."
  type        = any
  default     = {}
}

variable "enable_monitoring" {
  description = "Install kube-prometheus-stack (Prometheus, Grafana) and NVIDIA's DCGM exporter on the GPU nodes."
  type        = bool
  default     = true
}

variable "chart_versions" {
  description = "Pinned versions of the third-party charts."
  type = object({
    nvidia_device_plugin  = optional(string, "0.17.1")
    efa_device_plugin     = optional(string, "v0.5.7")
    kube_prometheus_stack = optional(string, "70.4.2")
    dcgm_exporter         = optional(string, "4.1.1")
    kueue                 = optional(string, "0.19.2")
  })
  default = {}
}

variable "llmtrain_allowed_image_registries" {
  description = "More image registry prefixes LLMTrainingJobs may run, besides public.ecr.aws/llmtrain and this account's ECR in var.region (the operator rejects any other image)."
  type        = list(string)
  default     = []
}
