# Sourced by the scripts that build Go tools: how they reach the Go module proxy.
#
# The go command does not retry a failed fetch, and on a busy machine a fetch from the proxy can
# fail on its own (seen: "net/http: TLS handshake timeout" while two lab builds and the control
# plane's build shared two cores, which failed a whole CI run). In GOPROXY, a proxy followed by
# `|` is tried again after any error (a `,` falls through only on "not found"), so the first proxy
# configured is listed three times: each module and checksum fetch gets three attempts.
first_proxy=$(go env GOPROXY)
first_proxy=${first_proxy%%[,|]*}
case "$first_proxy" in
  off | direct | "") ;;
  *) export GOPROXY="$first_proxy|$first_proxy|$first_proxy" ;;
esac
unset first_proxy

# The compiler collects garbage less often: about 6% less CPU for the control plane's build from
# an empty cache (559 CPU-seconds instead of 597), at about the same peak memory; every Go build
# from an empty cache sits on a fresh CI run's path.
export GOGC=400
