{{/* The pod of the Deployment, or of each StatefulSet replica when sharded: the exporter
container, its files and where it runs. */}}
{{- define "pg-advisory-exporter.podTemplate" -}}
{{- $configKey := include "pg-advisory-exporter.configKey" . }}
{{- $ownConfig := not (or .Values.config.existingConfigMap .Values.config.existingSecret) }}
{{- if and .Values.config.existingConfigMap .Values.config.existingSecret }}
{{- fail "config: give existingConfigMap or existingSecret, not both" }}
{{- end -}}
metadata:
  labels:
    {{- include "pg-advisory-exporter.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if or $ownConfig .Values.podAnnotations }}
  annotations:
    {{- if $ownConfig }}
    {{- /* A changed configuration rolls the pods, which then read it at start. */}}
    checksum/config: {{ include "pg-advisory-exporter.configFile" . | sha256sum }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
spec:
  serviceAccountName: {{ include "pg-advisory-exporter.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.automountServiceAccountToken }}
  {{- with .Values.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: exporter
      image: {{ include "pg-advisory-exporter.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --config.file={{ include "pg-advisory-exporter.configDir" . }}/{{ $configKey }}
        - --web.listen-address=:{{ include "pg-advisory-exporter.port" . }}
        {{- if .Values.webConfig.existingSecret }}
        - --web.config.file={{ include "pg-advisory-exporter.webDir" . }}/{{ .Values.webConfig.key }}
        {{- end }}
        {{- with .Values.webExternalUrl }}
        - {{ printf "--web.external-url=%s" . | quote }}
        {{- end }}
        {{- if include "pg-advisory-exporter.sharded" . }}
        - --shard.total={{ .Values.sharding.shards }}
        {{- if eq .Values.sharding.indexFrom "hostname" }}
        - --shard.index=auto
        {{- else }}
        - --shard.index=$({{ include "pg-advisory-exporter.shardIndexVariable" . }})
        {{- end }}
        {{- end }}
        {{- with .Values.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $podIndex := and (include "pg-advisory-exporter.sharded" .) (eq .Values.sharding.indexFrom "podIndexLabel") }}
      {{- if or $podIndex .Values.extraEnv }}
      env:
        {{- if $podIndex }}
        {{- /* The StatefulSet controller labels each pod with its ordinal (Kubernetes 1.28+);
        the kubelet expands $(NAME) in args from the variables defined here. */}}
        - name: {{ include "pg-advisory-exporter.shardIndexVariable" . }}
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      ports:
        - name: http
          containerPort: {{ include "pg-advisory-exporter.port" . }}
          protocol: TCP
      livenessProbe:
        {{- include "pg-advisory-exporter.probe" (dict "root" . "probe" .Values.livenessProbe) | nindent 8 }}
      readinessProbe:
        {{- include "pg-advisory-exporter.probe" (dict "root" . "probe" .Values.readinessProbe) | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: {{ include "pg-advisory-exporter.configDir" . }}
          readOnly: true
        {{- if $ownConfig }}
        {{- range include "pg-advisory-exporter.passwordSecrets" . | fromJsonArray }}
        - name: {{ include "pg-advisory-exporter.passwordVolume" . }}
          mountPath: {{ include "pg-advisory-exporter.secretsDir" $ }}/{{ . }}
          readOnly: true
        {{- end }}
        {{- end }}
        {{- if .Values.webConfig.existingSecret }}
        - name: web-config
          mountPath: {{ include "pg-advisory-exporter.webDir" . }}
          readOnly: true
        {{- end }}
        {{- if .Values.serverLog.volume }}
        - name: server-log
          mountPath: {{ .Values.serverLog.mountPath }}
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    {{- with .Values.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumes:
    - name: config
      {{- if .Values.config.existingSecret }}
      secret:
        secretName: {{ .Values.config.existingSecret }}
        defaultMode: 288  # 0440: the owner and the pod's fsGroup
        optional: false
      {{- else }}
      configMap:
        name: {{ .Values.config.existingConfigMap | default (include "pg-advisory-exporter.fullname" .) }}
      {{- end }}
    {{- if $ownConfig }}
    {{- range $secret, $keys := include "pg-advisory-exporter.passwordSecretKeys" . | fromJson }}
    - name: {{ include "pg-advisory-exporter.passwordVolume" $secret }}
      secret:
        secretName: {{ $secret }}
        {{- /* Only the keys targets and poolers name, so no other entry of a shared Secret is mounted. */}}
        items:
          {{- range $keys }}
          - key: {{ . }}
            path: {{ . }}
          {{- end }}
        defaultMode: 288  # 0440: the owner and the pod's fsGroup
        {{- /* A Secret or key missing downs its target only (the exporter reads each password at
        every connect), and kubelet adds the file once it exists: no other target is blinded. */}}
        optional: true
    {{- end }}
    {{- end }}
    {{- with .Values.webConfig.existingSecret }}
    - name: web-config
      secret:
        secretName: {{ . }}
        defaultMode: 288  # 0440: the owner and the pod's fsGroup
        optional: false
    {{- end }}
    {{- with .Values.serverLog.volume }}
    - name: server-log
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
