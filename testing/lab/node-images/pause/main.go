// The lab's pod sandbox process: it holds the pod's namespaces, reaps what the pod's containers
// orphan, and exits on SIGTERM or SIGINT, as registry.k8s.io/pause does. Built by
// scripts/build-node.sh; nothing can be pulled on the machines the lab runs on.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
