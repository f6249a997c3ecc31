// Command coredns is CoreDNS built from github.com/coredns/coredns with the
// plugins a cluster's DNS uses and no others (CoreDNS's documented way to
// choose plugins at compile time: set dnsserver.Directives, import the
// plugins, call coremain.Run), so that the build pulls in no cloud
// provider's SDK.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the plugins in the order of CoreDNS's plugin.cfg: the
// order a query passes them in.
var directives = []string{
	"reload",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
