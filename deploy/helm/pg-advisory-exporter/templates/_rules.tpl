{{- /*
How prometheusrule.yaml writes a threshold, as exporter/rules.py writes it for
`pg-advisory-exporter rules`: a duration is seconds (900) or in Prometheus' grammar ("15m",
"1m30s", "500ms", "1w"), the same forms the command's --set takes (values.schema.json
refuses others), and is written as exporter/schema.py's format_duration writes it.
*/ -}}

{{- /* A duration in whole milliseconds. */ -}}
{{- define "pg-advisory-exporter.rules.milliseconds" -}}
{{- $text := toString . -}}
{{- $ms := 0.0 -}}
{{- /* A number as it is: as text, Go writes 1209600 (two weeks) as 1.2096e+06. */ -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- $ms = mulf . 1000 -}}
{{- else if regexMatch `^[0-9]+(\.[0-9]+)?$` $text -}}
{{- $ms = mulf (float64 $text) 1000 -}}
{{- else -}}
{{- $sizes := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- range regexFindAll `[0-9]+(ms|s|m|h|d|w|y)` $text -1 -}}
{{- $unit := regexFind `(ms|s|m|h|d|w|y)$` . -}}
{{- $ms = addf $ms (mulf (float64 (trimSuffix $unit .)) (get $sizes $unit)) -}}
{{- end -}}
{{- end -}}
{{- round $ms 0 | int64 -}}
{{- end -}}

{{- /* Seconds, for PromQL: 900, 0.5. */ -}}
{{- define "pg-advisory-exporter.rules.seconds" -}}
{{- divf (include "pg-advisory-exporter.rules.milliseconds" . | int64) 1000 -}}
{{- end -}}

{{- /* As Prometheus writes a duration: 15m, 1h30m, 500ms; years and weeks only whole (2w,
not 1w3d, which is 10d). */ -}}
{{- define "pg-advisory-exporter.rules.duration" -}}
{{- $ms := include "pg-advisory-exporter.rules.milliseconds" . | int64 -}}
{{- if eq $ms 0 }}0s{{ end -}}
{{- range list (list "y" 31536000000) (list "w" 604800000) -}}
{{- $size := index . 1 | int64 -}}
{{- if and (gt $ms 0) (eq (mod $ms $size) 0) }}{{ div $ms $size }}{{ index . 0 }}{{ $ms = 0 }}{{ end -}}
{{- end -}}
{{- range list (list "d" 86400000) (list "h" 3600000) (list "m" 60000) (list "s" 1000) -}}
{{- $size := index . 1 | int64 -}}
{{- if ge $ms $size }}{{ div $ms $size }}{{ index . 0 }}{{ $ms = mod $ms $size }}{{ end -}}
{{- end -}}
{{- if gt $ms 0 }}{{ $ms }}ms{{ end -}}
{{- end -}}

{{- /* A share as a percentage: 60%. */ -}}
{{- define "pg-advisory-exporter.rules.percent" -}}
{{- round (mulf (float64 .) 100) 0 | int64 }}%
{{- end -}}
