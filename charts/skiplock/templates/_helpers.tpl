{{/* ---- generic helpers: names, labels, image ------------------------------------------------ */}}

{{- define "skiplock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skiplock.fullname" -}}
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

{{- define "skiplock.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels; call with (dict "root" $ "component" "worker"). */}}
{{- define "skiplock.labels" -}}
helm.sh/chart: {{ include "skiplock.chart" .root }}
{{ include "skiplock.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: skiplock
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "skiplock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skiplock.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "skiplock.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "skiplock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skiplock.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ---- database ------------------------------------------------------------------------------ */}}

{{/* The Secret and key holding the libpq URL. */}}
{{- define "skiplock.database.secretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else }}
{{- printf "%s-database" (include "skiplock.fullname" .) }}
{{- end }}
{{- end }}

{{- define "skiplock.database.secretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}url{{ end }}
{{- end }}

{{- define "skiplock.postgresql.fullname" -}}
{{- printf "%s-postgresql" (include "skiplock.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The dev Postgres password: the value, else the one already in the cluster, else a new one;
computed once per render, so the URL Secret and the Postgres Secret agree. */}}
{{- define "skiplock.postgresql.password" -}}
{{- $auth := .Values.postgresql.auth }}
{{- if $auth.password }}
{{- $auth.password }}
{{- else }}
{{- if not (hasKey $auth "generatedPassword") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "skiplock.postgresql.fullname" .) }}
{{- if and $existing $existing.data (index $existing.data "password") }}
{{- $_ := set $auth "generatedPassword" (index $existing.data "password" | b64dec) }}
{{- else }}
{{- $_ := set $auth "generatedPassword" (randAlphaNum 32) }}
{{- end }}
{{- end }}
{{- $auth.generatedPassword }}
{{- end }}
{{- end }}

{{/* ---- API tokens --------------------------------------------------------------------------- */}}

{{- define "skiplock.api.tokensSecretName" -}}
{{- printf "%s-api-tokens" (include "skiplock.fullname" .) }}
{{- end }}

{{/* True when the chart makes the admin token itself: auth on, and neither a Secret nor a token
list given. */}}
{{- define "skiplock.api.generatesToken" -}}
{{- $auth := .Values.api.auth }}
{{- if and .Values.api.enabled $auth.enabled (not $auth.existingSecret) (not $auth.tokens) }}true{{ end }}
{{- end }}

{{/* The generated admin token: the one already in the cluster, else a new one; computed once per
render, so the Secret and the API pods' checksum agree. Offline renders (helm template, lint)
have no cluster to look in and make a new one each time. */}}
{{- define "skiplock.api.generatedToken" -}}
{{- $auth := .Values.api.auth }}
{{- if not (hasKey $auth "generatedToken") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "skiplock.api.tokensSecretName" .) }}
{{- if and $existing $existing.data (index $existing.data "admin-token") }}
{{- $_ := set $auth "generatedToken" (index $existing.data "admin-token" | b64dec) }}
{{- else }}
{{- $_ := set $auth "generatedToken" (randAlphaNum 43) }}
{{- end }}
{{- end }}
{{- $auth.generatedToken }}
{{- end }}

{{/* ---- the console's session key ------------------------------------------------------------- */}}

{{/* The Secret holding SKIPLOCK_CONSOLE_SESSION_KEY: the one given, else the chart's own. */}}
{{- define "skiplock.api.consoleSecretName" -}}
{{- default (printf "%s-console-session" (include "skiplock.fullname" .)) .Values.api.console.existingSecret }}
{{- end }}

{{/* The generated session key: the one already in the cluster, else a new one, as the admin token
(a new one would end every console session at each upgrade); computed once per render. */}}
{{- define "skiplock.api.generatedSessionKey" -}}
{{- $console := .Values.api.console }}
{{- if not (hasKey $console "generatedKey") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "skiplock.api.consoleSecretName" .) }}
{{- if and $existing $existing.data (index $existing.data "session-key") }}
{{- $_ := set $console "generatedKey" (index $existing.data "session-key" | b64dec) }}
{{- else }}
{{- $_ := set $console "generatedKey" (randAlphaNum 43) }}
{{- end }}
{{- end }}
{{- $console.generatedKey }}
{{- end }}

{{/* ---- validation: relations a JSON schema cannot express ------------------------------------ */}}

{{- define "skiplock.validate" -}}
{{- $v := .Values }}
{{- $lease := $v.config.leaseSeconds }}
{{- if and (not $v.database.existingSecret) (not $v.database.url) (not $v.postgresql.enabled) }}
{{- fail "database: set database.existingSecret (recommended), database.url, or postgresql.enabled=true (trying skiplock out only)" }}
{{- end }}
{{- if and (or $v.database.existingSecret $v.database.url) $v.postgresql.enabled }}
{{- fail "database: database.existingSecret or database.url names a database, and postgresql.enabled (the default) would run the bundled Postgres beside it unused: set postgresql.enabled=false" }}
{{- end }}
{{- range $role := list "api" "worker" "scheduler" "dispatcher" }}
{{- $r := index $v $role }}
{{- if ge (float64 $r.shutdownGraceSeconds) (float64 $lease) }}
{{- fail (printf "%s.shutdownGraceSeconds (%v) must be < config.leaseSeconds (%v): a task still draining would be reclaimed and run twice" $role $r.shutdownGraceSeconds $lease) }}
{{- end }}
{{- if le (float64 $r.terminationGracePeriodSeconds) (float64 $lease) }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must be > config.leaseSeconds (%v)" $role $r.terminationGracePeriodSeconds $lease) }}
{{- end }}
{{- end }}
{{- if le (float64 $v.api.terminationGracePeriodSeconds) (addf $v.api.preStopSleepSeconds $v.api.shutdownGraceSeconds) }}
{{- fail (printf "api.terminationGracePeriodSeconds (%v) must be > api.preStopSleepSeconds + api.shutdownGraceSeconds (%v)" $v.api.terminationGracePeriodSeconds (addf $v.api.preStopSleepSeconds $v.api.shutdownGraceSeconds)) }}
{{- end }}
{{- $wh := $v.dispatcher.webhook }}
{{- if le (float64 $wh.leaseSeconds) (float64 $wh.timeoutSeconds) }}
{{- fail (printf "dispatcher.webhook.leaseSeconds (%v) must be > dispatcher.webhook.timeoutSeconds (%v)" $wh.leaseSeconds $wh.timeoutSeconds) }}
{{- end }}
{{- if le (float64 $wh.leaseSeconds) (float64 $v.dispatcher.shutdownGraceSeconds) }}
{{- fail (printf "dispatcher.webhook.leaseSeconds (%v) must be > dispatcher.shutdownGraceSeconds (%v)" $wh.leaseSeconds $v.dispatcher.shutdownGraceSeconds) }}
{{- end }}
{{- if le (float64 $v.dispatcher.terminationGracePeriodSeconds) (float64 $wh.leaseSeconds) }}
{{- fail (printf "dispatcher.terminationGracePeriodSeconds (%v) must be > dispatcher.webhook.leaseSeconds (%v)" $v.dispatcher.terminationGracePeriodSeconds $wh.leaseSeconds) }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled $v.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled: choose one (both would scrape every pod twice and double every rate)" }}
{{- end }}
{{- if and $v.api.enabled $v.api.ingress.enabled (not $v.api.auth.enabled) (not $v.api.auth.allowInsecure) }}
{{- fail "api.auth.enabled=false with api.ingress.enabled=true serves every request as admin behind the Ingress: enable auth, or set api.auth.allowInsecure=true if that is meant" }}
{{- end }}
{{- if and $v.worker.autoscaling.enabled $v.worker.keda.enabled }}
{{- fail "worker.autoscaling.enabled and worker.keda.enabled: choose one (KEDA makes its own HPA)" }}
{{- end }}
{{- if $v.worker.podDeletionCost.enabled }}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.name) }}
{{- fail "worker.podDeletionCost: the Role would be bound to the namespace's default ServiceAccount; set serviceAccount.create=true or serviceAccount.name" }}
{{- end }}
{{- if and $v.networkPolicy.enabled (not $v.networkPolicy.kubeApiEgress) }}
{{- fail "worker.podDeletionCost with networkPolicy.enabled: set networkPolicy.kubeApiEgress to the Kubernetes API server's endpoints ([{cidr, port}]), or the workers cannot patch their pods" }}
{{- end }}
{{- end }}
{{- if and (gt (int $v.worker.autoscaling.minReplicas) (int $v.worker.autoscaling.maxReplicas)) }}
{{- fail "worker.autoscaling.minReplicas must be <= maxReplicas" }}
{{- end }}
{{- if and (gt (int $v.worker.keda.minReplicas) (int $v.worker.keda.maxReplicas)) }}
{{- fail "worker.keda.minReplicas must be <= maxReplicas" }}
{{- end }}
{{- $limited := dict }}
{{- range $v.scheduler.limits }}
{{- if hasKey $limited .kind }}
{{- fail (printf "scheduler.limits: kind %s is limited more than once (the scheduler would refuse the file)" .kind) }}
{{- end }}
{{- $_ := set $limited .kind true }}
{{- end }}
{{- end }}

{{/* ---- pod pieces every skiplock role shares ------------------------------------------------ */}}

{{/* Pod securityContext: the restricted Pod Security Standard. */}}
{{- define "skiplock.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "skiplock.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Environment every role reads. Call with (dict "root" $ "grace" N). */}}
{{- define "skiplock.env" -}}
- name: SKIPLOCK_DATABASE_URL_FILE
  value: /etc/skiplock/database/url
- name: SKIPLOCK_DB_SCHEMA
  value: {{ .root.Values.database.schema | quote }}
- name: SKIPLOCK_LEASE_SECONDS
  value: {{ .root.Values.config.leaseSeconds | quote }}
- name: SKIPLOCK_SHUTDOWN_GRACE_SECONDS
  value: {{ .grace | quote }}
- name: SKIPLOCK_LOG_FORMAT
  value: {{ .root.Values.config.logFormat | quote }}
- name: SKIPLOCK_LOG_LEVEL
  value: {{ .root.Values.config.logLevel | quote }}
{{- with .root.Values.config.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "skiplock.volumeMounts" -}}
- name: database
  mountPath: /etc/skiplock/database
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "skiplock.volumes" -}}
- name: database
  secret:
    secretName: {{ include "skiplock.database.secretName" . }}
    items:
      - key: {{ include "skiplock.database.secretKey" . }}
        path: url
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end }}

{{/* Init container: wait until `skiplock migrate --check` says no migration is pending. */}}
{{- define "skiplock.waitForMigrations" -}}
- name: wait-for-migrations
  image: {{ include "skiplock.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - sh
    - -c
    - until skiplock migrate --check; do sleep {{ .Values.migrations.wait.intervalSeconds }}; done
  env:
    {{- include "skiplock.env" (dict "root" . "grace" 0) | nindent 4 }}
  volumeMounts:
    {{- include "skiplock.volumeMounts" . | nindent 4 }}
  securityContext:
    {{- include "skiplock.containerSecurityContext" . | nindent 4 }}
  resources:
    {{- toYaml .Values.migrations.wait.resources | nindent 4 }}
{{- end }}

{{/* Probes on a named port. Call with (dict "port" "metrics" "probes" .Values.worker.probes). */}}
{{- define "skiplock.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 2
  timeoutSeconds: {{ .probes.timeoutSeconds }}
  failureThreshold: {{ .probes.startupFailureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: {{ .probes.periodSeconds }}
  timeoutSeconds: {{ .probes.timeoutSeconds }}
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  periodSeconds: {{ .probes.periodSeconds }}
  timeoutSeconds: {{ .probes.timeoutSeconds }}
  failureThreshold: 3
{{- end }}

{{/* Scheduling fields of a role's pod spec. */}}
{{- define "skiplock.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Checksums of what the pods read from Secrets and ConfigMaps the chart renders. */}}
{{- define "skiplock.checksums" -}}
checksum/database: {{ include (print .Template.BasePath "/database/secret.yaml") . | sha256sum }}
{{- end }}
