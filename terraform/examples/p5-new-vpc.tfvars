# Two p5.48xlarge nodes (16 x H100) in a new VPC, on-demand, reachable from one office CIDR.
#   terraform plan -var-file=examples/p5-new-vpc.tfvars
region             = "us-east-2"
cluster_name       = "llmtrain"
kubernetes_version = "1.36"

availability_zones    = ["us-east-2a", "us-east-2b", "us-east-2c"]
gpu_availability_zone = "us-east-2a" # where your p5 quota / capacity is

endpoint_public_access       = true
endpoint_public_access_cidrs = ["203.0.113.0/24"] # replace with your office / VPN / CI egress CIDR

gpu_node_groups = {
  p5 = {
    instance_type = "p5.48xlarge"
    min_size      = 0
    desired_size  = 2
    max_size      = 4
  }
}

fsx_storage_capacity_gib = 4800
enable_monitoring        = true

tags = { team = "ml-platform" }
