{{/* Common labels. */}}
{{- define "lace.labels" -}}
app.kubernetes.io/name: lace-cni
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "lace.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The API server address the node agent uses before pod networking (and so the kubernetes
Service) works. An explicit value wins; otherwise the default/kubernetes EndpointSlice is
looked up at install/upgrade time. `helm template` has no cluster: the lookup is empty and
the agent falls back to the in-cluster KUBERNETES_SERVICE_HOST the kubelet injects.
Result: "host:port" or "".
*/}}
{{- define "lace.apiserverAddress" -}}
{{- if .Values.node.apiserverAddress -}}
{{- .Values.node.apiserverAddress -}}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if and $slice $slice.endpoints $slice.ports -}}
{{- $ep := first $slice.endpoints -}}
{{- $addr := first $ep.addresses -}}
{{- $port := (first $slice.ports).port -}}
{{- if contains ":" $addr -}}[{{ $addr }}]:{{ $port }}{{- else -}}{{ $addr }}:{{ $port }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fail early on values the agent or controller would reject. */}}
{{- define "lace.validateValues" -}}
{{- $p := .Values.controller.srv6LocatorPrefix -}}
{{- if $p -}}
{{- if not (regexMatch "^[0-9a-fA-F:]+/[0-9]{1,3}$" $p) -}}
{{- fail (printf "controller.srv6LocatorPrefix: %q is not an IPv6 prefix like 2001:db8:100::/48" $p) -}}
{{- end -}}
{{- $len := atoi (last (splitList "/" $p)) -}}
{{- if gt $len 95 -}}
{{- fail (printf "controller.srv6LocatorPrefix: /%d leaves no bits for node locators (locators are /96: the last 32 bits are the SID function and arguments)" $len) -}}
{{- end -}}
{{- end -}}
{{- range $k := list "binDir" "confDir" -}}
{{- if not (hasPrefix "/" (get $.Values.cni $k)) -}}
{{- fail (printf "cni.%s: %q must be an absolute host path" $k (get $.Values.cni $k)) -}}
{{- end -}}
{{- end -}}
{{- if or (contains "/" .Values.cni.confName) (not (hasSuffix ".conflist" .Values.cni.confName)) -}}
{{- fail (printf "cni.confName: %q must be a file name ending in .conflist" .Values.cni.confName) -}}
{{- end -}}
{{- if not (hasPrefix "/sys/fs/cgroup" .Values.node.kubeletCgroupPath) -}}
{{- fail (printf "node.kubeletCgroupPath: %q must be a cgroup v2 path under /sys/fs/cgroup" .Values.node.kubeletCgroupPath) -}}
{{- end -}}
{{- end -}}
