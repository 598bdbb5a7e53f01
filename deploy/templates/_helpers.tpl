{{/* Names, labels and the checks every render runs first. */}}

{{- define "toolkit.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "toolkit.selectorLabels" -}}
app.kubernetes.io/name: toolkit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "toolkit.labels" -}}
app.kubernetes.io/name: toolkit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "toolkit.eppName" -}}
{{- printf "%s-epp" (include "toolkit.fullname" .) -}}
{{- end -}}

{{- define "toolkit.eppSelectorLabels" -}}
app.kubernetes.io/name: toolkit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "toolkit.claimName" -}}
{{- .Values.storage.existingClaim | default (printf "%s-models" (include "toolkit.fullname" .)) -}}
{{- end -}}

{{/* The repository's folder in the pods (and the build Job). */}}
{{- define "toolkit.repositoryPath" -}}
{{- if .Values.model.repositoryPath -}}
{{- .Values.model.repositoryPath -}}
{{- else -}}
{{- printf "%s/%s/%s/repository" (trimSuffix "/" .Values.storage.mountPath) .Release.Name .Values.model.fingerprint -}}
{{- end -}}
{{- end -}}

{{- define "toolkit.engineDir" -}}
{{- printf "%s/%s/%s/engines" (trimSuffix "/" .Values.storage.mountPath) .Release.Name .Values.model.fingerprint -}}
{{- end -}}

{{- define "toolkit.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* The GPU product label values the replicas need: gpu.products, else the cluster's gpu.targets entry. */}}
{{- define "toolkit.gpuProducts" -}}
{{- toJson (.Values.gpu.products | default (get .Values.gpu.targets .Values.model.target) | default list) -}}
{{- end -}}

{{- define "toolkit.isGpu" -}}
{{- if not (has .Values.model.target (list "cpu" "synthetic")) }}true{{ end -}}
{{- end -}}

{{/* The triton container's startup probe fails for good at its failureThreshold-th failure,
(threshold - 1) periods after the first probe: only after `toolkit serve --ready-timeout` has run out
and toolkit serve has stopped tritonserver (10 s) and printed why, with the log's tail (kubectl logs
--previous), plus its checks before tritonserver starts: startup.timeoutSeconds + 30 s. */}}
{{- define "toolkit.startupFailureThreshold" -}}
{{- add1 (div (add .Values.startup.timeoutSeconds 30 .Values.startup.periodSeconds -1) .Values.startup.periodSeconds) -}}
{{- end -}}

{{/* Seconds a triton container that failed its startup or liveness probe gets before SIGKILL: a hung
or never-ready Triton has nothing to drain, and its GPUs are held until it is gone (the pod's grace
period, the drain's, applies to deletions only). toolkit serve stops tritonserver within 10 s. */}}
{{- define "toolkit.probeKillGraceSeconds" -}}
30
{{- end -}}

{{/* One Job per fingerprint: a Job's pod template cannot change, so a rebuild of another repository
(applied without helm's hooks, e.g. helm template | kubectl apply) gets a new name. */}}
{{- define "toolkit.buildJobName" -}}
{{- printf "%s-build-%s" (include "toolkit.fullname" .) (trunc 8 .Values.model.fingerprint) -}}
{{- end -}}

{{/* Where the repository is: the claim and the path in it (the fingerprint says what it is, not where). */}}
{{- define "toolkit.repositoryLocation" -}}
{{- printf "%s:%s" (include "toolkit.claimName" .) (include "toolkit.repositoryPath" .) -}}
{{- end -}}

{{/* "true" when this install or upgrade must run the build Job, empty when the cluster shows this
repository built where the replicas will look for it: the release's Deployment serves it from there,
or the last build Job of it wrote it there. A hook Job needs a free GPU even to find its work done; on
a full cluster it would hold up every upgrade. Always built: when the chart's own claim is not in the
cluster (a new volume is empty), and when build.rerun is a value the last Job did not run with.
Takes root and what the cluster holds (lookup: an empty map under helm template, which so renders
the Job): deployment, job, claim. */}}
{{- define "toolkit.buildNeeded" -}}
{{- $fingerprint := .root.Values.model.fingerprint -}}
{{- $location := include "toolkit.repositoryLocation" .root -}}
{{- $deployment := .deployment | default dict -}}
{{- $job := .job | default dict -}}
{{- $served := and (eq (dig "metadata" "annotations" "toolkit/fingerprint" "" $deployment) $fingerprint) (eq (dig "metadata" "annotations" "toolkit/repository-location" "" $deployment) $location) -}}
{{- $built := and (eq (dig "metadata" "annotations" "toolkit/fingerprint" "" $job) $fingerprint) (eq (dig "metadata" "annotations" "toolkit/repository-location" "" $job) $location) (gt (int (dig "status" "succeeded" 0 $job)) 0) -}}
{{- $newClaim := and (not .root.Values.storage.existingClaim) (not .claim) -}}
{{- $rerun := toString (.root.Values.build.rerun | default "") -}}
{{- $rerunNew := and $rerun (ne (dig "metadata" "annotations" "toolkit/build-rerun" "" $job) $rerun) -}}
{{- if or $newClaim $rerunNew (not (or $served $built)) -}}
true
{{- end -}}
{{- end -}}

{{/* inferencePool or service, after resolving auto against the cluster's APIs. */}}
{{- define "toolkit.routingMode" -}}
{{- $hasPool := .Capabilities.APIVersions.Has "inference.networking.k8s.io/v1/InferencePool" -}}
{{- if eq .Values.routing.mode "auto" -}}
{{- ternary "inferencePool" "service" $hasPool -}}
{{- else if and (eq .Values.routing.mode "inferencePool") (not $hasPool) -}}
{{- fail "routing.mode=inferencePool, but the cluster has no inference.networking.k8s.io/v1 InferencePool: install the Gateway API Inference Extension CRDs, or set routing.mode=service (with helm template: --api-versions inference.networking.k8s.io/v1/InferencePool)" -}}
{{- else -}}
{{- .Values.routing.mode -}}
{{- end -}}
{{- end -}}

{{/* Node affinity for the GPU product the engines were built for, merged with the user's affinity. */}}
{{- define "toolkit.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- $products := include "toolkit.gpuProducts" . | fromJsonArray -}}
{{- if and (include "toolkit.isGpu" .) $products -}}
{{- $term := dict "matchExpressions" (list (dict "key" .Values.gpu.productLabel "operator" "In" "values" $products)) -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default list -}}
{{- if $terms -}}
{{- fail "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution is set; the chart adds the GPU product term itself: use nodeSelector for extra node constraints" -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" (list $term) -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}
affinity:
  {{- toYaml $affinity | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The triton container's exec probe: Triton's HTTP health on the pod's loopback, where an httpGet probe cannot reach. */}}
{{- define "toolkit.tritonProbe" -}}
exec:
  command: ["python3", "-m", "toolkit.deploy.probe", {{ printf "http://127.0.0.1:%v%s" .root.Values.ports.tritonHttp .path | quote }}]
{{- end -}}

{{/* Refuse values that cannot run where asked; every message names the value and the fix. */}}
{{- define "toolkit.checks" -}}
{{- $v := .Values -}}
{{- if not $v.model.fingerprint -}}
{{- fail "model.fingerprint is empty: render the values with `toolkit deploy --repo DIR -o OUT` and install with -f OUT/values.yaml" -}}
{{- end -}}
{{- if not $v.model.target -}}
{{- fail "model.target is empty: render the values with `toolkit deploy --repo DIR -o OUT`" -}}
{{- end -}}
{{- if or (not $v.image.repository) (not $v.image.tag) -}}
{{- fail "image.repository and image.tag must name the toolkit image (deploy/image/Dockerfile.*): pass toolkit deploy --image REGISTRY/toolkit, or set image.repository" -}}
{{- end -}}
{{- if include "toolkit.isGpu" . -}}
{{- if ne (int $v.gpu.count) (int $v.model.worldSize) -}}
{{- fail (printf "gpu.count=%v, but the %s engines have %v ranks (tensor x pipeline parallel): set gpu.count to %v" $v.gpu.count $v.model.target $v.model.worldSize $v.model.worldSize) -}}
{{- end -}}
{{- if not (include "toolkit.gpuProducts" . | fromJsonArray) -}}
{{- if $v.gpu.targets -}}
{{- fail (printf "the engines were built for %s, and gpu.targets names only %s: deploy where %s GPUs are, or add gpu.targets.%s" $v.model.target (keys $v.gpu.targets | sortAlpha | join ", ") $v.model.target $v.model.target) -}}
{{- end -}}
{{- fail (printf "gpu.products is empty: name the %s label values of the GPU the %s engines were built for" $v.gpu.productLabel $v.model.target) -}}
{{- end -}}
{{- $base := $v.model.tritonImage | required "model.tritonImage is empty: render the values with toolkit deploy" -}}
{{- $baseTag := last (splitList ":" $base) -}}
{{- if not (contains $baseTag $v.image.tag) -}}
{{- fail (printf "image.tag %q is not built on %s: the engines only load in TensorRT-LLM %s; build the image with deploy/image/Dockerfile.gpu --build-arg BASE_IMAGE=%s and tag it <version>-%s" $v.image.tag $base $v.model.trtllmVersion $base $baseTag) -}}
{{- end -}}
{{- else -}}
{{- if gt (int $v.gpu.count) 0 -}}
{{- fail (printf "gpu.count=%v for a %s repository, which runs on CPU: set gpu.count=0, or build for a GPU target" $v.gpu.count $v.model.target) -}}
{{- end -}}
{{- if $v.gpu.products -}}
{{- fail (printf "gpu.products is set for a %s repository, which runs on CPU: remove it, or build for a GPU target" $v.model.target) -}}
{{- end -}}
{{- end -}}
{{- if and $v.api.auth.enabled (not $v.api.auth.existingSecret) -}}
{{- fail "api.auth.existingSecret is empty: create the keys Secret (kubectl create secret generic NAME --from-file=keys=FILE) and set it, or set api.auth.enabled=false to serve without keys" -}}
{{- end -}}
{{- $leastGrace := add $v.drain.preStopSeconds $v.drain.timeoutSeconds 5 -}}
{{- if lt (int $v.drain.terminationGracePeriodSeconds) (int $leastGrace) -}}
{{- fail (printf "drain.terminationGracePeriodSeconds=%v is shorter than drain.preStopSeconds + drain.timeoutSeconds + the 5 s toolkit serve waits past Triton's drain (%v): set it to at least %v, or render the values again with toolkit deploy --drain-timeout" $v.drain.terminationGracePeriodSeconds $leastGrace $leastGrace) -}}
{{- end -}}
{{- if lt (int $v.strategy.progressDeadlineSeconds) (int $v.startup.timeoutSeconds) -}}
{{- fail (printf "strategy.progressDeadlineSeconds=%v is shorter than startup.timeoutSeconds (%v): a rollout would be reported stalled while its replicas still load; set it to at least %v plus the image pull, or render the values again with toolkit deploy" $v.strategy.progressDeadlineSeconds $v.startup.timeoutSeconds $v.startup.timeoutSeconds) -}}
{{- end -}}
{{- if and $v.build.enabled (not $v.build.args) -}}
{{- fail "build.enabled=true but build.args is empty: render the values with toolkit deploy, or set build.enabled=false and put the repository on the volume yourself" -}}
{{- end -}}
{{- if and $v.build.enabled $v.model.repositoryPath -}}
{{- fail "model.repositoryPath is set while build.enabled=true: the build Job writes <mountPath>/<release>/<fingerprint>/repository; leave repositoryPath empty, or set build.enabled=false" -}}
{{- end -}}
{{- if and $v.model.repositoryPath (not (hasPrefix (printf "%s/" (trimSuffix "/" $v.storage.mountPath)) $v.model.repositoryPath)) -}}
{{- fail (printf "model.repositoryPath %s is not on the volume mounted at storage.mountPath %s: the pods would not find it" $v.model.repositoryPath $v.storage.mountPath) -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- if not (.Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject") -}}
{{- fail "autoscaling.enabled=true, but the cluster has no keda.sh/v1alpha1 ScaledObject: install KEDA, or set autoscaling.enabled=false (with helm template: --api-versions keda.sh/v1alpha1/ScaledObject)" -}}
{{- end -}}
{{- if not $v.monitoring.podMonitor.enabled -}}
{{- fail "autoscaling reads Triton's metrics from Prometheus, which scrapes them through the PodMonitor: set monitoring.podMonitor.enabled=true" -}}
{{- end -}}
{{- if $v.autoscaling.clusterChecks -}}
{{- with include "toolkit.kedaProblem" (dict "crd" (include "toolkit.kedaCrd" . | fromJson)) -}}
{{- fail . -}}
{{- end -}}
{{- end -}}
{{- if or (lt (int $v.autoscaling.minReplicas) 1) (lt (int $v.autoscaling.maxReplicas) (int $v.autoscaling.minReplicas)) -}}
{{- fail (printf "autoscaling needs 1 <= minReplicas <= maxReplicas, got %v and %v (no scale to zero: a replica takes minutes to load)" $v.autoscaling.minReplicas $v.autoscaling.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- if and $v.monitoring.podMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor")) -}}
{{- fail "monitoring.podMonitor.enabled=true, but the cluster has no monitoring.coreos.com/v1 PodMonitor: install the Prometheus Operator, or set monitoring.podMonitor.enabled=false (with helm template: --api-versions monitoring.coreos.com/v1/PodMonitor)" -}}
{{- end -}}
{{- end -}}

{{/* Why the route cannot work in this cluster, or nothing. Takes root and what the cluster holds (lookup:
empty under helm template): crd (the HTTPRoute CRD), gateway (the parent Gateway), namespace (this
release's Namespace object), routes (every HTTPRoute, as a list's "items"). Gateway API facts:
tests/data/k8s/gateway-api_v1.2.0.json. */}}
{{- /* What toolkit.routeProblem checks the route against, read from the cluster (JSON): cluster-wide
reads (routing.httpRoute.clusterChecks turns them off where the installer may not make them). */ -}}
{{- define "toolkit.routeCluster" -}}
{{- $gateway := .Values.routing.gateway -}}
{{- toJson (dict "crd" (lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "httproutes.gateway.networking.k8s.io") "gateway" (lookup "gateway.networking.k8s.io/v1" "Gateway" ($gateway.namespace | default .Release.Namespace) $gateway.name) "namespace" (lookup "v1" "Namespace" "" .Release.Namespace) "routes" (lookup "gateway.networking.k8s.io/v1" "HTTPRoute" "" "")) -}}
{{- end -}}

{{- define "toolkit.routeProblem" -}}
{{- $v := .root.Values -}}
{{- $ns := .root.Release.Namespace -}}
{{- $gateway := $v.routing.gateway -}}
{{- $gatewayNs := $gateway.namespace | default $ns -}}
{{- $annotations := dig "metadata" "annotations" dict (.crd | default dict) -}}
{{- $bundle := get $annotations "gateway.networking.k8s.io/bundle-version" | default "" -}}
{{- $channel := get $annotations "gateway.networking.k8s.io/channel" | default "standard" -}}
{{- if and $bundle (eq $channel "standard") (semverCompare "<1.2.0" $bundle) -}}
routing.httpRoute sets rules[].timeouts, which the Gateway API's standard CRDs carry from v1.2.0 on; this cluster has {{ $bundle }}: {{ if $v.routing.gke.enabled }}GKE manages these CRDs (they cannot be replaced): upgrade the cluster to GKE 1.32.2-gke.1475000 or newer, which brings v1.2.0{{ else }}install Gateway API v1.2.0 or newer (its standard-install.yaml){{ end }}, or set routing.httpRoute.enabled=false
{{- else if and .gateway (ne $gatewayNs $ns) -}}
{{- $admitted := false -}}
{{- range (dig "spec" "listeners" list .gateway) -}}
{{- if or (not $gateway.sectionName) (eq .name $gateway.sectionName) -}}
{{- $from := dig "allowedRoutes" "namespaces" "from" "Same" . -}}
{{- if eq $from "All" -}}
{{- $admitted = true -}}
{{- else if eq $from "Selector" -}}
{{- $want := dig "allowedRoutes" "namespaces" "selector" "matchLabels" dict . -}}
{{- $have := dig "metadata" "labels" dict ($.namespace | default dict) -}}
{{- $matched := true -}}
{{- range $key, $value := $want -}}
{{- if ne (get $have $key | default "") $value -}}
{{- $matched = false -}}
{{- end -}}
{{- end -}}
{{- range (dig "allowedRoutes" "namespaces" "selector" "matchExpressions" list .) -}}
{{- $present := hasKey $have .key -}}
{{- $listed := and $present (has (get $have .key) (.values | default list)) -}}
{{- if or (and (eq .operator "In") (not $listed)) (and (eq .operator "NotIn") $listed) (and (eq .operator "Exists") (not $present)) (and (eq .operator "DoesNotExist") $present) -}}
{{- $matched = false -}}
{{- end -}}
{{- end -}}
{{- if $matched -}}
{{- $admitted = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $admitted -}}
the Gateway {{ $gatewayNs }}/{{ $gateway.name }} admits no route from namespace {{ $ns }} (its listeners' allowedRoutes.namespaces.from defaults to Same): set from: All, or from: Selector matching this namespace, on its listener{{ if $gateway.sectionName }} {{ $gateway.sectionName }}{{ end }}, or deploy into {{ $gatewayNs }}
{{- end -}}
{{- end -}}
{{- $mine := dict "hostnames" ($v.routing.httpRoute.hostnames | default list) "headers" ($v.routing.httpRoute.headers | default list) -}}
{{- range (dig "items" list (.routes | default dict)) -}}
{{- $route := . -}}
{{- $other := printf "%s/%s" (dig "metadata" "namespace" "" .) (dig "metadata" "name" "" .) -}}
{{- if ne $other (printf "%s/%s" $ns (include "toolkit.fullname" $.root)) -}}
{{- $sameParent := false -}}
{{- range (dig "spec" "parentRefs" list .) -}}
{{- $parentNs := .namespace | default (dig "metadata" "namespace" "" $route) -}}
{{- if and (eq .name $gateway.name) (eq $parentNs $gatewayNs) (or (not .sectionName) (not $gateway.sectionName) (eq .sectionName $gateway.sectionName)) -}}
{{- $sameParent = true -}}
{{- end -}}
{{- end -}}
{{- $theirHosts := dig "spec" "hostnames" list . -}}
{{- $hostsOverlap := and (not $mine.hostnames) (not $theirHosts) -}}
{{- range $mine.hostnames -}}
{{- if has . $theirHosts -}}
{{- $hostsOverlap = true -}}
{{- end -}}
{{- end -}}
{{- if and $sameParent $hostsOverlap -}}
{{- range (dig "spec" "rules" list .) -}}
{{- range (.matches | default (list dict)) -}}
{{- $path := dig "path" "value" "/" . -}}
{{- $type := dig "path" "type" "PathPrefix" . -}}
{{- /* Gateway API precedence: an exact path, then the longest prefix, wins; an equal match goes to the
oldest route. So a match on /v1, or on a path under it, takes this release's requests (all, or those
under it); a shorter prefix (/, a catch-all) does not. */ -}}
{{- $takes := or (hasPrefix "/v1/" $path) (and (eq $type "PathPrefix") (eq (trimSuffix "/" $path) "/v1")) -}}
{{- $headers := list -}}
{{- range (.headers | default list) -}}
{{- $headers = append $headers (dict "name" .name "value" .value) -}}
{{- end -}}
{{- if and $takes (eq (toJson $headers) (toJson $mine.headers)) -}}
{{- printf "the HTTPRoute %s on the Gateway %s/%s already matches %s %s requests with these hostnames and headers, which the Gateway API gives to it (the same match goes to the older route, a longer path to the longer): give this release routing.httpRoute.hostnames or routing.httpRoute.headers of its own (toolkit deploy --route-hostname / --route-header)" $other $gatewayNs $gateway.name $type $path -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* KEDA's ScaledObject CRD as the cluster holds it (JSON; empty under helm template, or where it is
missing): a cluster-scoped read, which autoscaling.clusterChecks turns off. */}}
{{- define "toolkit.kedaCrd" -}}
{{- toJson (lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "scaledobjects.keda.sh") -}}
{{- end -}}

{{/* Why this KEDA cannot keep the ScaledObject's fallback, or nothing. Takes crd (the ScaledObject
CRD, or empty). fallback.behavior came in KEDA 2.17 (keda-docs content/docs/2.17/reference/
scaledobject-spec.md; 2.16's has none): an older CRD has no such property, so the API server prunes it
and a Prometheus outage scales the release down to fallback.replicas, the floor. */}}
{{- define "toolkit.kedaProblem" -}}
{{- $versions := dig "spec" "versions" list (.crd | default dict) -}}
{{- if $versions -}}
{{- $kept := false -}}
{{- range $versions -}}
{{- $fallback := dig "schema" "openAPIV3Schema" "properties" "spec" "properties" "fallback" "properties" dict . -}}
{{- if hasKey $fallback "behavior" -}}
{{- $kept = true -}}
{{- end -}}
{{- end -}}
{{- if not $kept -}}
{{- $version := dig "metadata" "labels" "app.kubernetes.io/version" "" .crd -}}
this cluster's KEDA{{ if $version }} ({{ $version }}){{ end }} is older than 2.17: its ScaledObject has no fallback.behavior, which the API server would drop, so while Prometheus failed the release would scale down to autoscaling.minReplicas instead of keeping its replicas: upgrade KEDA to 2.17 or newer, or set autoscaling.clusterChecks=false to install with that fallback
{{- end -}}
{{- end -}}
{{- end -}}
