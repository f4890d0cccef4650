# The project's one instance catalog. GPU counts and EFA interface counts come from here and from
# nowhere else; the launch templates, the node labels and the outputs all read local.gpu_catalog.
# The path reaches outside this module on purpose: copy the module elsewhere and you must copy (or
# point catalog_path at) the catalog too, so the numbers can never drift apart.
locals {
  catalog_path = "${path.module}/../operator/llmtrain/data/instances.yaml"
  catalog      = yamldecode(file(local.catalog_path))

  # Only node types with GPUs and EFA are GPU node group candidates ("cpu" is for local runs).
  gpu_catalog = {
    for name, spec in local.catalog.instances : name => spec
    if spec.gpus_per_node > 0 && spec.efa_interfaces > 0
  }
}

# Per GPU node group: the catalog entry of its instance type, and the network interfaces its launch
# template declares. Kept here (no provider-backed references) so tests/infra can evaluate exactly
# these expressions with `terraform console` against the real catalog.
locals {
  gpu_groups = {
    for name, g in var.gpu_node_groups : name => merge(g, {
      known          = contains(keys(local.gpu_catalog), g.instance_type)
      gpus_per_node  = try(local.gpu_catalog[g.instance_type].gpus_per_node, 0)
      efa_interfaces = try(local.gpu_catalog[g.instance_type].efa_interfaces, 0)
    })
  }

  # One EFA interface per network card. The first (card 0, device 0) is the primary ENI and
  # carries the node's IP; the others sit at device index 1 on their own card. With
  # efa_only_secondary_interfaces they are "efa-only" (RDMA, no IP address).
  efa_network_interfaces = {
    for name, g in local.gpu_groups : name => [
      for i in range(g.efa_interfaces) : {
        network_card_index = i
        device_index       = i == 0 ? 0 : 1
        interface_type     = i == 0 || !var.efa_only_secondary_interfaces ? "efa" : "efa-only"
      }
    ]
  }
}
