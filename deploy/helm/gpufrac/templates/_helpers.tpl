{{/* Common labels. */}}
{{- define "gpufrac.labels" -}}
app.kubernetes.io/name: gpufrac
app.kubernetes.io/part-of: gpufrac
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The gpufrac image reference. */}}
{{- define "gpufrac.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The agent image reference. */}}
{{- define "gpufrac.agentImage" -}}
{{ .Values.image.agentRepository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The extender's service account as the API server names it (admission policies). */}}
{{- define "gpufrac.extenderUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpufrac-extender
{{- end }}
