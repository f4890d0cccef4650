# An existing VPC, four p4de.24xlarge (32 x A100 80GB) from an EC2 Capacity Block, plus one p5 group
# on a targeted On-Demand Capacity Reservation. Private API endpoint only: run terraform from
# inside the VPC (CI runner, bastion, VPN).
region       = "us-west-2"
cluster_name = "llmtrain-prod"

create_vpc                  = false
existing_vpc_id             = "vpc-0123456789abcdef0"
existing_private_subnet_ids = ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"]
existing_gpu_subnet_id      = "subnet-0aaaaaaaaaaaaaaaa" # the AZ of the Capacity Block / ODCR

endpoint_public_access = false
admin_principal_arns   = ["arn:aws:iam::111122223333:role/PlatformAdmin"]

gpu_node_groups = {
  p4de = {
    instance_type           = "p4de.24xlarge"
    capacity_type           = "CAPACITY_BLOCK"
    capacity_reservation_id = "cr-0123456789abcdef0"
    min_size                = 0
    desired_size            = 4
    max_size                = 4
  }
  p5 = {
    instance_type           = "p5.48xlarge"
    capacity_type           = "ON_DEMAND"
    capacity_reservation_id = "cr-0fedcba9876543210"
    min_size                = 0
    desired_size            = 0
    max_size                = 8
    root_volume_gib         = 1000
  }
}

bucket_name              = "llmtrain-prod-111122223333-us-west-2"
fsx_storage_capacity_gib = 9600
fsx_throughput_per_tib   = 500
