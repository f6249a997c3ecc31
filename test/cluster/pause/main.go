// Command pause is the pod sandbox's process: it holds the pod's namespaces
// open and does nothing else until SIGINT or SIGTERM (exit 0), reaping the
// zombies a pod sharing its process namespace leaves. A static binary, the
// one file of the sandbox image the cluster test builds (no registry).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
