{{/*
Helpers of the kproxy chart.

Every helper below needs only .Values (this chart's values) and .Release, so
another chart that depends on this one can call the sidecar templates with
  (dict "Values" .Values.kproxy "Release" .Release)
where .Values.kproxy holds this chart's values (its defaults merged in by Helm).
*/}}

{{- define "kproxy.name" -}}
{{- default "kproxy" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kproxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "kproxy.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kproxy.configMapName" -}}
{{- printf "%s-config" (include "kproxy.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ConfigMap of the rules directory: rules.existingConfigMap, else <fullname>-rules. */}}
{{- define "kproxy.rulesConfigMapName" -}}
{{- if .Values.rules.existingConfigMap -}}
{{- .Values.rules.existingConfigMap -}}
{{- else -}}
{{- printf "%s-rules" (include "kproxy.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kproxy.rulesDir" -}}/etc/kproxy-rules{{- end -}}

{{- define "kproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kproxy.labels" -}}
helm.sh/chart: {{ include "kproxy.chart" . }}
{{ include "kproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kproxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Relabeling of a ServiceMonitor / PodMonitor endpoint: the job label is monitoringJob
whatever the Service or pod is called, so alerts and dashboards work for any release.
*/}}
{{- define "kproxy.jobRelabeling" -}}
- action: replace
  targetLabel: job
  replacement: {{ required "kproxy: monitoringJob is required" .Values.monitoringJob | quote }}
{{- end -}}

{{/* repository@digest when image.digest is set (immutable), else repository:tag. */}}
{{- define "kproxy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (required "kproxy: image.tag is required" .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "host:port", with IPv6 hosts in brackets. Argument: (list host port). */}}
{{- define "kproxy.hostPort" -}}
{{- $host := index . 0 -}}
{{- $port := int (index . 1) -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host $port -}}
{{- else -}}
{{- printf "%s:%d" $host $port -}}
{{- end -}}
{{- end -}}

{{- define "kproxy.isSidecar" -}}
{{- if eq .Values.mode "sidecar" -}}true{{- end -}}
{{- end -}}

{{- define "kproxy.listenHost" -}}
{{- if .Values.kproxy.listenHost -}}
{{- .Values.kproxy.listenHost -}}
{{- else if include "kproxy.isSidecar" . -}}
127.0.0.1
{{- else -}}
0.0.0.0
{{- end -}}
{{- end -}}

{{- define "kproxy.advertisedHost" -}}
{{- if .Values.kproxy.advertisedHost -}}
{{- .Values.kproxy.advertisedHost -}}
{{- else if include "kproxy.isSidecar" . -}}
127.0.0.1
{{- else -}}
{{- printf "%s.%s.svc.%s" (include "kproxy.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{/*
The broker listeners as a YAML list of {nodeId, name, port}: brokerPortBase + id
for every id of brokerNodeIds, or the pinned port of brokerPorts; pinned brokers
not in brokerNodeIds are listed too.
*/}}
{{- define "kproxy.brokers" -}}
{{- $v := .Values.kproxy -}}
{{- $pins := $v.brokerPorts | default dict -}}
{{- $ids := list -}}
{{- range $v.brokerNodeIds -}}
{{- $ids = append $ids (int .) -}}
{{- end -}}
{{- range $id, $_ := $pins -}}
{{- if not (has (int $id) $ids) -}}
{{- $ids = append $ids (int $id) -}}
{{- end -}}
{{- end -}}
{{- $out := list -}}
{{- range $id := $ids -}}
{{- if lt $id 0 -}}
{{- fail (printf "kproxy: broker node ids are >= 0, got %d" $id) -}}
{{- end -}}
{{- $port := add (int $v.brokerPortBase) $id -}}
{{- if hasKey $pins (toString $id) -}}
{{- $port = int (get $pins (toString $id)) -}}
{{- end -}}
{{- if gt (int $port) 65535 -}}
{{- fail (printf "kproxy: broker %d would listen on port %d (brokerPortBase + id): pin it in kproxy.brokerPorts" $id (int $port)) -}}
{{- end -}}
{{- $out = append $out (dict "nodeId" $id "name" (printf "broker-%d" $id) "port" (int $port)) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Refuses values kproxy or Kubernetes would refuse later, with the reason. */}}
{{- define "kproxy.validate" -}}
{{- $v := .Values.kproxy -}}
{{- if not (has .Values.mode (list "standalone" "sidecar")) -}}
{{- fail (printf "kproxy: mode must be standalone or sidecar, got %q" (toString .Values.mode)) -}}
{{- end -}}
{{- if not (or $v.upstream $v.clusters) -}}
{{- fail "kproxy: kproxy.upstream needs at least one HOST:PORT" -}}
{{- end -}}
{{- if and $v.clusters (not (include "kproxy.isSidecar" .)) -}}
{{- fail "kproxy: kproxy.clusters is for mode: sidecar (the chart renders one Service, for one cluster)" -}}
{{- end -}}
{{- $ports := list (int $v.bootstrapPort) (int $v.metricsPort) -}}
{{- if .Values.admin.enabled -}}
{{- $ports = append $ports (int .Values.admin.port) -}}
{{- end -}}
{{- range (include "kproxy.brokers" . | fromYamlArray) -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- range $ports -}}
{{- if or (lt . 1) (gt . 65535) -}}
{{- fail (printf "kproxy: port %d is not between 1 and 65535" .) -}}
{{- end -}}
{{- end -}}
{{- if ne (len $ports) (len (uniq $ports)) -}}
{{- fail (printf "kproxy: the bootstrap, metrics, admin and broker ports must all differ, got %v" $ports) -}}
{{- end -}}
{{- with .Values.tls.client -}}
{{- if and .enabled (not .secretName) -}}
{{- fail "kproxy: tls.client.enabled needs tls.client.secretName" -}}
{{- end -}}
{{- if and .enabled .requireClientCert (not .clientCAKey) -}}
{{- fail "kproxy: tls.client.requireClientCert needs tls.client.clientCAKey" -}}
{{- end -}}
{{- end -}}
{{- with .Values.tls.upstream -}}
{{- if and .enabled (ne (empty .certKey) (empty .keyKey)) -}}
{{- fail "kproxy: tls.upstream.certKey and tls.upstream.keyKey go together" -}}
{{- end -}}
{{- if and .enabled .certKey (not .secretName) -}}
{{- fail "kproxy: tls.upstream.certKey needs tls.upstream.secretName" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.rules.enabled .Values.rules.files .Values.rules.existingConfigMap -}}
{{- fail "kproxy: rules.files and rules.existingConfigMap exclude each other (the rules come from one ConfigMap)" -}}
{{- end -}}
{{- with .Values.sasl.upstream -}}
{{- if and .mechanism (not .secretName) -}}
{{- fail "kproxy: sasl.upstream.mechanism needs sasl.upstream.secretName (the Secret holding the password or token, mounted as files)" -}}
{{- end -}}
{{- if and .mechanism (ne .mechanism "OAUTHBEARER") (not .username) -}}
{{- fail (printf "kproxy: sasl.upstream.mechanism %s needs sasl.upstream.username" .mechanism) -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.sasl.client.mode "terminate") (not .Values.sasl.client.credentialsSecret) -}}
{{- fail "kproxy: sasl.client.mode terminate needs sasl.client.credentialsSecret (a Secret holding the file `kproxy credentials add` writes)" -}}
{{- end -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- if le (float64 .Values.terminationGracePeriodSeconds) (addf (float64 .Values.preStopSleepSeconds) (float64 ($v.limits.shutdown_grace | default 30))) -}}
{{- fail "kproxy: terminationGracePeriodSeconds must exceed preStopSleepSeconds + kproxy.limits.shutdown_grace" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Seconds the pod may take to stop: the preStop sleep, then kproxy's own drain
(limits.shutdown_grace), plus a margin, unless set. Charts running kproxy as a
sidecar should give their pod at least this much.
*/}}
{{- define "kproxy.terminationGracePeriodSeconds" -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add (int .Values.preStopSleepSeconds) (ceil (.Values.kproxy.limits.shutdown_grace | default 30 | float64)) 10 -}}
{{- end -}}
{{- end -}}

{{- define "kproxy.tlsClientDir" -}}/etc/kproxy-tls/client{{- end -}}
{{- define "kproxy.saslUpstreamDir" -}}/etc/kproxy-sasl/upstream{{- end -}}
{{- define "kproxy.saslClientDir" -}}/etc/kproxy-sasl/client{{- end -}}
{{- define "kproxy.saslClient" -}}{{- if eq .Values.sasl.client.mode "terminate" -}}true{{- end -}}{{- end -}}
{{- define "kproxy.tlsUpstreamDir" -}}/etc/kproxy-tls/upstream{{- end -}}

{{/* kproxy.yaml, the file `kproxy run --config` reads. */}}
{{- define "kproxy.config" -}}
{{- $v := .Values.kproxy -}}
{{- $cfg := dict -}}
{{- if $v.clusters -}}
{{- /* several clusters (docs/CLUSTERS.md): each its own upstream and ports, on listenHost */ -}}
{{- $clusters := dict -}}
{{- range $v.clusters -}}
{{- $one := dict "upstream" .upstream "listen" (include "kproxy.hostPort" (list (include "kproxy.listenHost" $) .bootstrapPort)) "advertised_host" (include "kproxy.advertisedHost" $) "broker_port_base" (int .brokerPortBase) -}}
{{- if .brokerPortCount -}}
{{- $_ := set $one "broker_port_count" (int .brokerPortCount) -}}
{{- end -}}
{{- $_ := set $clusters .name $one -}}
{{- end -}}
{{- $_ := set $cfg "clusters" $clusters -}}
{{- else -}}
{{- $_ := set $cfg "upstream" $v.upstream -}}
{{- $_ := set $cfg "listen" (include "kproxy.hostPort" (list (include "kproxy.listenHost" .) $v.bootstrapPort)) -}}
{{- $_ := set $cfg "advertised_host" (include "kproxy.advertisedHost" .) -}}
{{- $_ := set $cfg "broker_port_base" (int $v.brokerPortBase) -}}
{{- if $v.brokerPorts -}}
{{- $pins := dict -}}
{{- range $id, $port := $v.brokerPorts -}}
{{- $_ := set $pins (toString $id) (int $port) -}}
{{- end -}}
{{- $_ := set $cfg "broker_ports" $pins -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cfg "metrics_listen" (printf "0.0.0.0:%d" (int $v.metricsPort)) -}}
{{- $_ := set $cfg "log_level" $v.logLevel -}}
{{- if .Values.rules.enabled -}}
{{- $_ := set $cfg "rules" (include "kproxy.rulesDir" .) -}}
{{- end -}}
{{- if .Values.admin.enabled -}}
{{- /* loopback, whatever listenHost is: kproxy refuses any other address without a token */ -}}
{{- $_ := set $cfg "admin" (dict "listen" (printf "127.0.0.1:%d" (int .Values.admin.port))) -}}
{{- end -}}
{{- $_ := set $cfg "limits" (deepCopy ($v.limits | default dict)) -}}
{{- $_ := set $cfg "metrics" (deepCopy ($v.metrics | default dict)) -}}
{{- $tls := dict -}}
{{- with .Values.tls.client -}}
{{- if .enabled -}}
{{- $dir := include "kproxy.tlsClientDir" . -}}
{{- $client := dict "cert" (printf "%s/%s" $dir .certKey) "key" (printf "%s/%s" $dir .keyKey) -}}
{{- if .clientCAKey -}}
{{- $_ := set $client "client_ca" (printf "%s/%s" $dir .clientCAKey) -}}
{{- end -}}
{{- $_ := set $client "require_client_cert" (.requireClientCert | default false) -}}
{{- $_ := set $tls "client" $client -}}
{{- end -}}
{{- end -}}
{{- with .Values.tls.upstream -}}
{{- if .enabled -}}
{{- $dir := include "kproxy.tlsUpstreamDir" . -}}
{{- $upstream := dict "enabled" true "verify" (ne (toString .verify) "false") -}}
{{- if and .secretName .caKey -}}
{{- $_ := set $upstream "ca" (printf "%s/%s" $dir .caKey) -}}
{{- end -}}
{{- if .certKey -}}
{{- $_ := set $upstream "cert" (printf "%s/%s" $dir .certKey) -}}
{{- $_ := set $upstream "key" (printf "%s/%s" $dir .keyKey) -}}
{{- end -}}
{{- if .serverName -}}
{{- $_ := set $upstream "server_name" .serverName -}}
{{- end -}}
{{- $_ := set $tls "upstream" $upstream -}}
{{- end -}}
{{- end -}}
{{- if $tls -}}
{{- $_ := set $cfg "tls" $tls -}}
{{- end -}}
{{- $sasl := dict -}}
{{- with .Values.sasl.upstream -}}
{{- if .mechanism -}}
{{- $dir := include "kproxy.saslUpstreamDir" . -}}
{{- $upstream := dict "mechanism" .mechanism -}}
{{- if eq .mechanism "OAUTHBEARER" -}}
{{- $_ := set $upstream "token_file" (printf "%s/%s" $dir .tokenKey) -}}
{{- else -}}
{{- $_ := set $upstream "username" .username -}}
{{- $_ := set $upstream "password_file" (printf "%s/%s" $dir .passwordKey) -}}
{{- end -}}
{{- $_ := set $sasl "upstream" $upstream -}}
{{- end -}}
{{- end -}}
{{- if include "kproxy.saslClient" . -}}
{{- with .Values.sasl.client -}}
{{- $client := dict "mode" "terminate" "mechanisms" .mechanisms -}}
{{- $_ := set $client "credentials_file" (printf "%s/%s" (include "kproxy.saslClientDir" .) .credentialsKey) -}}
{{- $_ := set $client "session_lifetime" (.sessionLifetimeSeconds | default 0) -}}
{{- $_ := set $sasl "client" $client -}}
{{- end -}}
{{- end -}}
{{- if $sasl -}}
{{- $_ := set $cfg "sasl" $sasl -}}
{{- end -}}
{{- $cfg = mergeOverwrite $cfg (deepCopy ($v.extraConfig | default dict)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Volumes kproxy's container mounts (names prefixed, to share a pod with an app). */}}
{{- define "kproxy.volumes" -}}
- name: kproxy-config
  configMap:
    name: {{ include "kproxy.configMapName" . }}
{{- if .Values.rules.enabled }}
- name: kproxy-rules
  configMap:
    name: {{ include "kproxy.rulesConfigMapName" . }}
{{- end }}
{{- if .Values.tls.client.enabled }}
- name: kproxy-tls-client
  secret:
    secretName: {{ .Values.tls.client.secretName }}
{{- end }}
{{- if and .Values.tls.upstream.enabled .Values.tls.upstream.secretName }}
- name: kproxy-tls-upstream
  secret:
    secretName: {{ .Values.tls.upstream.secretName }}
{{- end }}
{{- if .Values.sasl.upstream.mechanism }}
# Readable by the pod's fsGroup (kproxy's group in this chart's podSecurityContext), no one else.
- name: kproxy-sasl-upstream
  secret:
    secretName: {{ .Values.sasl.upstream.secretName }}
    defaultMode: 0440
{{- end }}
{{- if include "kproxy.saslClient" . }}
- name: kproxy-sasl-client
  secret:
    secretName: {{ .Values.sasl.client.credentialsSecret }}
    defaultMode: 0440
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
kproxy's container, as a mapping. In standalone mode it publishes every
listener; as a sidecar only its metrics port (the listeners are on loopback).
*/}}
{{- define "kproxy.container" -}}
{{- include "kproxy.validate" . -}}
{{- $v := .Values.kproxy -}}
{{- $sidecar := include "kproxy.isSidecar" . -}}
name: kproxy
image: {{ include "kproxy.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- if and $sidecar .Values.sidecar.native }}
restartPolicy: Always
{{- end }}
args:
  - run
  - --config
  - /etc/kproxy/kproxy.yaml
  {{- range $v.extraArgs }}
  - {{ . | quote }}
  {{- end }}
ports:
{{- if not $sidecar }}
  - name: bootstrap
    containerPort: {{ int $v.bootstrapPort }}
    protocol: TCP
  {{- range (include "kproxy.brokers" . | fromYamlArray) }}
  - name: {{ .name }}
    containerPort: {{ int .port }}
    protocol: TCP
  {{- end }}
{{- end }}
  - name: {{ ternary "kproxy-metrics" "metrics" (not (empty $sidecar)) }}
    containerPort: {{ int $v.metricsPort }}
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: {{ int $v.metricsPort }}
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ int $v.metricsPort }}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ int $v.metricsPort }}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- if gt (int .Values.preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ int .Values.preStopSleepSeconds }}"]
{{- end }}
{{- with .Values.extraEnv }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: kproxy-config
    mountPath: /etc/kproxy
    readOnly: true
  {{- if .Values.rules.enabled }}
  # The whole ConfigMap as a directory, never a subPath: kubelet updates a directory mount in
  # place (a symlink flip kproxy watches for); a subPath mount would never change.
  - name: kproxy-rules
    mountPath: {{ include "kproxy.rulesDir" . }}
    readOnly: true
  {{- end }}
  {{- if .Values.tls.client.enabled }}
  - name: kproxy-tls-client
    mountPath: {{ include "kproxy.tlsClientDir" . }}
    readOnly: true
  {{- end }}
  {{- if and .Values.tls.upstream.enabled .Values.tls.upstream.secretName }}
  - name: kproxy-tls-upstream
    mountPath: {{ include "kproxy.tlsUpstreamDir" . }}
    readOnly: true
  {{- end }}
  {{- /* Whole Secrets as directories, never a subPath: the kubelet updates only those in place. */}}
  {{- if .Values.sasl.upstream.mechanism }}
  - name: kproxy-sasl-upstream
    mountPath: {{ include "kproxy.saslUpstreamDir" . }}
    readOnly: true
  {{- end }}
  {{- if include "kproxy.saslClient" . }}
  - name: kproxy-sasl-client
    mountPath: {{ include "kproxy.saslClientDir" . }}
    readOnly: true
  {{- end }}
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The sidecar: one list item for another chart's pod spec, under containers (or
under initContainers with sidecar.native: true), plus its volumes:

  containers:
    - name: app
      ...
    {{- include "kproxy.sidecar" (dict "Values" .Values.kproxy "Release" .Release) | nindent 4 }}
  volumes:
    {{- include "kproxy.sidecar.volumes" (dict "Values" .Values.kproxy "Release" .Release) | nindent 4 }}

with this chart as a dependency whose values set mode: sidecar (it then renders
only the ConfigMap the sidecar mounts).
*/}}
{{- define "kproxy.sidecar" -}}
{{- if not (include "kproxy.isSidecar" .) -}}
{{- fail "kproxy: the kproxy.sidecar template needs this chart's values to set mode: sidecar" -}}
{{- end -}}
- {{ include "kproxy.container" . | nindent 2 | trim }}
{{- end -}}

{{- define "kproxy.sidecar.volumes" -}}
{{- include "kproxy.volumes" . -}}
{{- end -}}
