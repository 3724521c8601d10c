{{/*
Labels on every object: the same as config/base's kustomization adds (part-of), with Helm as the
manager instead of kustomize.
*/}}
{{- define "raygate.labels" -}}
app.kubernetes.io/part-of: raygate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "raygate.componentLabels" -}}
app.kubernetes.io/name: raygate
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "raygate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
Every raygate identity, the webhook configurations' exclusion and the default config name the
namespace raygate-system (raygate/core/keys.py SYSTEM_NAMESPACE), so the chart installs only there.
*/}}
{{- define "raygate.namespace" -}}
{{- if ne .Release.Namespace "raygate-system" -}}
{{- fail (printf "raygate installs into namespace raygate-system (its identities and the webhook exclusions are named there), not %q: use `helm install ... --namespace raygate-system`" .Release.Namespace) -}}
{{- end -}}
{{ .Release.Namespace }}
{{- end }}

{{/* The webhooks' namespaceSelector: the opt-in selector as matchExpressions, never kube-system or raygate-system. */}}
{{- define "raygate.namespaceSelector" -}}
{{- toYaml (.Values.namespaceSelector | default (dict "matchLabels" (dict "raygate.io/gang-admission" "enabled"))) }}
{{- end }}

{{- define "raygate.webhookNamespaceSelector" -}}
{{- $selector := include "raygate.namespaceSelector" . | fromYaml }}
matchExpressions:
{{- range $k, $v := $selector.matchLabels }}
  - key: {{ $k }}
    operator: In
    values: [{{ $v | quote }}]
{{- end }}
{{- range $selector.matchExpressions }}
  - {{- toYaml . | nindent 4 }}
{{- end }}
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: ["kube-system", "raygate-system"]
{{- end }}

{{- define "raygate.kuberayOperatorUser" -}}
system:serviceaccount:{{ .Values.kuberayOperator.serviceAccount.namespace }}:{{ .Values.kuberayOperator.serviceAccount.name }}
{{- end }}

{{/*
config.yaml: the config value, with the namespace selector and (when it is not raygate's default)
the KubeRay operator's identity filled in from their own values.
*/}}
{{- define "raygate.configYaml" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.namespaceSelector -}}
{{- $_ := set $config "namespaceSelector" .Values.namespaceSelector -}}
{{- end -}}
{{- $user := include "raygate.kuberayOperatorUser" . -}}
{{- if ne $user "system:serviceaccount:ray-system:kuberay-operator" -}}
{{- $_ := set $config "rayOperatorUsers" (list $user) -}}
{{- end -}}
{{ toYaml $config }}
{{- end }}

{{- define "raygate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
{{- end }}

{{- define "raygate.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
