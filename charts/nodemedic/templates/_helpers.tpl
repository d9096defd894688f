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
{{- if .Values.image.digests.controller -}}
{{ .Values.image.registry }}/{{ .Values.image.controller }}@{{ .Values.image.digests.controller }}
{{- else -}}
{{ .Values.image.registry }}/{{ .Values.image.controller }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{- define "nodemedic.agentImage" -}}
{{- if .Values.image.digests.agent -}}
{{ .Values.image.registry }}/{{ .Values.image.agent }}@{{ .Values.image.digests.agent }}
{{- else -}}
{{ .Values.image.registry }}/{{ .Values.image.agent }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}
