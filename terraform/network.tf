locals {
  azs    = var.availability_zones
  gpu_az = var.gpu_availability_zone != null ? var.gpu_availability_zone : try(local.azs[0], null)

  vpc_id             = var.create_vpc ? aws_vpc.this[0].id : var.existing_vpc_id
  private_subnet_ids = var.create_vpc ? aws_subnet.private[*].id : var.existing_private_subnet_ids
  gpu_subnet_id      = var.create_vpc ? aws_subnet.private[try(index(local.azs, local.gpu_az), 0)].id : var.existing_gpu_subnet_id
}

resource "aws_vpc" "this" {
  count = var.create_vpc ? 1 : 0

  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true # FSx for Lustre and the EKS private endpoint resolve through VPC DNS

  tags = { Name = var.cluster_name }

  lifecycle {
    precondition {
      condition     = length(local.azs) >= 2 && alltrue([for az in local.azs : startswith(az, var.region)])
      error_message = "create_vpc needs availability_zones: 2-4 zones of var.region (pick the ones where your GPU capacity is)."
    }
    precondition {
      condition     = contains(local.azs, local.gpu_az)
      error_message = "gpu_availability_zone must be one of the VPC's availability zones."
    }
  }
}

# Lock the default security group down: nothing may use it by accident.
resource "aws_default_security_group" "this" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id
}

resource "aws_subnet" "public" {
  count = var.create_vpc ? length(local.azs) : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = local.azs[count.index]
  # /24s at the top of the range: public subnets only hold NAT gateways and load balancers.
  cidr_block = cidrsubnet(var.vpc_cidr, 8, 250 + count.index)

  tags = {
    Name                     = "${var.cluster_name}-public-${local.azs[count.index]}"
    "kubernetes.io/role/elb" = "1"
  }
}

resource "aws_subnet" "private" {
  count = var.create_vpc ? length(local.azs) : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = local.azs[count.index]
  # Large private subnets (/19 of a /16): every GPU node takes one IP per ENI plus pod IPs.
  cidr_block = cidrsubnet(var.vpc_cidr, 3, count.index)

  tags = {
    Name                              = "${var.cluster_name}-private-${local.azs[count.index]}"
    "kubernetes.io/role/internal-elb" = "1"
  }
}

resource "aws_internet_gateway" "this" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id
  tags   = { Name = var.cluster_name }
}

resource "aws_eip" "nat" {
  count  = var.create_vpc ? length(local.azs) : 0
  domain = "vpc"
  tags   = { Name = "${var.cluster_name}-nat-${local.azs[count.index]}" }
}

resource "aws_nat_gateway" "this" {
  count = var.create_vpc ? length(local.azs) : 0

  allocation_id = aws_eip.nat[count.index].id
  subnet_id     = aws_subnet.public[count.index].id
  tags          = { Name = "${var.cluster_name}-${local.azs[count.index]}" }

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route_table" "public" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }

  tags = { Name = "${var.cluster_name}-public" }
}

resource "aws_route_table_association" "public" {
  count          = var.create_vpc ? length(local.azs) : 0
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_route_table" "private" {
  count  = var.create_vpc ? length(local.azs) : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.this[count.index].id
  }

  tags = { Name = "${var.cluster_name}-private-${local.azs[count.index]}" }
}

resource "aws_route_table_association" "private" {
  count          = var.create_vpc ? length(local.azs) : 0
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[count.index].id
}

# S3 traffic (data shards, checkpoints) stays on the gateway endpoint: no NAT charges per GB.
resource "aws_vpc_endpoint" "s3" {
  count             = var.create_vpc ? 1 : 0
  vpc_id            = aws_vpc.this[0].id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = aws_route_table.private[*].id
  tags              = { Name = "${var.cluster_name}-s3" }
}

# VPC flow logs (rejected traffic is what you look at when NCCL cannot connect).
resource "aws_cloudwatch_log_group" "flow_logs" {
  count             = var.create_vpc ? 1 : 0
  name              = "/aws/vpc/${var.cluster_name}/flow-logs"
  retention_in_days = var.cluster_log_retention_days
  kms_key_id        = aws_kms_key.this.arn
}

resource "aws_iam_role" "flow_logs" {
  count = var.create_vpc ? 1 : 0
  name  = "${var.cluster_name}-vpc-flow-logs"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "vpc-flow-logs.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy" "flow_logs" {
  count = var.create_vpc ? 1 : 0
  name  = "write-flow-logs"
  role  = aws_iam_role.flow_logs[0].id

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect   = "Allow"
      Action   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
      Resource = "${aws_cloudwatch_log_group.flow_logs[0].arn}:*"
    }]
  })
}

resource "aws_flow_log" "this" {
  count                = var.create_vpc ? 1 : 0
  vpc_id               = aws_vpc.this[0].id
  traffic_type         = "REJECT"
  log_destination_type = "cloud-watch-logs"
  log_destination      = aws_cloudwatch_log_group.flow_logs[0].arn
  iam_role_arn         = aws_iam_role.flow_logs[0].arn
}
