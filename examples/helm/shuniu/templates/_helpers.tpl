{{- define "shuniu.labels" -}}
app.kubernetes.io/part-of: shuniu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shuniu.redisUrl" -}}
{{- if .Values.redis.url -}}{{ .Values.redis.url }}{{- else if .Values.redis.enabled -}}redis://{{ .Release.Name }}-redis:6379{{- end -}}
{{- end -}}
