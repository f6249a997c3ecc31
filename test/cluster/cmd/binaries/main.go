// Command binaries builds the cluster test's Kubernetes binaries and etcd
// into their cache (~/.cache/salesagg/k8s/<version>), or with -check only
// reports whether the cache holds them (exit 0) or not (exit 1).
//
//	cd test/cluster && go run ./cmd/binaries [-check]
package main

import (
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/salesagg/salesagg/test/cluster"
)

func main() {
	check := flag.Bool("check", false, "only report whether the cache holds the binaries")
	flag.Parse()
	if *check {
		dir, ok, err := cluster.Cached()
		if err != nil {
			log.Fatal(err)
		}
		if !ok {
			fmt.Printf("Kubernetes %s binaries not cached in %s\n", cluster.KubernetesVersion, dir)
			os.Exit(1)
		}
		fmt.Printf("Kubernetes %s binaries cached in %s\n", cluster.KubernetesVersion, dir)
		return
	}
	dir, err := cluster.Binaries(log.Printf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dir)
}
