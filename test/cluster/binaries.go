package cluster

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// KubernetesVersion is the k8s.io/kubernetes release built (build/go.mod
// requires it, with its staging modules replaced by their v0 releases).
const KubernetesVersion = "v1.37.2"

// Commands are the binaries the cluster runs: the control plane, the
// kubelet, kube-proxy and kubectl from k8s.io/kubernetes, etcd
// (build/etcd, the etcd server of go.etcd.io/etcd/server/v3), CoreDNS
// (build/coredns), the CNI reference plugins the pod network uses and
// kube-router, the NetworkPolicy agent (module build/kube-router).
var Commands = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl",
	"coredns", "bridge", "host-local", "loopback", "portmap", "kube-router"}

// KubeRouterVersion is the kube-router release build/kube-router requires.
const KubeRouterVersion = "v2.1.0"

// moduleOf is the module (a dir under build) of the Commands not built in
// the build module itself.
var moduleOf = map[string]string{"kube-router": "kube-router"}

// CNIPlugins are the Commands that are CNI plugins: containerd's CRI
// finds them in the cache dir (its cni bin_dir).
var CNIPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

var packages = map[string]string{
	"etcd":                    "./etcd",
	"kube-apiserver":          "k8s.io/kubernetes/cmd/kube-apiserver",
	"kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
	"kube-scheduler":          "k8s.io/kubernetes/cmd/kube-scheduler",
	"kubelet":                 "k8s.io/kubernetes/cmd/kubelet",
	"kube-proxy":              "k8s.io/kubernetes/cmd/kube-proxy",
	"kubectl":                 "k8s.io/kubernetes/cmd/kubectl",
	"coredns":                 "./coredns",
	"bridge":                  "github.com/containernetworking/plugins/plugins/main/bridge",
	"host-local":              "github.com/containernetworking/plugins/plugins/ipam/host-local",
	"loopback":                "github.com/containernetworking/plugins/plugins/main/loopback",
	"portmap":                 "github.com/containernetworking/plugins/plugins/meta/portmap",
	"kube-router":             "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
}

// CacheDir is where the binaries are kept between runs:
// $SALESAGG_K8S_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/k8s/<version>.
func CacheDir() (string, error) {
	if d := os.Getenv("SALESAGG_K8S_CACHE"); d != "" {
		return d, nil
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "salesagg", "k8s", KubernetesVersion), nil
}

// buildDir is the module that builds the commands: test/cluster/build,
// next to this file's package.
func buildDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/salesagg/salesagg/test/cluster\n")) {
			return filepath.Join(d, "build"), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no test/cluster module above %s", wd)
		}
	}
}

func ldflags() string {
	v := "k8s.io/component-base/version"
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=1 -X %[1]s.gitMinor=%[3]s -X %[1]s.gitTreeState=clean",
		v, KubernetesVersion, strings.Split(KubernetesVersion, ".")[1]) +
		" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=" + KubeRouterVersion
}

// stamp identifies a build: the build module's go.mod, go.sum and sources,
// the Go toolchain, the platform and the link flags. The cache holds the
// binaries of one stamp (file .stamp, written last).
func stamp(dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s %s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, ldflags())
	if v, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		fmt.Fprintf(h, "go %s", v)
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:16], err
}

// Cached returns the cache dir and whether it holds the binaries of the
// current build module and toolchain.
func Cached() (string, bool, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", false, err
	}
	dir, err := buildDir()
	if err != nil {
		return "", false, err
	}
	want, err := stamp(dir)
	if err != nil {
		return "", false, err
	}
	got, _ := os.ReadFile(filepath.Join(cache, ".stamp"))
	if strings.TrimSpace(string(got)) != want {
		return cache, false, nil
	}
	for _, c := range Commands {
		if _, err := os.Stat(filepath.Join(cache, c)); err != nil {
			return cache, false, nil
		}
	}
	return cache, true, nil
}

// Binaries returns the directory holding the commands, building them into
// the cache first when it lacks them (go build at nice 19, -trimpath,
// CGO_ENABLED=0; 12.5 minutes and 900 CPU-seconds cold on a fresh 2-core
// machine, the link alone when go's build cache has the packages). logf reports
// progress. Two runs on one machine build once (a lock on the cache dir).
func Binaries(logf func(string, ...any)) (string, error) {
	cache, ok, err := Cached()
	if err != nil || ok {
		return cache, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, ok, err := Cached(); err != nil || ok {
		return cache, err
	}
	dir, err := buildDir()
	if err != nil {
		return "", err
	}
	st, err := stamp(dir)
	if err != nil {
		return "", err
	}
	_ = os.Remove(filepath.Join(cache, ".stamp"))
	tmp := filepath.Join(cache, ".build")
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	start := time.Now()
	byModule := map[string][]string{}
	var order []string
	for _, c := range Commands {
		m := moduleOf[c]
		if _, ok := byModule[m]; !ok {
			order = append(order, m)
		}
		byModule[m] = append(byModule[m], packages[c])
	}
	for _, m := range order {
		args := append([]string{"build", "-trimpath", "-ldflags", ldflags(), "-o", tmp + "/"}, byModule[m]...)
		name := "go"
		if nice, err := exec.LookPath("nice"); err == nil {
			name, args = nice, append([]string{"-n", "19", "go"}, args...)
		}
		logf("building %s into %s (in %s: %s %s)", strings.Join(byModule[m], " "), cache, filepath.Join("build", m), name, strings.Join(args, " "))
		cmd := exec.Command(name, args...)
		cmd.Dir = filepath.Join(dir, m)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly -trimpath -buildvcs=false")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("building the cluster's binaries (%s): %w\n%s", time.Since(start).Round(time.Second), err, out)
		}
	}
	for _, c := range Commands {
		if err := os.Rename(filepath.Join(tmp, c), filepath.Join(cache, c)); err != nil {
			return "", err
		}
	}
	_ = os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(cache, ".stamp"), []byte(st+"\n"), 0o644); err != nil {
		return "", err
	}
	logf("built the cluster's binaries in %s", time.Since(start).Round(time.Second))
	if _, ok, err := Cached(); err != nil || !ok {
		return "", errors.Join(err, errors.New("the cache does not match its stamp after the build"))
	}
	return cache, nil
}
