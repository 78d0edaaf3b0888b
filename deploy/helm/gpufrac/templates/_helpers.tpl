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

{{/* kube-scheduler's image: the tag defaults to the cluster's own release (major.minor.patch
of .Capabilities.KubeVersion, without a distribution's suffix such as -eks-... or +k3s1). */}}
{{- define "gpufrac.schedulerImage" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ .Values.scheduler.image.repository }}:{{ .Values.scheduler.image.tag | default (printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch) }}
{{- end }}

{{/* How kube-scheduler calls gpufrac. */}}
{{- define "gpufrac.extenderURL" -}}
{{- .Values.extender.url | default (printf "https://gpufrac-extender.%s.svc:%d" .Release.Namespace (int .Values.extender.port)) -}}
{{- end }}

{{/* The API server's address for clusters without the kubernetes Service (apiServer.host). */}}
{{- define "gpufrac.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- {name: KUBERNETES_SERVICE_HOST, value: {{ .Values.apiServer.host | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ .Values.apiServer.port | quote }}}
{{- end }}
{{- end }}

{{/* httpGet probes go to the pod IP; a server bound to another address is probed there. */}}
{{- define "gpufrac.probeHost" -}}
{{- if not (has .Values.listenAddress (list "0.0.0.0" "::")) }}
host: {{ .Values.listenAddress }}
{{- end }}
{{- end }}

{{/* What every pod of a component shares: pull secrets, host network, placement. Called with
(dict "root" $ "component" "extender" "values" .Values.extender). */}}
{{- define "gpufrac.podPlacement" -}}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- if .values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity: {{- toYaml .values.affinity | nindent 2 }}
{{- else if gt (int (.values.replicas | default 1)) 1 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/instance: {{ .root.Release.Name }}
            app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}
