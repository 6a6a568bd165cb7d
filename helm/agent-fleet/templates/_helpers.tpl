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
Container image reference: repository@digest, or repository:tag (tag defaults to appVersion).
*/}}
{{- define "agent-fleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
Worker scaling mode: "keda", "hpa" or "static".
*/}}
{{- define "agent-fleet.worker.scaling" -}}
{{- if .Values.worker.keda.enabled }}keda{{- else if .Values.worker.autoscaling.enabled }}hpa{{- else }}static{{- end }}
{{- end }}

{{/*
Pod annotations that roll the pods when configuration changes.
*/}}
{{- define "agent-fleet.configChecksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ toJson .Values.secrets | sha256sum }}
{{- end }}

{{/*
Environment shared by both containers: a secret key reference.
Usage: include "agent-fleet.secretEnv" (dict "ctx" $ "key" "FLEET_AMQP_URL" "optional" false)
*/}}
{{- define "agent-fleet.secretEnv" -}}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "agent-fleet.secretName" .ctx }}
      key: {{ .key }}
      {{- if .optional }}
      optional: true
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
