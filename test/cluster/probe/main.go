// Command probe is what the cluster test runs inside a pod to look at the
// pod network from there (a static binary, the one file of its image; no
// shell, no registry):
//
//	probe                      wait for SIGTERM (the pod's process)
//	probe resolve NAME...      print "NAME IP[,IP...]" per name, from the pod's resolver
//	probe get URL...           print "URL STATUS BODY" per URL (body on one line), 5 s each
//
// Exit 1 when a lookup or a request failed (after printing every answer).
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		<-sigs
		return
	}
	failed := false
	switch os.Args[1] {
	case "resolve":
		for _, name := range os.Args[2:] {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ips, err := net.DefaultResolver.LookupHost(ctx, name)
			cancel()
			if err != nil {
				fmt.Printf("%s error %v\n", name, err)
				failed = true
				continue
			}
			fmt.Printf("%s %s\n", name, strings.Join(ips, ","))
		}
	case "get":
		c := &http.Client{Timeout: 5 * time.Second}
		for _, url := range os.Args[2:] {
			resp, err := c.Get(url)
			if err != nil {
				fmt.Printf("%s error %v\n", url, err)
				failed = true
				continue
			}
			body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			resp.Body.Close()
			if err != nil {
				fmt.Printf("%s error %v\n", url, err)
				failed = true
				continue
			}
			fmt.Printf("%s %d %s\n", url, resp.StatusCode, strings.Join(strings.Fields(string(body)), " "))
		}
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q (resolve, get)\n", os.Args[1])
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
