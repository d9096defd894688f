{{- define "nodemedic.labels" -}}
app.kubernetes.io/name: nodemedic
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "nodemedic.controllerSelector" -}}
app.kubernetes.io/name: nodemedic
app.kubernetes.io/component: controller
{{- end }}

{{- define "nodemedic.controllerImage" -}}
{{ .Values.image.registry }}/{{ .Values.image.controller }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "nodemedic.agentImage" -}}
{{ .Values.image.registry }}/{{ .Values.image.agent }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
