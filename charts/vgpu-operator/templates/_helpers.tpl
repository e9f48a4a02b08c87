{{/*
The namespace of the operator, the agent and their objects: namespaceOverride (as in
HAMi's chart), else the release's namespace.
*/}}
{{- define "vgpu-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/*
An image reference from {registry, repository, tag}: global.imageRegistry wins over the
image's own registry (as in HAMi's chart); the tag is the image's, else global.imageTag,
else the chart's appVersion. Call with (dict "image" .Values.x.image "root" .).
*/}}
{{- define "vgpu-operator.image" -}}
{{- $registry := .root.Values.global.imageRegistry | default .image.registry -}}
{{- $tag := .image.tag | default .root.Values.global.imageTag | default .root.Chart.AppVersion -}}
{{- if $registry -}}{{ $registry }}/{{- end -}}{{ .image.repository }}:{{ $tag }}
{{- end -}}

{{/*
imagePullSecrets from global.imagePullSecrets and the image's pullSecrets (names), or
nothing. Call with (dict "image" .Values.x.image "root" .).
*/}}
{{- define "vgpu-operator.pullSecrets" -}}
{{- $names := concat .root.Values.global.imagePullSecrets .image.pullSecrets | uniq -}}
{{- if $names }}
imagePullSecrets:
{{- range $names }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
The namespaces whose pods never reach the webhook: kube-system and the operator's own
(pods there must start without it), then scheduler.admissionWebhook.whitelistNamespaces.
*/}}
{{- define "vgpu-operator.webhookSkippedNamespaces" -}}
{{- $skipped := list "kube-system" (include "vgpu-operator.namespace" .) -}}
{{- concat $skipped .Values.scheduler.admissionWebhook.whitelistNamespaces | uniq | toJson -}}
{{- end -}}
