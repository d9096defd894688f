# A real lab node's boot, run by the lab in the node's network namespace and a mount namespace of
# its own (a slave of the host's: nothing mounted here reaches the host). Everything it starts
# stays in the node's cgroup, which is what the lab's power switch kills. Fails closed: a node
# whose cgroup or mounts cannot be made does not boot, rather than write to the host's
# directories. The lab passes every path in the environment (see real_node/mod.rs).
set -eu
fail() { echo "nodemedic lab: node $NODE cannot boot: $*" >&2; exit 125; }

# The node's cgroup, in every hierarchy (cpuset needs its CPUs and memory nodes copied down).
# Under the lab's lock: nodes booting side by side share the levels above their own, and a task
# joining a cpuset while another boot writes its parent's CPUs fails.
exec 9>"$CGROUP_LOCK"
flock 9 || fail "cannot take the lab's cgroup lock $CGROUP_LOCK"
# Above the node's own level (every lab's, this lab's), the CPU weight of eight busy threads
# instead of one: under cgroup v1 each level competes with the host's threads one for one, so at
# the default weight every real node of the machine together got one thread's share, and an image
# import or a watchdog feed waited behind a CI run's dozens of runnable threads. A node is a
# machine of its own; this keeps it from starving, not from sharing.
NODES_CPU_SHARES=8192
for root in /sys/fs/cgroup/*; do
  [ -e "$root/cgroup.procs" ] || continue
  dir=$root
  for part in $(echo "$CGROUP" | tr / ' '); do
    parent=$dir dir=$dir/$part
    [ -d "$dir" ] || mkdir "$dir" || fail "cannot create cgroup $dir"
    if [ -e "$dir/cpuset.cpus" ] && [ -z "$(cat "$dir/cpuset.cpus")" ]; then
      cat "$parent/cpuset.cpus" >"$dir/cpuset.cpus" && cat "$parent/cpuset.mems" >"$dir/cpuset.mems" ||
        fail "cannot set up cpuset $dir"
    fi
    if [ -e "$dir/cpu.shares" ] && [ "$part" != "$NODE" ]; then
      echo "$NODES_CPU_SHARES" >"$dir/cpu.shares" || fail "cannot set the CPU weight of $dir"
    fi
  done
  echo $$ >"$dir/cgroup.procs" || fail "cannot join cgroup $dir"
  # The node's own processes (containerd, the kubelet, kube-proxy) in a cgroup beside the pods',
  # as systemd's system.slice beside kubepods on a real machine: the pods (2048, the kubelet's
  # weight for two CPUs) keep two thirds of the node's CPU against them (1024). At the node's
  # own level each busy thread of theirs (a boot's image imports) weighed as much as 1024
  # against all the pods together, the agent's among them.
  if [ -e "$dir/cpu.shares" ]; then
    mkdir -p "$dir/system" && echo $$ >"$dir/system/cgroup.procs" || fail "cannot join cgroup $dir/system"
  fi
done
exec 9>&-

# The machine's devices: a /dev of the node's own, with the host's harmless character devices and
# the lab's emulated watchdog device at /dev/watchdog. containerd gives a privileged container
# (the agent) every device of its /dev: this one's, never the host's disks or a host watchdog.
dev=$NODE_DIR/dev
mkdir -p "$dev" && mount -t tmpfs -o mode=0755,size=1m,nosuid tmpfs "$dev" || fail "cannot mount a tmpfs for its /dev"
for device in null zero full random urandom tty kmsg; do
  [ -e "/dev/$device" ] || continue
  cp -a "/dev/$device" "$dev/" || fail "cannot copy /dev/$device into its /dev"
done
mkdir "$dev/pts" "$dev/shm" "$dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$dev/pts" || fail "cannot mount its /dev/pts"
ln -s pts/ptmx "$dev/ptmx"
# The host's /dev/shm, where the lab keeps its logs (each pod gets a shm of its own).
mount --rbind /dev/shm "$dev/shm" || fail "cannot bind /dev/shm into its /dev"
ln -s /proc/self/fd "$dev/fd"
ln -s /proc/self/fd/0 "$dev/stdin"
ln -s /proc/self/fd/1 "$dev/stdout"
ln -s /proc/self/fd/2 "$dev/stderr"
touch "$dev/watchdog" && mount --bind "$WATCHDOG_DEVICE" "$dev/watchdog" ||
  fail "cannot bind the lab's watchdog device $WATCHDOG_DEVICE over its /dev/watchdog"
mount --move "$dev" /dev || fail "cannot move its /dev over the machine's"

# A machine's own directories where the kubelet, containerd and the CNI plugins hard-code paths,
# and the hostPaths the pods use: bound over the host's, one set per node.
bind() {
  mkdir -p "$1" "$2" || fail "cannot create $1 or $2"
  mount --bind "$1" "$2" || fail "cannot bind $1 over $2"
}
mount -t tmpfs -o mode=0755 tmpfs /run/containerd 2>/dev/null ||
  { mkdir -p /run/containerd && mount -t tmpfs -o mode=0755 tmpfs /run/containerd; } ||
  fail "cannot mount a tmpfs on /run/containerd"
for pair in $BINDS; do
  bind "${pair%%=*}" "${pair#*=}"
done
# The kernel's tunables are the machine's, shared by every node: the kubelet checks them
# (protectKernelDefaults) against files of the values it expects, never the host's.
for pair in $SYSCTLS; do
  [ -e "/proc/sys/${pair#*=}" ] || continue
  mount --bind "${pair%%=*}" "/proc/sys/${pair#*=}" || fail "cannot bind ${pair%%=*} over /proc/sys/${pair#*=}"
done

export PATH="$NODE_BIN:$PATH"
containerd --config "$CONTAINERD_CONFIG" >>"$LOGS/${NODE}_containerd.log" 2>&1 &
containerd=$!
# The tmpfs is new: a socket there is this boot's.
until ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; do
  kill -0 "$containerd" 2>/dev/null || fail "containerd exited (see ${NODE}_containerd.log)"
  sleep 0.05
done
# Nothing can be pulled: the images come from the lab's archives, imported once per node (and
# again when an archive changes), each marked by a stamp the lab waits for.
import() {
  for archive in "$@"; do
    stamp="$NODE_DIR/imported/$(basename "$archive").$(stat -c %s-%Y "$archive")"
    [ -e "$stamp" ] && continue
    ctr --address /run/containerd/containerd.sock -n k8s.io images import "$archive" >/dev/null ||
      { echo "nodemedic lab: node $NODE cannot import $archive" >&2; return 1; }
    mkdir -p "$NODE_DIR/imported" && touch "$stamp"
  done
}
# The sandbox's and the writer's (small) before the kubelet; the others (nodemedic's, large)
# while it registers, so a busy machine's imports do not hold the node back from Ready.
# shellcheck disable=SC2086 # one path per word
import $BOOT_IMAGES || fail "cannot import the lab's images"
# shellcheck disable=SC2086
import $IMAGES &

# Supervised as a machine's init would: each restarts when it exits. kube-network-policies only
# when the lab enforces NetworkPolicies (LabConfig::network_policies).
if [ -n "${NETWORK_POLICIES:-}" ]; then
  (while :; do
    # shellcheck disable=SC2086 # one argument per word
    "$NETWORK_POLICIES" $NETWORK_POLICIES_ARGS >>"$LOGS/${NODE}_network-policies.log" 2>&1 || true
    sleep 1
  done) &
fi
(while :; do
  kube-proxy --config "$KUBE_PROXY_CONFIG" >>"$LOGS/${NODE}_kube-proxy.log" 2>&1 || true
  sleep 1
done) &
while :; do
  kubelet $KUBELET_ARGS >>"$LOGS/${NODE}_kubelet.log" 2>&1 || true
  echo "kubelet exited; starting it again" >&2
  sleep 1
done
