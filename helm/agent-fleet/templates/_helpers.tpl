{{/*
Chart name, truncated to the 63 characters a label value may hold.
*/}}
{{- define "agent-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. Truncated to 52 characters so that suffixes such as
"-dispatcher" still fit in 63.
*/}}
{{- define "agent-fleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, as used by the helm.sh/chart label.
*/}}
{{- define "agent-fleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: only name, instance and component (immutable on Deployments).
Usage: include "agent-fleet.selectorLabels" (dict "ctx" $ "component" "worker")
*/}}
{{- define "agent-fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-fleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Standard labels for every resource.
Usage: include "agent-fleet.labels" (dict "ctx" $ "component" "worker")
*/}}
{{- define "agent-fleet.labels" -}}
helm.sh/chart: {{ include "agent-fleet.chart" .ctx }}
{{ include "agent-fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: agent-fleet
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Component resource names.
*/}}
{{- define "agent-fleet.dispatcher.fullname" -}}
{{- printf "%s-dispatcher" (include "agent-fleet.fullname" .) }}
{{- end }}

{{- define "agent-fleet.worker.fullname" -}}
{{- printf "%s-worker" (include "agent-fleet.fullname" .) }}
{{- end }}

{{- define "agent-fleet.configMapName" -}}
{{- printf "%s-config" (include "agent-fleet.fullname" .) }}
{{- end }}

{{/*
Name of the Secret with FLEET_* secrets: the pre-made one or the chart's.
*/}}
{{- define "agent-fleet.secretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else }}
{{- include "agent-fleet.fullname" . }}
{{- end }}
{{- end }}

{{- define "agent-fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agent-fleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference: [registry/]repository@digest, or [registry/]repository:tag (tag defaults
to appVersion). The registry is global.imageRegistry, else the image's own registry.
Usage: include "agent-fleet.imageRef" (dict "ctx" $ "image" .Values.image)
*/}}
{{- define "agent-fleet.imageRef" -}}
{{- $registry := default .image.registry (.ctx.Values.global | default dict).imageRegistry }}
{{- $repo := ternary (printf "%s/%s" (trimSuffix "/" $registry) .image.repository) .image.repository (ne (toString $registry) "") }}
{{- if .image.digest }}
{{- printf "%s@%s" $repo .image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion .image.tag | toString) }}
{{- end }}
{{- end }}

{{- define "agent-fleet.image" -}}
{{- include "agent-fleet.imageRef" (dict "ctx" . "image" .Values.image) }}
{{- end }}

{{/*
imagePullSecrets of every pod: global.imagePullSecrets then imagePullSecrets.
*/}}
{{- define "agent-fleet.imagePullSecrets" -}}
{{- $all := concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) }}
{{- with $all }}
imagePullSecrets:
  {{- toYaml (uniq .) | nindent 2 }}
{{- end }}
{{- end }}

{{/*
metadata.annotations of a resource: commonAnnotations merged with the resource's own.
Usage: include "agent-fleet.annotations" (dict "ctx" $ "extra" .Values.x.annotations) | nindent 2
*/}}
{{- define "agent-fleet.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (deepCopy (.ctx.Values.commonAnnotations | default dict)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Worker scaling mode: "keda", "hpa" or "static".
*/}}
{{- define "agent-fleet.worker.scaling" -}}
{{- if .Values.worker.keda.enabled }}keda{{- else if .Values.worker.autoscaling.enabled }}hpa{{- else }}static{{- end }}
{{- end }}

{{/*
The secret variables each process reads, in order.
*/}}
{{- define "agent-fleet.secretKeys" -}}
{{- if eq . "dispatcher" -}}
FLEET_API_TOKENS FLEET_SECRETS_KEY FLEET_AMQP_URL FLEET_REDIS_URL
{{- else -}}
FLEET_SECRETS_KEY FLEET_AMQP_URL FLEET_REDIS_URL FLEET_LLM_API_KEY
{{- end }}
{{- end }}

{{/*
Where a secret variable comes from, as YAML {name, key}: the chart's Secret (same key), or with
secrets.existingSecret the key that secrets.existingSecretKeys maps it to: a string (a key in
existingSecret) or {name, key} (a key in another Secret; name defaults to existingSecret).
Usage: include "agent-fleet.secretRef" (dict "ctx" $ "key" "FLEET_AMQP_URL") | fromYaml
*/}}
{{- define "agent-fleet.secretRef" -}}
{{- $s := .ctx.Values.secrets }}
{{- if $s.existingSecret }}
{{- $m := get ($s.existingSecretKeys | default dict) .key | default .key }}
{{- if kindIs "map" $m }}
name: {{ default $s.existingSecret $m.name | quote }}
key: {{ required (printf "secrets.existingSecretKeys.%s.key is required" .key) $m.key | quote }}
{{- else }}
name: {{ $s.existingSecret | quote }}
key: {{ $m | quote }}
{{- end }}
{{- else }}
name: {{ include "agent-fleet.fullname" .ctx | quote }}
key: {{ .key | quote }}
{{- end }}
{{- end }}

{{/*
Names of the Secrets a process reads, comma-separated (for Reloader's annotation).
Usage: include "agent-fleet.secretNames" (dict "ctx" $ "component" "worker")
*/}}
{{- define "agent-fleet.secretNames" -}}
{{- $names := list }}
{{- range $key := splitList " " (include "agent-fleet.secretKeys" .component) }}
{{- $names = append $names (include "agent-fleet.secretRef" (dict "ctx" $.ctx "key" $key) | fromYaml).name }}
{{- end }}
{{- $names | uniq | join "," }}
{{- end }}

{{/*
The data of the chart's own Secret (base64 values) as JSON, computed once per render so the Secret
and the pods' checksum agree even for generated values. Generated values are kept: a live Secret's
FLEET_API_TOKENS / FLEET_SECRETS_KEY win over new random ones. FLEET_SECRETS_KEY is never generated
where it could be lost: rendering without a cluster (helm template, --dry-run=client, GitOps
tools) or upgrading a release whose Secret is gone fails unless secrets.secretsKey is given.
*/}}
{{- define "agent-fleet.secretData" -}}
{{- if not (hasKey . "agentFleetSecretData") }}
{{- $s := .Values.secrets }}
{{- $name := include "agent-fleet.fullname" . }}
{{- $live := (lookup "v1" "Secret" .Release.Namespace $name) | default dict }}
{{- $liveData := (get $live "data") | default dict }}
{{- /* Listing Secrets answers with a (possibly empty) list in a cluster and {} without one. */}}
{{- $connected := not (empty (lookup "v1" "Secret" .Release.Namespace "")) }}
{{- $data := dict }}
{{- $_ := set $data "FLEET_AMQP_URL" (required "secrets.amqpUrl is required: the amqp(s):// URL of your RabbitMQ with a user of its own (RabbitMQ's guest user only logs in over loopback), or set secrets.existingSecret" $s.amqpUrl | b64enc) }}
{{- $_ := set $data "FLEET_REDIS_URL" (required "secrets.redisUrl is required (or set secrets.existingSecret)" $s.redisUrl | b64enc) }}
{{- if $s.apiTokens }}
{{- $_ := set $data "FLEET_API_TOKENS" (join "," $s.apiTokens | b64enc) }}
{{- else if hasKey $liveData "FLEET_API_TOKENS" }}
{{- $_ := set $data "FLEET_API_TOKENS" (get $liveData "FLEET_API_TOKENS") }}
{{- else }}
{{- $_ := set $data "FLEET_API_TOKENS" (randAlphaNum 40 | b64enc) }}
{{- end }}
{{- if $s.secretsKey }}
{{- $_ := set $data "FLEET_SECRETS_KEY" ($s.secretsKey | b64enc) }}
{{- else if hasKey $liveData "FLEET_SECRETS_KEY" }}
{{- $_ := set $data "FLEET_SECRETS_KEY" (get $liveData "FLEET_SECRETS_KEY") }}
{{- else if not $connected }}
{{- fail "secrets.secretsKey is required when rendering without a cluster (helm template, --dry-run=client, GitOps): a key generated here would differ on every render and make stored tool/webhook secrets unreadable. Set it (openssl rand -hex 32) or use secrets.existingSecret." }}
{{- else if .Release.IsUpgrade }}
{{- fail (printf "Secret %s/%s with FLEET_SECRETS_KEY is gone; a new key would make stored tool/webhook secrets unreadable. Set secrets.secretsKey to the key in use (or use secrets.existingSecret)." .Release.Namespace $name) }}
{{- else }}
{{- /* 64 hex digits = 32 random bytes */}}
{{- $_ := set $data "FLEET_SECRETS_KEY" (randAlphaNum 64 | sha256sum | b64enc) }}
{{- end }}
{{- with $s.llmApiKey }}
{{- $_ := set $data "FLEET_LLM_API_KEY" (. | b64enc) }}
{{- end }}
{{- $_ := set . "agentFleetSecretData" $data }}
{{- end }}
{{- get . "agentFleetSecretData" | toJson }}
{{- end }}

{{/*
Checksum of the secret values a process gets, so that pods roll when they change: the chart's
Secret data, or the live values of the referenced keys of external Secrets (read with lookup at
install/upgrade time; a Secret rotated between upgrades needs Reloader, see reloader.enabled).
Usage: include "agent-fleet.secretChecksum" (dict "ctx" $ "component" "worker")
*/}}
{{- define "agent-fleet.secretChecksum" -}}
{{- if .ctx.Values.secrets.existingSecret }}
{{- $parts := list }}
{{- range $key := splitList " " (include "agent-fleet.secretKeys" .component) }}
{{- $ref := include "agent-fleet.secretRef" (dict "ctx" $.ctx "key" $key) | fromYaml }}
{{- $live := (lookup "v1" "Secret" $.ctx.Release.Namespace $ref.name) | default dict }}
{{- $parts = append $parts (printf "%s=%s/%s:%s" $key $ref.name $ref.key (get ((get $live "data") | default dict) $ref.key | default "")) }}
{{- end }}
{{- join "\n" $parts | sha256sum }}
{{- else }}
{{- include "agent-fleet.secretData" .ctx | sha256sum }}
{{- end }}
{{- end }}

{{/*
Pod annotations that roll the pods when configuration changes.
Usage: include "agent-fleet.configChecksums" (dict "ctx" $ "component" "worker")
*/}}
{{- define "agent-fleet.configChecksums" -}}
checksum/config: {{ include (print .ctx.Template.BasePath "/configmap.yaml") .ctx | sha256sum }}
checksum/secret: {{ include "agent-fleet.secretChecksum" . }}
{{- end }}

{{/*
Deployment annotations: Reloader (https://github.com/stakater/Reloader) restarts the pods when a
Secret they read changes outside Helm.
Usage: include "agent-fleet.workloadAnnotations" (dict "ctx" $ "component" "worker") | nindent 2
*/}}
{{- define "agent-fleet.workloadAnnotations" -}}
{{- $extra := dict }}
{{- if .ctx.Values.reloader.enabled }}
{{- $_ := set $extra "secret.reloader.stakater.com/reload" (include "agent-fleet.secretNames" .) }}
{{- end }}
{{- include "agent-fleet.annotations" (dict "ctx" .ctx "extra" $extra) }}
{{- end }}

{{/*
Environment shared by both containers: a secret key reference.
Usage: include "agent-fleet.secretEnv" (dict "ctx" $ "key" "FLEET_AMQP_URL" "optional" false)
*/}}
{{- define "agent-fleet.secretEnv" -}}
{{- $ref := include "agent-fleet.secretRef" . | fromYaml }}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/*
Extra container settings, shared list first, then the component's: env, envFrom, volumeMounts.
Usage: include "agent-fleet.extraList" (dict "shared" .Values.extraEnv "own" $w.extraEnv) | nindent 12
*/}}
{{- define "agent-fleet.extraList" -}}
{{- with concat (.shared | default list) (.own | default list) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Startup probe (when enabled): GET /healthz on the named port.
Usage: include "agent-fleet.startupProbe" (dict "probe" $w.startupProbe "port" "metrics") | nindent 10
*/}}
{{- define "agent-fleet.startupProbe" -}}
{{- if .probe.enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  {{- toYaml (omit .probe "enabled") | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Topology spread constraints with the component's selector filled in when missing.
Usage: include "agent-fleet.topologySpread" (dict "ctx" $ "component" "worker" "constraints" .Values.worker.topologySpreadConstraints)
*/}}
{{- define "agent-fleet.topologySpread" -}}
{{- range .constraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "agent-fleet.selectorLabels" (dict "ctx" $.ctx "component" $.component) | fromYaml)) }}
{{- end }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}

{{/*
Name of the work queue for a job kind: <prefix>.work.<kind>.
Usage: include "agent-fleet.workQueue" (dict "ctx" $ "kind" "tool_calls")
*/}}
{{- define "agent-fleet.workQueue" -}}
{{- printf "%s.work.%s" .ctx.Values.config.topologyPrefix .kind }}
{{- end }}

{{/*
TLS settings (both containers): environment, volume mounts and volumes for the private CA bundle
and the client certificate named in .Values.tls. Each renders nothing when TLS values are unset.
*/}}
{{- define "agent-fleet.tlsEnv" -}}
{{- $t := .Values.tls }}
- name: FLEET_TLS_NATIVE_ROOTS
  value: {{ $t.nativeRoots | toString | quote }}
{{- if or $t.ca.secretName $t.ca.configMapName }}
- name: FLEET_TLS_CA_FILE
  value: /etc/fleet/tls/ca/ca.pem
{{- end }}
{{- if $t.clientCertSecret }}
- name: FLEET_TLS_CLIENT_CERT_FILE
  value: /etc/fleet/tls/client/tls.crt
- name: FLEET_TLS_CLIENT_KEY_FILE
  value: /etc/fleet/tls/client/tls.key
{{- end }}
{{- end }}

{{- define "agent-fleet.tlsVolumeMounts" -}}
{{- $t := .Values.tls }}
{{- if or $t.ca.secretName $t.ca.configMapName }}
- name: tls-ca
  mountPath: /etc/fleet/tls/ca
  readOnly: true
{{- end }}
{{- if $t.clientCertSecret }}
- name: tls-client
  mountPath: /etc/fleet/tls/client
  readOnly: true
{{- end }}
{{- end }}

{{- define "agent-fleet.tlsVolumes" -}}
{{- $t := .Values.tls }}
{{- if $t.ca.secretName }}
- name: tls-ca
  secret:
    secretName: {{ $t.ca.secretName }}
    items:
      - key: {{ $t.ca.key }}
        path: ca.pem
{{- else if $t.ca.configMapName }}
- name: tls-ca
  configMap:
    name: {{ $t.ca.configMapName }}
    items:
      - key: {{ $t.ca.key }}
        path: ca.pem
{{- end }}
{{- if $t.clientCertSecret }}
- name: tls-client
  secret:
    secretName: {{ $t.clientCertSecret }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}

{{/*
The topology prefix as a regex (its dots matched literally).
*/}}
{{- define "agent-fleet.queuePrefixRegex" -}}
{{- .Values.config.topologyPrefix | replace "." "[.]" }}
{{- end }}

{{/*
The `job` label values of this release's series, as YAML {dispatcher, worker}: monitoring.jobLabels,
else the Service names (the chart's ServiceMonitors leave Prometheus Operator's default, job = the
Service name).
*/}}
{{- define "agent-fleet.monitoringJobs" -}}
{{- $j := .Values.monitoring.jobLabels | default dict }}
dispatcher: {{ default (include "agent-fleet.dispatcher.fullname" .) $j.dispatcher | quote }}
worker: {{ default (include "agent-fleet.worker.fullname" .) $j.worker | quote }}
{{- end }}

{{/*
The ConfigMap holding the knowledge base's services catalog: the chart's (from
dispatcher.servicesCatalog.services) or the operator's (configMapName); empty: none.
*/}}
{{- define "agent-fleet.servicesCatalogConfigMap" -}}
{{- $c := .Values.dispatcher.servicesCatalog }}
{{- if $c.services }}
{{- printf "%s-services-catalog" (include "agent-fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $c.configMapName }}
{{- end }}
{{- end }}
