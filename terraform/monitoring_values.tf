# Values for the monitoring charts, as locals (provider-free, so tests evaluate them with
# `terraform console` and compare them with charts/upstream-values/*.yaml, the tested reference).
locals {
  monitoring_node_selector = { "llmtrain.dev/node-pool" = "system" }

  kube_prometheus_stack_values = {
    prometheus = {
      prometheusSpec = {
        # Pick up the ServiceMonitors/PodMonitors/rules of other releases (llmtrain, DCGM).
        serviceMonitorSelectorNilUsesHelmValues = false
        podMonitorSelectorNilUsesHelmValues     = false
        ruleSelectorNilUsesHelmValues           = false
        retention                               = "15d"
        nodeSelector                            = local.monitoring_node_selector
      }
    }
    grafana = {
      nodeSelector = local.monitoring_node_selector
      # The sidecar settings llmtrain's dashboards ConfigMaps need (label + value, folder
      # annotation, folders from that annotation), as in charts/upstream-values/kube-prometheus-stack.yaml.
      sidecar = {
        dashboards = {
          enabled          = true
          label            = "grafana_dashboard"
          labelValue       = "1"
          searchNamespace  = "ALL"
          folderAnnotation = "grafana_folder"
          provider         = { foldersFromFilesStructure = true }
        }
      }
    }
  }

  dcgm_exporter_values = {
    nodeSelector = { "nvidia.com/gpu.present" = "true" }
    tolerations  = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
    serviceMonitor = {
      enabled  = true
      interval = "15s"
      # Keep the exporter's namespace/pod/container labels (the pod using the GPU) instead of
      # the exporter pod's own; with false Prometheus renames them exported_namespace/_pod and
      # LLMTrainJobGPUsIdle's (namespace, pod) join with the trainer's series finds nothing.
      honorLabels = true
    }
  }
}
