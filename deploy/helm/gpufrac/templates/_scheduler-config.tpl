{{/* kube-scheduler's configuration: the gpufrac profile and the extender (scheduler-config.yaml). */}}
{{- define "gpufrac.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElect }}
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: gpufrac-scheduler
percentageOfNodesToScore: 100
profiles:
- schedulerName: {{ .Values.schedulerName }}
  {{- if .Values.extender.allocateClaims }}
  plugins:
    multiPoint:
      disabled:
      - name: DynamicResources
  {{- end }}
extenders:
- urlPrefix: {{ include "gpufrac.extenderURL" . | quote }}
  enableHTTPS: true
  tlsConfig:
    caFile: /etc/gpufrac-scheduler/tls/ca.crt
    certFile: /etc/gpufrac-scheduler/tls/tls.crt
    keyFile: /etc/gpufrac-scheduler/tls/tls.key
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  preemptVerb: preempt
  weight: {{ .Values.scheduler.weight }}
  nodeCacheCapable: true
  httpTimeout: {{ .Values.scheduler.httpTimeout }}
  ignorable: false
{{- end }}
