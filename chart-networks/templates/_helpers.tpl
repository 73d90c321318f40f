{{- define "lace-networks.labels" -}}
app.kubernetes.io/name: lace-cni-networks
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
spec.subnets of a Network from its `subnet` and `prefix` values: one value each, or
comma-separated pairs for dual-stack ("10.244.0.0/18,fd00:10:244::/56" with "26,64").
Args: (list $key $networkValues)
*/}}
{{- define "lace-networks.subnets" -}}
{{- $key := index . 0 -}}
{{- $n := index . 1 -}}
{{- $cidrs := splitList "," (toString $n.subnet | nospace) | compact -}}
{{- $prefixes := splitList "," (toString $n.prefix | nospace) | compact -}}
{{- if not $cidrs -}}
{{- fail (printf "%s.subnet: empty; give one CIDR or an IPv4,IPv6 pair" $key) -}}
{{- end -}}
{{- if ne (len $cidrs) (len $prefixes) -}}
{{- fail (printf "%s.prefix: %q must give one block prefix length per subnet in %q" $key (toString $n.prefix) (toString $n.subnet)) -}}
{{- end -}}
subnets:
{{- range $i, $c := $cidrs }}
{{- $p := index $prefixes $i }}
{{- if not (regexMatch "^[0-9]{1,3}$" $p) }}
{{- fail (printf "%s.prefix: %q is not a prefix length" $key $p) }}
{{- end }}
  - cidr: {{ $c | quote }}
    blockPrefix: {{ $p }}
{{- end }}
{{- end -}}

{{- define "lace-networks.priority" -}}
{{- $key := index . 0 -}}
{{- $p := int (index . 1).priority -}}
{{- if or (lt $p 0) (gt $p 1000) -}}
{{- fail (printf "%s.priority: %d is outside 0..1000" $key $p) -}}
{{- end -}}
{{- $p -}}
{{- end -}}
