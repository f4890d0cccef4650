locals {
  bucket_name = coalesce(var.bucket_name, "${var.cluster_name}-${local.account_id}-${var.region}")
}

# Data shards and checkpoints. Lay keys out over many prefixes (S3 scales per prefix: ~3,500 PUT
# and 5,500 GET per second each), e.g. checkpoints/<job>/<attempt>/step-<n>/rank-<r>/...
resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_18:Server access logs of a training bucket are millions of GET lines per hour of data loading; audit object access with CloudTrail S3 data events on the account trail instead.
  #checkov:skip=CKV_AWS_144:Cross-region replication would double multi-TB checkpoint storage and PUT traffic; data is re-creatable and versioning plus lifecycle cover accidental overwrite/delete. Add replication in your own copy if your policy demands it.
  #checkov:skip=CKV2_AWS_62:FSx for Lustre auto-import configures this bucket's event notifications itself; an aws_s3_bucket_notification here would overwrite them and break the data repository association.
  bucket        = local.bucket_name
  force_destroy = var.bucket_force_destroy
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    object_ownership = "BucketOwnerEnforced" # ACLs off
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    bucket_key_enabled = true # one KMS call per object-key window, not per PUT of every shard
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  # Checkpoints are large and rewritten often; overwritten/deleted versions go after a grace period.
  rule {
    id     = "old-checkpoints"
    status = "Enabled"
    filter {
      prefix = var.checkpoint_prefix
    }
    noncurrent_version_expiration {
      noncurrent_days = var.checkpoint_noncurrent_days
    }
    dynamic "expiration" {
      for_each = var.checkpoint_expiration_days > 0 ? [1] : []
      content {
        days = var.checkpoint_expiration_days
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = "*"
      Action    = "s3:*"
      Resource  = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })

  depends_on = [aws_s3_bucket_public_access_block.this]
}
