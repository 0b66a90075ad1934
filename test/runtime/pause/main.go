// Command pause is the first process of a CRI pod sandbox in the runtime
// tests: it keeps the pod's namespaces alive, reaps the orphans it inherits
// as PID 1, and exits 0 on SIGINT or SIGTERM, like registry.k8s.io/pause.
// scripts/runtime/pause-image.sh builds it statically into the OCI image
// the tests import, because no registry is reachable from the test machines.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapChildren()
	}
}

// reapChildren collects every exited child without blocking.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
