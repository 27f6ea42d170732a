{{/* Names, labels and the pieces several templates share. */}}

{{- define "pg-advisory-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name alone when it already holds the chart's name, as the common charts do. */}}
{{- define "pg-advisory-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pg-advisory-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pg-advisory-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pg-advisory-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pg-advisory-exporter.labels" -}}
helm.sh/chart: {{ include "pg-advisory-exporter.chart" . }}
{{ include "pg-advisory-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ include "pg-advisory-exporter.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pg-advisory-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pg-advisory-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pg-advisory-exporter.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "pg-advisory-exporter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "pg-advisory-exporter.imageTag" .) }}
{{- end }}
{{- end }}

{{/* Where the container finds its files. */}}
{{- define "pg-advisory-exporter.configDir" -}}/etc/pg-advisory-exporter/config{{- end }}
{{- define "pg-advisory-exporter.secretsDir" -}}/etc/pg-advisory-exporter/secrets{{- end }}
{{- define "pg-advisory-exporter.webDir" -}}/etc/pg-advisory-exporter/web{{- end }}
{{- define "pg-advisory-exporter.port" -}}9846{{- end }}

{{/* The configuration file's key in the ConfigMap or Secret the pod mounts. */}}
{{- define "pg-advisory-exporter.configKey" -}}
{{- if or .Values.config.existingConfigMap .Values.config.existingSecret }}
{{- .Values.config.existingKey }}
{{- else -}}
config.yaml
{{- end }}
{{- end }}

{{/* A password written into a DSN would end up in a ConfigMap, readable by anyone who may
read the namespace's ConfigMaps: refuse it and say where it belongs. The patterns are the
ones the exporter redacts (config.py, _password_in), sslpassword= and ?password= included.
passwordIn prints "true" for a DSN that holds one, nothing otherwise. */}}
{{- define "pg-advisory-exporter.passwordIn" -}}
{{- if or (regexMatch "^[a-z]+://[^/@:]*:[^@/]*@" .) (regexMatch "password\\s*=" .) }}true{{ end }}
{{- end }}

{{- define "pg-advisory-exporter.checkDsn" -}}
{{- $target := . }}
{{- if include "pg-advisory-exporter.passwordIn" $target.dsn }}
{{- fail (printf "config.targets: target %q has a password in its DSN, which would be stored in a ConfigMap: give passwordSecret (an existing Secret's name and key) instead, or the whole file in config.existingSecret" $target.name) }}
{{- end }}
{{- end }}

{{/* A pooler (dict "target" and "pooler") as the exporter would take it (config.py,
PoolerConfig), said at install rather than when the pod starts: its admin console, with no
password in admin_dsn, or addresses and their pool_mode; and one password source. */}}
{{- define "pg-advisory-exporter.checkPooler" -}}
{{- $where := printf "config.targets: pooler %q of target %q" .pooler.name .target.name }}
{{- $pooler := .pooler }}
{{- if eq (hasKey $pooler "admin_dsn") (hasKey $pooler "addresses") }}
{{- fail (printf "%s: give exactly one of admin_dsn (its admin console) or addresses (with pool_mode)" $where) }}
{{- end }}
{{- if hasKey $pooler "admin_dsn" }}
{{- if include "pg-advisory-exporter.passwordIn" $pooler.admin_dsn }}
{{- fail (printf "%s has a password in its admin_dsn, which would be stored in a ConfigMap: give the pooler's passwordSecret (an existing Secret's name and key) instead, or the whole file in config.existingSecret" $where) }}
{{- end }}
{{- if hasKey $pooler "pool_mode" }}
{{- fail (printf "%s: pool_mode goes with addresses: the admin console says each pool's mode" $where) }}
{{- end }}
{{- if and $pooler.passwordSecret $pooler.password_file }}
{{- fail (printf "%s has both passwordSecret and password_file: give one" $where) }}
{{- end }}
{{- else }}
{{- if not $pooler.pool_mode }}
{{- fail (printf "%s: addresses need pool_mode (session, transaction or statement): the mode of the pools whose server connections come from them" $where) }}
{{- end }}
{{- if or (hasKey $pooler "passwordSecret") (hasKey $pooler "password_file") }}
{{- fail (printf "%s: passwordSecret and password_file go with admin_dsn: addresses need no password" $where) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secrets that targets and their poolers take passwords from: each Secret's name to
its distinct keys, sorted, so that a Secret is mounted once, holding only the keys named,
whatever the number of targets and poolers that share it. As JSON; ranging over the map
goes in the order of the names. */}}
{{- define "pg-advisory-exporter.passwordSecretKeys" -}}
{{- $secrets := dict }}
{{- range $target := .Values.config.targets }}
{{- $refs := list }}
{{- with $target.passwordSecret }}
{{- $refs = append $refs . }}
{{- end }}
{{- range $target.poolers }}
{{- with .passwordSecret }}
{{- $refs = append $refs . }}
{{- end }}
{{- end }}
{{- range $refs }}
{{- $_ := set $secrets .name (append (get $secrets .name | default list) .key | uniq | sortAlpha) }}
{{- end }}
{{- end }}
{{- range $module := .Values.config.auth_modules }}
{{- with $module.passwordSecret }}
{{- $_ := set $secrets .name (append (get $secrets .name | default list) .key | uniq | sortAlpha) }}
{{- end }}
{{- end }}
{{- $secrets | toJson }}
{{- end }}

{{/* The distinct Secrets that targets and poolers take their passwords from, sorted. */}}
{{- define "pg-advisory-exporter.passwordSecrets" -}}
{{- include "pg-advisory-exporter.passwordSecretKeys" . | fromJson | keys | sortAlpha | toJson }}
{{- end }}

{{/* A Secret's volume name: a DNS label whatever the Secret's name. */}}
{{- define "pg-advisory-exporter.passwordVolume" -}}
{{- printf "password-%s" (sha256sum . | trunc 10) }}
{{- end }}

{{/* The exporter's configuration file from .Values.config: the file's own keys, empty ones
left out, each target's and each pooler's passwordSecret turned into the password_file it is
mounted at. */}}
{{- define "pg-advisory-exporter.configFile" -}}
{{- $config := .Values.config }}
{{- $secretsDir := include "pg-advisory-exporter.secretsDir" . }}
{{- $file := dict }}
{{- range $key := list "log" "collection" "max_parallel_collections" "keys" "locks_page" "discovered_targets" }}
{{- $value := get $config $key }}
{{- if not (empty $value) }}
{{- $_ := set $file $key $value }}
{{- end }}
{{- end }}
{{- /* catalog: false is a value to keep, not an empty one to skip. */}}
{{- if hasKey $config "catalog" }}
{{- $_ := set $file "catalog" $config.catalog }}
{{- end }}
{{- if not (or $config.targets $config.auth_modules) }}
{{- fail "config.targets is empty: list the servers to watch, or give auth_modules for the servers that probes name, or the whole file in config.existingSecret or config.existingConfigMap" }}
{{- end }}
{{- $targets := list }}
{{- $names := dict }}
{{- range $config.targets }}
{{- if hasKey $names .name }}
{{- fail (printf "config.targets: the name %q is used twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- include "pg-advisory-exporter.checkDsn" . }}
{{- if and .passwordSecret .password_file }}
{{- fail (printf "config.targets: target %q has both passwordSecret and password_file: give one" .name) }}
{{- end }}
{{- $target := omit . "passwordSecret" "poolers" }}
{{- with .passwordSecret }}
{{- $_ := set $target "password_file" (printf "%s/%s/%s" $secretsDir .name .key) }}
{{- end }}
{{- if .poolers }}
{{- $poolers := list }}
{{- $poolerNames := dict }}
{{- $given := . }}
{{- range .poolers }}
{{- if hasKey $poolerNames .name }}
{{- fail (printf "config.targets: target %q names the pooler %q twice" $given.name .name) }}
{{- end }}
{{- $_ := set $poolerNames .name true }}
{{- include "pg-advisory-exporter.checkPooler" (dict "target" $given "pooler" .) }}
{{- $pooler := omit . "passwordSecret" }}
{{- with .passwordSecret }}
{{- $_ := set $pooler "password_file" (printf "%s/%s/%s" $secretsDir .name .key) }}
{{- end }}
{{- $poolers = append $poolers $pooler }}
{{- end }}
{{- $_ := set $target "poolers" $poolers }}
{{- end }}
{{- $targets = append $targets $target }}
{{- end }}
{{- if $targets }}
{{- $_ := set $file "targets" $targets }}
{{- end }}
{{- with $config.auth_modules }}
{{- $modules := dict }}
{{- range $name, $given := . }}
{{- if and $given.passwordSecret $given.password_file }}
{{- fail (printf "config.auth_modules: module %q has both passwordSecret and password_file: give one" $name) }}
{{- end }}
{{- $module := omit $given "passwordSecret" }}
{{- with $given.passwordSecret }}
{{- $_ := set $module "password_file" (printf "%s/%s/%s" $secretsDir .name .key) }}
{{- end }}
{{- $_ := set $modules $name $module }}
{{- end }}
{{- $_ := set $file "auth_modules" $modules }}
{{- end }}
{{- toYaml $file }}
{{- end }}

{{/* The target names of a multi-target monitor: its own list, else config.targets. */}}
{{- define "pg-advisory-exporter.monitorTargets" -}}
{{- $monitor := .monitor }}
{{- $values := .root.Values }}
{{- $names := $monitor.multipleTarget.targets }}
{{- if not $names }}
{{- if or $values.config.existingConfigMap $values.config.existingSecret }}
{{- fail (printf "%s.multipleTarget.targets: list the target names: the chart cannot read them from config.existingConfigMap or config.existingSecret" .key) }}
{{- end }}
{{- range $values.config.targets }}
{{- $names = append $names .name }}
{{- end }}
{{- if not $names }}
{{- fail (printf "%s.multipleTarget: config.targets is empty: probes of discovered targets are routed by Prometheus (docs/fleets.md), not by this monitor" .key) }}
{{- end }}
{{- end }}
{{- $names | toJson }}
{{- end }}

{{/* The scrape endpoints of a ServiceMonitor or PodMonitor: one for /metrics, or one per
target for /probe?target=NAME. Every endpoint sets `job` to prometheusJob, which
PgAdvisoryExporterDown matches: jobLabel cannot, since it copies a label's value from the
Service and the PodMonitor has no Service. In multi-target mode `target` is set too, so that
each endpoint's up and scrape_* series differ; honorLabels keeps the exporter's own `target`
label (the same name) on its series, where Prometheus would otherwise add exported_target. */}}
{{- define "pg-advisory-exporter.scrapeEndpoints" -}}
{{- $root := .root }}
{{- $monitor := .monitor }}
{{- $names := list "" }}
{{- if $monitor.multipleTarget.enabled }}
{{- $names = include "pg-advisory-exporter.monitorTargets" . | fromJsonArray }}
{{- end }}
{{- range $name := $names }}
- port: http
  {{- if $name }}
  path: /probe
  params:
    target:
      - {{ $name | quote }}
  honorLabels: true
  {{- else }}
  path: /metrics
  {{- end }}
  {{- with $monitor.interval }}
  interval: {{ . }}
  {{- end }}
  {{- with $monitor.timeout }}
  scrapeTimeout: {{ . }}
  {{- end }}
  {{- if $monitor.scheme }}
  scheme: {{ $monitor.scheme }}
  {{- else if $root.Values.webConfig.tls }}
  scheme: https
  {{- end }}
  {{- with $monitor.tlsConfig }}
  tlsConfig:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $monitor.basicAuth }}
  basicAuth:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  relabelings:
    - action: replace
      targetLabel: job
      replacement: {{ $root.Values.prometheusJob | quote }}
    {{- if $name }}
    - action: replace
      targetLabel: target
      replacement: {{ $name | quote }}
    {{- end }}
    {{- with $monitor.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $monitor.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* A probe from values, turned to HTTPS when the exporter serves TLS. */}}
{{- define "pg-advisory-exporter.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .root.Values.webConfig.tls $probe.httpGet }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/* "true" when the release is sharded (sharding.shards >= 2): a StatefulSet and a headless
Service instead of a Deployment and a ClusterIP Service; nothing otherwise. */}}
{{- define "pg-advisory-exporter.sharded" -}}
{{- if ge (int .Values.sharding.shards) 2 }}true{{ end }}
{{- end }}

{{/* The Service's name. The sharded one is headless and named apart, since a Service cannot
turn headless in place (its clusterIP is immutable): an upgrade replaces one with the other. */}}
{{- define "pg-advisory-exporter.serviceName" -}}
{{- $fullname := include "pg-advisory-exporter.fullname" . }}
{{- if include "pg-advisory-exporter.sharded" . }}
{{- printf "%s-headless" ($fullname | trunc 54 | trimSuffix "-") }}
{{- else }}
{{- $fullname }}
{{- end }}
{{- end }}

{{/* The variable that carries a shard's index from its pod-index label into --shard.index. */}}
{{- define "pg-advisory-exporter.shardIndexVariable" -}}SHARD_INDEX{{- end }}
